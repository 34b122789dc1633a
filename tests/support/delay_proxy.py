"""A userspace TCP forwarder that adds a fixed one-way delay: ``python -m tests.support.delay_proxy``.

Kernel ``netem`` is not available here (DESIGN.md "Measuring"), so ``python -m bench ring`` puts one of
these in front of each agent's listening port. Every chunk read from one side is written to the
other side ``delay`` seconds after it arrived, in both directions, in order. Reading never waits for
writing: each direction has a release-time queue, and one writer task per direction sleeps until
the head of the queue is due, so many chunks can be in flight at once (a real link's
bandwidth-delay product) instead of one delay per chunk in series. TLS passes through untouched:
the proxy never looks at the bytes, and fleet certificates are not bound to ports.

The delay can be changed while connections are open (:attr:`DelayProxy.delay`); a chunk keeps the
release time it got on arrival, and order is kept even when the delay shrinks.

Command line (one process can hold several forwarders)::

    python -m tests.support.delay_proxy [--delay-ms L]

then, one command per line on stdin, each answered by one line on stdout:

    add HOST:PORT       ->  listen 127.0.0.1:PORT   (a new forwarder to HOST:PORT)
    delay MS            ->  ok delay MS              (every forwarder, from now on)
    stats               ->  stats {json}             (connections and bytes per forwarder)
    quit / end of input ->  the process ends
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import socket
import sys
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from agent.transport.tasks import OwnedTasks

log = logging.getLogger(__name__)

READ_CHUNK = 256 * 1024
MAX_QUEUED = 64 * 1024 * 1024
"""Bytes held in one direction before reading from that side pauses (flow control)."""


@dataclass
class _Counters:
    connections: int = 0
    bytes_up: int = 0
    """Client -> target."""
    bytes_down: int = 0
    """Target -> client."""


@dataclass
class _Direction:
    """One direction of one connection: chunks waiting for their release time."""

    queue: collections.deque[tuple[float, bytes | None]] = field(default_factory=collections.deque)
    queued_bytes: int = 0
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    room: asyncio.Event = field(default_factory=asyncio.Event)


class DelayProxy:
    """Forwards connections accepted on ``listen`` to ``target``, ``delay`` seconds late each way."""

    def __init__(self, target: tuple[str, int], delay: float = 0.0, listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        if delay < 0:
            raise ValueError(f"delay must be >= 0, got {delay}")
        self.target = target
        self.delay = delay
        self._listen = listen
        self._server: asyncio.Server | None = None
        self._tasks = OwnedTasks()
        self.counters = _Counters()

    @property
    def address(self) -> tuple[str, int]:
        if self._server is None:
            raise RuntimeError("start() first")
        host, port = self._server.sockets[0].getsockname()[:2]
        return host, port

    async def start(self) -> tuple[str, int]:
        self._server = await asyncio.start_server(self._accept, *self._listen)
        return self.address

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._tasks.cancel_all()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def __aenter__(self) -> DelayProxy:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> asyncio.Task[Any]:
        return self._tasks.spawn(coro)

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        _nodelay(client_writer)
        try:
            target_reader, target_writer = await asyncio.open_connection(*self.target)
        except OSError as exc:
            log.warning("delay proxy: cannot reach %s:%d: %s", *self.target, exc)
            client_writer.transport.abort()
            return
        _nodelay(target_writer)
        self.counters.connections += 1
        up, down = _Direction(), _Direction()
        readers = [
            self._spawn(self._read(client_reader, up, "bytes_up")),
            self._spawn(self._read(target_reader, down, "bytes_down")),
        ]
        writers = {self._spawn(self._write(up, target_writer)), self._spawn(self._write(down, client_writer))}
        try:
            # both directions end cleanly (each passed its end of stream on), or one breaks: then all of it goes
            pending = writers
            while pending:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                if not all(task.result() for task in done):
                    break
        finally:
            for task in [*readers, *writers]:
                task.cancel()
            for writer in (client_writer, target_writer):
                writer.transport.abort()

    async def _read(self, reader: asyncio.StreamReader, direction: _Direction, counter: str) -> None:
        """Queue every chunk with its release time; ``None`` marks the end of the stream (or a reset)."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                while direction.queued_bytes >= MAX_QUEUED:
                    direction.room.clear()
                    await direction.room.wait()
                data = await reader.read(READ_CHUNK)
                release = loop.time() + self.delay
                direction.queue.append((release, data or None))
                direction.wakeup.set()
                if not data:
                    return
                direction.queued_bytes += len(data)
                setattr(self.counters, counter, getattr(self.counters, counter) + len(data))
        except (ConnectionError, OSError):
            direction.queue.append((loop.time() + self.delay, None))
            direction.wakeup.set()

    async def _write(self, direction: _Direction, writer: asyncio.StreamWriter) -> bool:
        """Write the queued chunks at their release times, in arrival order; False if the peer broke."""
        loop = asyncio.get_running_loop()
        while True:
            while not direction.queue:
                direction.wakeup.clear()
                await direction.wakeup.wait()
            release, data = direction.queue[0]
            wait = release - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            direction.queue.popleft()
            if data is None:
                # the other side ended (or broke): pass the end on, at the time it would arrive
                try:
                    if writer.can_write_eof():
                        writer.write_eof()
                except (OSError, RuntimeError):
                    return False
                return True
            direction.queued_bytes -= len(data)
            direction.room.set()
            try:
                writer.write(data)
                await writer.drain()
            except (ConnectionError, OSError):
                return False


def _nodelay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def parse_hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


async def serve_commands(delay_ms: float) -> int:
    """The command-line process: forwarders added and re-timed through stdin (see the module docstring)."""
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    proxies: list[DelayProxy] = []
    delay = delay_ms / 1e3

    def reply(text: str) -> None:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    reply(f"ready delay {delay_ms:g}")
    try:
        while True:
            line = (await reader.readline()).decode().strip()
            if not line or line == "quit":
                return 0
            command, _, argument = line.partition(" ")
            try:
                if command == "add":
                    proxy = DelayProxy(parse_hostport(argument), delay)
                    host, port = await proxy.start()
                    proxies.append(proxy)
                    reply(f"listen {host}:{port}")
                elif command == "delay":
                    delay = float(argument) / 1e3
                    if delay < 0:
                        raise ValueError("the delay must be >= 0")
                    for proxy in proxies:
                        proxy.delay = delay
                    reply(f"ok delay {float(argument):g}")
                elif command == "stats":
                    reply(
                        "stats "
                        + json.dumps([{"target": f"{p.target[0]}:{p.target[1]}", **vars(p.counters)} for p in proxies])
                    )
                else:
                    reply(f"error unknown command {command!r}")
            except (ValueError, OSError) as exc:
                reply(f"error {exc}")
    finally:
        for proxy in proxies:
            await proxy.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.support.delay_proxy", description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay per direction (default 0)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    return asyncio.run(serve_commands(args.delay_ms))


if __name__ == "__main__":
    sys.exit(main())
