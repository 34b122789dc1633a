"""An in-memory ``Network`` (``agent.transport.network``): the ring's code over byte pipes, without sockets.

Each connection is two ``asyncio.StreamReader`` s fed by the other end's writer, so frames go through the
real codec and ``FrameConnection`` exactly as over TLS. What a real network does to a peer that vanishes
is kept: :meth:`MemoryHost.vanish` drops every connection of one host at once, and both ends then see
their stream end without a goodbye, as after a crash or a pulled cable.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable
from typing import Any

from agent.errors import PeerUnavailableError
from agent.transport.connection import READ_CHUNK, FrameConnection
from agent.wire.codec import DEFAULT_MAX_PAYLOAD

Accept = Callable[[FrameConnection], Awaitable[None]]


class _Inbox:
    """One direction of a pipe: the reader at its end, fed by the writer at the other end."""

    def __init__(self) -> None:
        self.reader = asyncio.StreamReader(limit=READ_CHUNK)
        self.ended = False
        self._held: list[bytes] | None = None
        self._ending = False

    def feed(self, data: bytes) -> None:
        if self._held is not None:
            self._held.append(data)
        elif not self.ended:
            self.reader.feed_data(data)

    def end(self, at_once: bool = False) -> None:
        """The stream ends for this reader: after what is held, or ``at_once`` (its own end dropped it)."""
        if self._held is not None and not at_once:
            self._ending = True  # after what is held (a frozen process closes nothing until it runs again)
        elif not self.ended:
            self.ended = True
            self.reader.feed_eof()

    def hold(self) -> None:
        """Keep what arrives from now on (a frozen process's kernel buffers it; nobody reads it)."""
        if self._held is None:
            self._held = []

    def release(self) -> None:
        """Deliver what was held, and what comes next."""
        held, self._held = self._held or [], None
        for data in held:
            self.feed(data)
        if self._ending:
            self.end()


class _Transport:
    def __init__(self, writer: _PipeWriter) -> None:
        self._writer = writer

    def abort(self) -> None:
        self._writer.abort()


class _PipeWriter:
    """The part of ``asyncio.StreamWriter`` that ``FrameConnection`` uses, writing into the peer's inbox."""

    def __init__(self, own: _Inbox, peer: _Inbox, peername: tuple[str, int]) -> None:
        self._own = own
        self._peer = peer
        self._peername = peername
        self._closing = False
        self.transport = _Transport(self)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._peername if name == "peername" else default

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._closing:
            self._peer.feed(bytes(data))

    def writelines(self, buffers: Any) -> None:
        for buffer in buffers:
            self.write(buffer)

    async def drain(self) -> None:
        if self._peer.ended:  # the other end is gone: as a reset connection
            raise ConnectionResetError("connection reset by peer")
        await asyncio.sleep(0)  # a real drain may yield: let the other end run

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        """An orderly close: the peer reads what was written, then the end of the stream."""
        self._closing = True
        self._peer.end()

    async def wait_closed(self) -> None:
        return None

    def abort(self) -> None:
        """Drop the connection: both ends' streams end, whatever was still to be read."""
        self._closing = True
        self._peer.end()
        self._own.end(at_once=True)


class _Pipe:
    """Both ends of one connection."""

    def __init__(self, client_at: tuple[str, int], server_at: tuple[str, int], max_payload: int, label: str) -> None:
        to_client, to_server = _Inbox(), _Inbox()
        self.inboxes = (to_client, to_server)
        self.server_at = server_at
        self.client_writer = _PipeWriter(to_client, to_server, server_at)
        self.server_writer = _PipeWriter(to_server, to_client, client_at)
        self.client = FrameConnection(to_client.reader, self.client_writer, max_payload=max_payload, label=label)  # type: ignore[arg-type]
        self.server = FrameConnection(
            to_server.reader,
            self.server_writer,  # type: ignore[arg-type]
            max_payload=max_payload,
            label=f"peer {client_at[0]}:{client_at[1]}",
        )


class MemoryListener:
    """A listening address of a :class:`MemoryNetwork`."""

    def __init__(self, network: MemoryNetwork, address: tuple[str, int], accept: Accept, max_payload: int) -> None:
        self._network = network
        self.address = address
        self.accept = accept
        self.max_payload = max_payload
        self.pipes: list[_Pipe] = []
        self.tasks: set[asyncio.Task[None]] = set()

    def close(self) -> None:
        if self._network._listeners.get(self.address) is self:  # not a successor's at the same address
            del self._network._listeners[self.address]


class MemoryNetwork:
    """Hosts on one event loop, reaching each other by address. Each agent gets its own :meth:`host`, which
    is the ``Network`` it is given; :meth:`MemoryHost.vanish` then takes that one PC off the network."""

    def __init__(self) -> None:
        self._listeners: dict[tuple[str, int], MemoryListener] = {}
        self._pipes: list[tuple[str, _Pipe]] = []
        self._gone: set[str] = set()
        self._frozen: set[str] = set()
        self._ports = itertools.count(20000)
        self.dials: list[tuple[str, tuple[str, int]]] = []
        """Every (host, address) dialled, in order: a test can see who reached whom."""

    def host(self, name: str) -> MemoryHost:
        """The network as the PC ``name`` (an address such as ``10.9.0.1``) sees it."""
        return MemoryHost(self, name)

    async def _listen(self, host: str, port: int, accept: Accept, max_payload: int) -> MemoryListener:
        self._gone.discard(host)  # the PC is back (a new agent on it)
        bound = (host, port or next(self._ports))
        if bound in self._listeners:
            raise OSError(f"address {bound[0]}:{bound[1]} already in use")
        listener = MemoryListener(self, bound, accept, max_payload)
        self._listeners[bound] = listener
        return listener

    async def _dial(self, host: str, address: tuple[str, int], label: str, max_payload: int) -> FrameConnection:
        self.dials.append((host, address))
        where = label or f"{address[0]}:{address[1]}"
        if host in self._gone:
            raise PeerUnavailableError(f"cannot reach {where}: network is unreachable")
        listener = self._listeners.get(address)
        if listener is None:
            raise PeerUnavailableError(f"cannot reach {where}: connection refused")
        pipe = _Pipe((host, next(self._ports)), address, max_payload, where)
        self._pipes.append((host, pipe))
        if {host, address[0]} & self._frozen:
            for inbox in pipe.inboxes:
                inbox.hold()
        task = asyncio.get_running_loop().create_task(listener.accept(pipe.server))
        listener.tasks.add(task)
        task.add_done_callback(listener.tasks.discard)
        await asyncio.sleep(0)
        return pipe.client

    def _pipes_of(self, host: str) -> list[_Pipe]:
        return [pipe for dialler, pipe in self._pipes if host in (dialler, pipe.server_at[0])]

    def _freeze(self, host: str, frozen: bool) -> None:
        self._frozen.discard(host)
        if frozen:
            self._frozen.add(host)
        for pipe in self._pipes_of(host):
            for inbox in pipe.inboxes:
                if frozen:
                    inbox.hold()
                else:
                    inbox.release()

    def _vanish(self, host: str) -> None:
        self._gone.add(host)
        for address in [a for a in self._listeners if a[0] == host]:
            del self._listeners[address]
        for dialler, pipe in self._pipes:
            if dialler == host:
                pipe.client_writer.abort()
            elif pipe.server_at[0] == host:
                pipe.server_writer.abort()


class MemoryHost:
    """One PC on a :class:`MemoryNetwork`: a ``Network`` (``agent.transport.network``) for its agent."""

    def __init__(self, network: MemoryNetwork, name: str) -> None:
        self.network = network
        self.name = name

    async def listen(
        self, address: tuple[str, int], accept: Accept, *, max_payload: int = DEFAULT_MAX_PAYLOAD
    ) -> MemoryListener:
        """Listen on this host (whatever host ``address`` names: a PC listens on its own addresses)."""
        return await self.network._listen(self.name, address[1], accept, max_payload)

    async def dial(
        self,
        address: tuple[str, int],
        *,
        label: str = "",
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        timeout: float = 5.0,
        check_dates: bool = True,
    ) -> FrameConnection:
        """Connect to a listener of another host (no certificates here: ``check_dates`` changes nothing)."""
        return await self.network._dial(self.name, address, label, max_payload)

    def freeze(self) -> None:
        """The PC's agent stops (``kill -STOP``): its connections stay up, but nothing it sends leaves and
        nothing sent to it is read, until :meth:`thaw`."""
        self.network._freeze(self.name, True)

    def thaw(self) -> None:
        """The frozen agent runs again: what was held is delivered, in order."""
        self.network._freeze(self.name, False)

    def vanish(self) -> None:
        """The PC goes away at once: it stops listening, and every connection from or to it drops with no
        goodbye (its agent may still run; it only sees its streams end)."""
        self.network._vanish(self.name)
