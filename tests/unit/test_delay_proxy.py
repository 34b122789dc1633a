"""The benchmark's userspace delay proxy: delay per direction, chunks in flight at once, order, EOF."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest

from tests.support.delay_proxy import DelayProxy, parse_hostport
from tests.support.stream_server import serving


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    writer.close()  # the client's end of stream is answered with ours


async def _read_exactly(reader: asyncio.StreamReader, n: int) -> bytes:
    return await asyncio.wait_for(reader.readexactly(n), 5.0)


def test_round_trip_gets_the_delay_once_per_direction() -> None:
    async def main() -> tuple[float, float]:
        async with serving(_echo) as port, DelayProxy(("127.0.0.1", port), delay=0.05) as proxy:
            reader, writer = await asyncio.open_connection(*proxy.address)
            times = []
            for _ in range(2):
                start = time.perf_counter()
                writer.write(b"ping")
                await writer.drain()
                assert await _read_exactly(reader, 4) == b"ping"
                times.append(time.perf_counter() - start)
            writer.close()
        return times[0], times[1]

    for rtt in asyncio.run(main()):
        assert 0.099 <= rtt < 0.16


def test_chunks_are_in_flight_together_and_keep_their_order() -> None:
    """Twenty chunks sent 5 ms apart through a 100 ms proxy: ~0.1 s + 0.2 s, not 20 x 0.2 s."""

    async def main() -> tuple[bytes, float]:
        async with serving(_echo) as port, DelayProxy(("127.0.0.1", port), delay=0.1) as proxy:
            reader, writer = await asyncio.open_connection(*proxy.address)
            start = time.perf_counter()
            sent = b""
            for i in range(20):
                chunk = bytes([65 + i]) * 1000
                writer.write(chunk)
                await writer.drain()
                sent += chunk
                await asyncio.sleep(0.005)
            received = await _read_exactly(reader, len(sent))
            elapsed = time.perf_counter() - start
            writer.close()
            assert received == sent
        return received, elapsed

    _, elapsed = asyncio.run(main())
    assert 0.29 <= elapsed < 0.6


def test_delay_changes_in_place_and_order_survives_a_shorter_delay() -> None:
    async def main() -> tuple[float, float, bytes]:
        async with serving(_echo) as port, DelayProxy(("127.0.0.1", port), delay=0.0) as proxy:
            reader, writer = await asyncio.open_connection(*proxy.address)
            start = time.perf_counter()
            writer.write(b"a")
            assert await _read_exactly(reader, 1) == b"a"
            fast = time.perf_counter() - start
            proxy.delay = 0.04
            start = time.perf_counter()
            writer.write(b"b")
            assert await _read_exactly(reader, 1) == b"b"
            slow = time.perf_counter() - start
            # a chunk sent under a long delay is not overtaken by one sent after the delay shrank
            proxy.delay = 0.1
            writer.write(b"c")
            await writer.drain()
            await asyncio.sleep(0.01)
            proxy.delay = 0.0
            writer.write(b"d")
            ordered = await _read_exactly(reader, 2)
            writer.close()
        return fast, slow, ordered

    fast, slow, ordered = asyncio.run(main())
    assert fast < 0.03
    assert 0.079 <= slow < 0.14
    assert ordered == b"cd"


def test_end_of_stream_passes_through_and_an_unreachable_target_drops_the_client() -> None:
    async def main() -> tuple[bytes, bytes]:
        async with serving(_echo) as port, DelayProxy(("127.0.0.1", port), delay=0.01) as proxy:
            reader, writer = await asyncio.open_connection(*proxy.address)
            writer.write(b"bye")
            writer.write_eof()
            echoed = await asyncio.wait_for(reader.read(), 5.0)  # until the server's end of stream
            writer.close()
        # nothing listens at the target any more: the proxy closes the client's connection
        async with DelayProxy(("127.0.0.1", port), delay=0.0) as dead:
            reader, writer = await asyncio.open_connection(*dead.address)
            try:
                rest = await asyncio.wait_for(reader.read(), 5.0)
            except ConnectionError:
                rest = b""
            writer.close()
        return echoed, rest

    echoed, rest = asyncio.run(main())
    assert echoed == b"bye"
    assert rest == b""


def test_negative_delay_and_bad_addresses_are_refused() -> None:
    with pytest.raises(ValueError):
        DelayProxy(("127.0.0.1", 1), delay=-0.001)
    assert parse_hostport("127.0.0.1:8080") == ("127.0.0.1", 8080)
    assert parse_hostport("[::1]:9") == ("::1", 9)
    with pytest.raises(ValueError):
        parse_hostport("8080")


def test_command_line_adds_forwarders_and_sets_the_delay() -> None:
    async def serve() -> asyncio.Server:
        return await asyncio.start_server(_echo, "127.0.0.1", 0)

    loop = asyncio.new_event_loop()
    try:
        server = loop.run_until_complete(serve())
        port = server.sockets[0].getsockname()[1]
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.delay_proxy", "--delay-ms", "5"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            encoding="utf-8",
            errors="replace",
        )
        assert proc.stdin is not None and proc.stdout is not None

        def ask(line: str) -> str:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(line + "\n")
            proc.stdin.flush()
            return proc.stdout.readline().strip()

        try:
            assert proc.stdout.readline().strip() == "ready delay 5"
            answer = ask(f"add 127.0.0.1:{port}")
            assert answer.startswith("listen 127.0.0.1:")
            listen = parse_hostport(answer.split()[1])
            assert ask("delay 20") == "ok delay 20"
            assert ask("delay -1").startswith("error")
            assert ask("frobnicate").startswith("error")

            async def through() -> float:
                reader, writer = await asyncio.open_connection(*listen)
                start = time.perf_counter()
                writer.write(b"x")
                assert await _read_exactly(reader, 1) == b"x"
                elapsed = time.perf_counter() - start
                writer.close()
                return elapsed

            assert 0.039 <= loop.run_until_complete(through()) < 0.2
            assert '"connections": 1' in ask("stats")
            proc.stdin.write("quit\n")
            proc.stdin.flush()
            assert proc.wait(timeout=10) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        server.close()
        # the echo handler ends with the connection of the proxy, which has quit
        loop.run_until_complete(asyncio.wait_for(asyncio.gather(*asyncio.all_tasks(loop)), 5.0))
    finally:
        loop.close()
