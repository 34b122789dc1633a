"""A TCP forwarder in front of an HTTP mirror that can drop out and come back, for tests of downloads.

``FlakyProxy(target)`` listens on a loopback port and forwards every connection to ``target`` (an olah mirror,
``tests/support/olah_mirror.py``). The test then makes the mirror fail as a real one does:

- ``cut_after(n)``: once ``n`` more bytes have gone from the mirror to the client, every open connection is cut
  in the middle of what it carries, and the proxy is down (as a mirror whose host dropped off the network);
- ``down()``: the same at once; while down, connections are refused (nothing listens on the port);
- ``up()``: listening again on the same port, as a mirror that came back.

``requests`` holds the head of every HTTP request that passed (request line and headers), so a test can see
whether a download resumed with a ``Range`` header. Plain threads and blocking sockets: the client under test
(huggingface_hub) blocks too, and the proxy works the same whether the test runs an event loop or not.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from types import TracebackType

CHUNK = 64 * 1024
_HEAD = re.compile(rb"(?:GET|HEAD|POST) [^\r\n]* HTTP/1\.[01]\r\n.*?\r\n\r\n", re.S)


class FlakyProxy:
    """Forwards ``127.0.0.1:port`` to ``target`` until told to fail; use ``with`` or start()/close()."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.port = 0
        self.requests: list[str] = []
        """The head of every request forwarded, in order (``GET /... HTTP/1.1`` and its headers)."""
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._budget: int | None = None
        """Bytes the mirror may still send before everything is cut (None: no limit)."""

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FlakyProxy:
        self.up()
        return self

    def close(self) -> None:
        self.down()

    def __enter__(self) -> FlakyProxy:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def up(self) -> None:
        """Listen (again, on the same port) and forward."""
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket()
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(("127.0.0.1", self.port))
            listener.listen(16)
            self.port = listener.getsockname()[1]
            self._listener = listener
            self._budget = None
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        """Cut every connection and stop listening: new connections are refused until ``up()``."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._open = self._open, set()
        for sock in [s for s in (listener,) if s is not None] + list(sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def cut_after(self, n: int) -> None:
        """Go ``down()`` once ``n`` more bytes have been forwarded from the mirror."""
        with self._lock:
            self._budget = n

    def ranges(self) -> list[str]:
        """The ``Range`` headers of the requests seen, in order."""
        return [m.group(1) for head in self.requests for m in [re.search(r"(?im)^range: *(\S+)", head)] if m]

    # -- the forwarding ------------------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return  # closed by down()
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._open |= {client, server}
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, upstream: bool) -> None:
        pending = b""
        try:
            while data := source.recv(CHUNK):
                if upstream:
                    pending += data
                    while match := _HEAD.search(pending):
                        self.requests.append(match.group(0).decode("latin-1"))
                        pending = pending[match.end() :]
                    sink.sendall(data)
                    continue
                allowed, cut = self._spend(data)
                sink.sendall(allowed)
                if cut:
                    self.down()
                    return
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def _spend(self, data: bytes) -> tuple[bytes, bool]:
        """What of ``data`` the budget lets through, and whether the budget is now spent (time to cut)."""
        with self._lock:
            budget = self._budget
            if budget is None:
                return data, False
            self._budget = budget - len(data)
        return data[: max(0, budget)], budget <= len(data)
