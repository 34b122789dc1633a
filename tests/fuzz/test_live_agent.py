"""A live agent under attack, stateful: a hypothesis state machine drives a real two-stage ring over real mutual TLS
on loopback (``StageServer`` s on toy numpy stages, ``TlsNetwork``, the ring client), while an intruder holding a
fleet certificate sends it what a broken or hostile peer would.

hypothesis has no async rules, so the rules are sync and drive one persistent event loop (as zarr's stateful tests
do); the agents live across examples, and each example ends with its sessions closed and both tables empty.

Rules: open a session (its prompt is its first step), step it with drafts and rewinds, park it, close it, open one
on a full ring (a parked one is evicted, or the new one is refused), and the intruder's attempts: garbage instead
of a HELLO, a wrong protocol version, a HELLO that is not JSON or names another export, a header over the payload
cap, a frame that breaks the protocol after the HELLO, a frame cut off by a disconnect, a session opened and
dropped with the connection, a step of a session it does not hold.

Invariants: every step of a healthy session gets the whole model's tokens; only the intruder's connection is
closed (the head's links live, each agent holds exactly its peers' connections); each stage's session table holds
exactly the sessions the model says; the process's memory stays under a cap.

The agents' log lines stay out of pytest's log capture (``agent_log``): pytest keeps every record of a test until it
ends, and the record of a dropped connection holds what held that connection alive (issue 46).

``SHOAL_STATEFUL_STEPS`` sets the rule steps (300 here; ``make fuzz-agent`` runs 10,000 and prints the figures).
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
import collections
import gc
import logging
import os
import ssl
import sys
import time
from collections.abc import Awaitable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from agent.errors import FleetBusyError, SessionEvictedError
from agent.fleet import NodeIdentity, init_fleet, issue_node
from agent.head.ring_client import RingClient, RingSession
from agent.node.config import AgentConfig
from agent.node.facts import resident_mb
from agent.node.server import StageServer
from agent.sampling.params import SamplingParams
from agent.transport.heartbeat import Liveness
from agent.transport.network import TlsNetwork
from agent.transport.tls import client_context
from agent.wire import HEADER_SIZE, PROTOCOL_VERSION, Frame, FrameType, encode_frame
from agent.wire.frames import HEADER, MAGIC
from agent.wire.messages import ErrorReport, Hello, SessionOpen, parse
from tests.support.toy_model import VOCAB, ToyStage, ToyWeights, toy_manifest, whole_model

STEPS = int(os.environ.get("SHOAL_STATEFUL_STEPS", "300"))
MAX_SESSIONS = 3
MAX_PAYLOAD = 64 * 1024
"""The agents' frame cap: small, so that an oversize header is cheap to send."""
MEMORY_CAP_MB = 200
"""What the process may grow by over the whole run: an agent that buffered an attacker's declared payloads, or kept
the sessions of dropped connections, would pass it."""
CONTEXT = 200
"""Positions a session may hold (the toy manifest's context is 256)."""
WAIT = 5.0
LOG_TAIL = 200
"""The agents' last log lines, shown when the test fails."""
GREEDY = SamplingParams()
T = TypeVar("T")

pytestmark = [pytest.mark.timeout(max(120, STEPS // 20))]


@dataclass
class Identities:
    stages: list[NodeIdentity]
    head: NodeIdentity
    intruder: NodeIdentity


@pytest.fixture(scope="module")
def identities(tmp_path_factory: pytest.TempPathFactory) -> Identities:
    folder = tmp_path_factory.mktemp("fleet")
    init_fleet(folder, "fuzz")
    return Identities(
        [issue_node(folder, "stage0"), issue_node(folder, "stage1")],
        issue_node(folder, "head"),
        issue_node(folder, "intruder"),
    )


class AgentLog(logging.Handler):
    """The agents' log lines, formatted as they come (every log call of the run is exercised) and kept as text only:
    the last ``LOG_TAIL`` of them, and a count by level."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        self.tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
        self.counts: collections.Counter[str] = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        self.tail.append(self.format(record))
        self.counts[record.levelname] += 1


@pytest.fixture
def agent_log() -> Iterator[AgentLog]:
    """Route the agents' (and asyncio's) records to an ``AgentLog`` instead of pytest's log capture.

    pytest keeps every record a test logs, arguments included, until the test ends. The intruder makes the agents
    log a warning per dropped connection, whose argument is the exception: its traceback holds the frames of the
    connection's handler, which hold the connection, its TLS transport and that transport's 256 KiB buffer. Kept so,
    10,000 steps grew the process past the memory cap (issue 46); an agent's own handlers keep no record.
    """
    handler = AgentLog()
    loggers = [logging.getLogger(name) for name in ("agent", "asyncio")]
    propagated = [logger.propagate for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
    try:
        yield handler
    finally:
        for logger, propagate in zip(loggers, propagated, strict=True):
            logger.removeHandler(handler)
            logger.propagate = propagate


@dataclass
class Ring:
    """Two agents on loopback over mutual TLS, a head connected to them, and the whole model as the reference."""

    loop: asyncio.AbstractEventLoop
    servers: list[StageServer]
    client: RingClient
    whole: ToyStage
    intruder_context: ssl.SSLContext
    rss_mb: float
    counts: collections.Counter[str] = field(default_factory=collections.Counter)
    """Rule steps run, by rule."""
    rewinds: int = 0

    def run(self, coro: Awaitable[T], timeout: float = WAIT) -> T:
        async def bounded() -> T:
            async with asyncio.timeout(timeout):
                return await coro

        return self.loop.run_until_complete(bounded())

    def held(self) -> list[set[int]]:
        return [set(server.table.sessions) for server in self.servers]

    def connections(self) -> list[int]:
        return [len(server._connections) for server in self.servers]

    def until(self, condition: Any, what: str) -> None:
        self.run(until(condition, what), WAIT * 2)

    @property
    def steps(self) -> int:
        return sum(self.counts.values())


async def until(condition: Any, what: str) -> None:
    """Wait on the loop (the agents run meanwhile) until ``condition()`` holds."""
    try:
        async with asyncio.timeout(WAIT):
            while not condition():
                await asyncio.sleep(0.002)
    except TimeoutError:
        raise AssertionError(f"{what}: still not so after {WAIT} s") from None


async def start_ring(identities: Identities) -> tuple[list[StageServer], RingClient]:
    manifest = toy_manifest(2)
    weights = ToyWeights.make(manifest.arch.num_layers)
    liveness = Liveness(interval=0.5, timeout=5.0)
    servers: list[StageServer] = []
    next_address = None
    for index in (1, 0):  # the last stage first: the first dials it
        config = AgentConfig(
            export_dir=Path("/nonexistent/toy-export"),
            stages=(index,),
            identity_dir=Path("/nonexistent/identity"),
            listen=("127.0.0.1", 0),
            next=next_address,
            max_sessions=MAX_SESSIONS,
            max_payload=MAX_PAYLOAD,
            verify=False,
            heartbeat_interval=liveness.interval,
            link_timeout=liveness.timeout,
        )
        network = TlsNetwork.of(identities.stages[index])
        server = StageServer(config, manifest, [ToyStage(manifest.stages[index], weights)], f"stage{index}", network)
        next_address = await server.start()
        servers.insert(0, server)
    head = TlsNetwork.of(identities.head)
    client = RingClient(manifest, servers[0].address, servers[1].address, head, "head", liveness=liveness)
    await client.connect(timeout=WAIT)
    return servers, client


@pytest.fixture
def ring(identities: Identities, agent_log: AgentLog) -> Iterator[Ring]:
    loop = asyncio.new_event_loop()
    servers, client = loop.run_until_complete(start_ring(identities))
    manifest = client.manifest
    whole = ToyStage(whole_model(manifest), servers[0].stages[0].weights)  # type: ignore[attr-defined]
    ring = Ring(loop, servers, client, whole, client_context(identities.intruder), resident_mb())
    ring.until(lambda: ring.connections() == [1, 2], "the head's links and stage 0's link to stage 1 are up")
    try:
        yield ring
    finally:
        loop.run_until_complete(client.close())
        for server in servers:
            loop.run_until_complete(server.stop())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


@dataclass
class Conversation:
    """A healthy session as the model sees it: its reference state, and whether it waits parked."""

    session: RingSession
    reference: Any
    parked_at: int | None = None


def frame_bytes(frame: Frame) -> bytes:
    return b"".join(bytes(b) for b in encode_frame(frame))


def header(frame_type: int, size: int, *, version: int = PROTOCOL_VERSION, dtype: int = 1, session: int = 0) -> bytes:
    """A frame header by hand: any field, checked or not."""
    return HEADER.pack(MAGIC, version, frame_type, session, 0, 0, 0, 0, 0, dtype, 1, size, 0, 0, 0, size)


INTRUSIONS = (
    "garbage",
    "wrong_version",
    "bad_hello",
    "foreign_export",
    "oversize",
    "bad_frame",
    "unexpected_type",
    "cut_mid_frame",
    "open_and_drop",
    "unknown_session",
)


def machine(ring: Ring) -> type[RuleBasedStateMachine]:
    """The state machine over ``ring`` (its agents outlive each example)."""

    class LiveAgent(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.live: dict[int, Conversation] = {}
            self.parks = 0

        # -- the healthy head --------------------------------------------------------------------------
        def _step(self, conversation: Conversation, ids: list[int], rewind: int) -> None:
            """One step on the ring and the same on the whole model: the same tokens at every position."""
            output = ring.run(conversation.session.step(ids, rewind, last_only=False))
            reference = conversation.reference
            reference.rewind(rewind)
            logits = reference.step(np.asarray([ids], dtype=np.int64), last_only=False)
            assert output.top1 is not None
            assert output.top1.tolist() == logits[0].argmax(axis=-1).tolist(), "the ring's tokens are not the model's"
            conversation.parked_at = None

        @precondition(lambda self: len(self.live) < MAX_SESSIONS)
        @rule(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=12))
        def open_session(self, prompt: list[int]) -> None:
            ring.counts["open"] += 1
            session = ring.run(ring.client.open_session(GREEDY))
            conversation = Conversation(session, ring.whole.new_session())
            self._step(conversation, prompt, 0)
            self.live[session.id] = conversation

        @precondition(lambda self: len(self.live) == MAX_SESSIONS)
        @rule(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4))
        def open_on_a_full_ring(self, prompt: list[int]) -> None:
            """A parked session gives its place up (the one parked the longest ago), or the new one is refused."""
            ring.counts["open_full"] += 1
            parked = [c for c in self.live.values() if c.parked_at is not None]
            session = ring.run(ring.client.open_session(GREEDY))
            conversation = Conversation(session, ring.whole.new_session())
            if not parked:
                with pytest.raises(FleetBusyError):
                    self._step(conversation, prompt, 0)
                ring.run(session.close())
                return
            victim = min(parked, key=lambda c: c.parked_at or 0)
            self._step(conversation, prompt, 0)
            ring.until(lambda: not victim.session.usable(), "the evicted session's head was told")
            with pytest.raises(SessionEvictedError):
                ring.run(victim.session.step([1], 0, last_only=False))
            ring.run(victim.session.close())
            del self.live[victim.session.id]
            self.live[session.id] = conversation

        @precondition(lambda self: bool(self.live))
        @rule(data=st.data(), drafts=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4))
        def step(self, data: st.DataObject, drafts: list[int]) -> None:
            """A step of 1-4 positions, after forgetting up to 4 of the held ones (rejected drafts)."""
            ring.counts["step"] += 1
            conversation = data.draw(st.sampled_from(sorted(self.live.values(), key=lambda c: c.session.id)))
            held = conversation.reference.logical_length
            rewind = data.draw(st.integers(0, min(4, held - 1)))
            if held - rewind + len(drafts) > CONTEXT:
                rewind = held - 1  # a long conversation starts over from its first position
            ring.rewinds += bool(rewind)
            self._step(conversation, drafts, rewind)

        @precondition(lambda self: bool(self.live))
        @rule(data=st.data())
        def park(self, data: st.DataObject) -> None:
            ring.counts["park"] += 1
            conversation = data.draw(st.sampled_from(sorted(self.live.values(), key=lambda c: c.session.id)))
            ring.run(conversation.session.park())
            self.parks += 1
            conversation.parked_at = self.parks

        @precondition(lambda self: bool(self.live))
        @rule(data=st.data())
        def close(self, data: st.DataObject) -> None:
            ring.counts["close"] += 1
            conversation = data.draw(st.sampled_from(sorted(self.live.values(), key=lambda c: c.session.id)))
            ring.run(conversation.session.close())
            del self.live[conversation.session.id]

        # -- the intruder ------------------------------------------------------------------------------
        @rule(kind=st.sampled_from(INTRUSIONS), stage=st.integers(0, 1), noise=st.binary(min_size=1, max_size=200))
        def intrude(self, kind: str, stage: int, noise: bytes) -> None:
            ring.counts[f"intrude:{kind}"] += 1
            if kind == "open_and_drop":  # as its own head on the last stage: the session stays until it hangs up
                stage = 1
                if len(self.live) >= MAX_SESSIONS:
                    kind = "unknown_session"  # its session must not take a healthy one's place
            ring.run(self._intrude(kind, ring.servers[stage], noise))
            ring.until(lambda: ring.connections() == [1, 2], "the intruder's connection is gone, the others stay")
            if self.live:  # the agent still answers a healthy session, with the right tokens
                conversation = min(self.live.values(), key=lambda c: c.session.id)
                self._step(conversation, [noise[0] % VOCAB], 0)

        async def _intrude(self, kind: str, server: StageServer, noise: bytes) -> None:
            host, port = server.address
            reader, writer = await asyncio.open_connection(host, port, ssl=ring.intruder_context, server_hostname=host)
            role = "stage" if server is ring.servers[1] and kind != "open_and_drop" else "head"
            hello = Hello("intruder", role, ring.client.manifest.export_id, head_id=0x1D)
            try:
                if kind == "garbage":
                    writer.write(b"XX" + noise.ljust(HEADER_SIZE, b"\0"))
                elif kind == "wrong_version":
                    raw = frame_bytes(hello.to_frame())
                    version = PROTOCOL_VERSION + 1 + noise[0] % 200
                    writer.write(raw[:2] + bytes([version % 256 or 1]) + raw[3:])
                elif kind == "bad_hello":
                    writer.write(frame_bytes(Frame.message(FrameType.HELLO, noise)))
                elif kind == "foreign_export":
                    other = Hello("intruder", role, "0" * 16 if noise[0] % 2 else noise.hex()[:16], head_id=0x1D)
                    writer.write(frame_bytes(other.to_frame()))
                else:
                    writer.write(frame_bytes(hello.to_frame()))
                    await _expect_hello(reader)
                    await self._after_hello(kind, server, reader, writer, noise)
                    return
                await writer.drain()
                await _expect_dropped(reader)
            finally:
                writer.close()
                # the server may drop the connection before the TLS close is done
                await asyncio.gather(writer.wait_closed(), return_exceptions=True)

        async def _after_hello(
            self,
            kind: str,
            server: StageServer,
            reader: asyncio.StreamReader,
            writer: asyncio.StreamWriter,
            noise: bytes,
        ) -> None:
            session = int.from_bytes(noise[:7].ljust(7, b"\1"), "little") | 1
            if kind == "oversize":  # a header over the cap: dropped before a byte of its payload is read
                size = MAX_PAYLOAD + 1 + int.from_bytes(noise[:3], "little")
                writer.write(header(FrameType.STEP, size, session=session))
            elif kind == "bad_frame":  # a header that breaks the protocol after the HELLO
                broken = bytearray(header(FrameType.STEP, 8, session=session))
                broken[3 + noise[0] % 2 * 23] = 200  # an unknown frame type, or an unknown dtype
                writer.write(bytes(broken))
            elif kind == "unexpected_type":  # a frame no upstream peer sends
                writer.write(frame_bytes(Frame.message(FrameType.RESULT, noise, session=session)))
            elif kind == "cut_mid_frame":  # a whole header and part of its payload, then the connection ends
                ids = np.asarray([[n % VOCAB for n in noise] + [0]], dtype=np.int64)
                raw = frame_bytes(Frame.tensor(FrameType.STEP, ids, session=session, count=ids.shape[1]))
                writer.write(raw[: HEADER_SIZE + len(noise) % (len(raw) - HEADER_SIZE)])
                await writer.drain()
                return  # the intruder hangs up
            elif kind == "open_and_drop":  # a session that must go with its connection
                writer.write(frame_bytes(SessionOpen(0x1D).to_frame(session)))
                await writer.drain()
                await until(lambda: session in server.table.sessions, "the intruder's session opened")
                return  # the intruder hangs up: its session goes with it
            elif kind == "unknown_session":  # refused with an ERROR on its own connection, which stays open
                ids = np.asarray([[noise[0] % VOCAB]], dtype=np.int64)
                writer.write(frame_bytes(Frame.tensor(FrameType.STEP, ids, session=session, count=1, step=3)))
                await writer.drain()
                frame = await _next_frame(reader)
                assert frame.type is FrameType.ERROR and frame.session == session
                assert parse(frame, ErrorReport).code == "unknown_session"
                return
            await writer.drain()
            await _expect_dropped(reader)

        # -- invariants --------------------------------------------------------------------------------
        @invariant()
        def the_head_keeps_its_links(self) -> None:
            assert ring.client.failure is None, f"the head lost the ring: {ring.client.failure}"

        @invariant()
        def each_table_holds_the_models_sessions(self) -> None:
            expected = set(self.live)
            ring.until(lambda: ring.held() == [expected, expected], f"both stages hold exactly {len(expected)}")

        @invariant()
        def memory_stays_under_the_cap(self) -> None:
            grown = resident_mb() - ring.rss_mb
            assert grown < MEMORY_CAP_MB, f"the process grew by {grown:.0f} MB"

        def teardown(self) -> None:
            for conversation in self.live.values():
                ring.run(conversation.session.close())
            ring.until(lambda: ring.held() == [set(), set()], "every session closed on both stages")

    return LiveAgent


RING_TLS_ENDS = 6
"""The head's links to both stages and stage 0's to stage 1, both ends of each in this process."""


def tls_ends(ring: Ring) -> int:
    """The TLS connection ends alive in the process once the intruder's last ones are done (each holds a 256 KiB
    buffer: what a kept dropped connection costs, issue 46)."""
    alive = 0
    for _ in range(50):
        ring.run(asyncio.sleep(0.02))  # the handlers of the last dropped connections finish
        gc.collect()
        alive = sum(isinstance(o, asyncio.sslproto.SSLProtocol) for o in gc.get_objects())
        if alive <= RING_TLS_ENDS:
            break
    return alive


async def _next_frame(reader: asyncio.StreamReader) -> Frame:
    from agent.wire import FrameDecoder

    decoder = FrameDecoder(MAX_PAYLOAD)
    while (frame := decoder.next_frame()) is None:
        data = await reader.read(65536)
        if not data:
            raise AssertionError("the agent closed the connection")
        decoder.receive_data(data)
    return frame


async def _expect_hello(reader: asyncio.StreamReader) -> None:
    frame = await _next_frame(reader)
    assert frame.type is FrameType.HELLO


async def _expect_dropped(reader: asyncio.StreamReader) -> None:
    """The agent closes the connection (EOF or a reset) without a frame more than it had to send."""
    try:
        while await reader.read(65536):
            pass
    except (ConnectionError, ssl.SSLError):
        pass


def test_a_live_agent_under_a_state_machine_of_sessions_and_intrusions(ring: Ring, agent_log: AgentLog) -> None:
    started = time.monotonic()
    options = settings(
        max_examples=10,
        stateful_step_count=40,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        # the suite's short run follows one fixed sequence (its coverage checks below must not depend on luck); a
        # long run (SHOAL_STATEFUL_STEPS) draws afresh
        derandomize="SHOAL_STATEFUL_STEPS" not in os.environ,
    )
    try:
        while ring.steps < STEPS:
            run_state_machine_as_test(machine(ring), settings=options)
            # the fast tier runs with the collector paused (tests/conftest.py's _loop_watch): collect each round's
            # cycles (hypothesis's, mostly) between rounds, while the loop is idle, so that the cap measures what
            # the agents keep
            gc.collect()
    except BaseException:
        print("\nthe agents' last log lines:\n" + "\n".join(agent_log.tail), file=sys.stderr)
        raise
    seconds = time.monotonic() - started
    intrusions = sum(n for name, n in ring.counts.items() if name.startswith("intrude:"))
    print(
        f"\nstateful live agent: {ring.steps} rule steps in {seconds:.1f} s, {intrusions} intrusions, "
        f"{ring.rewinds} steps with a rewind, {agent_log.counts['WARNING']} warnings logged, "
        f"the process grew {resident_mb() - ring.rss_mb:.1f} MB; "
        + ", ".join(f"{name} {n}" for name, n in sorted(ring.counts.items()))
    )
    assert all(ring.counts[f"intrude:{kind}"] for kind in INTRUSIONS), "an intrusion was never tried"
    alive = tls_ends(ring)
    assert alive == RING_TLS_ENDS, f"{alive} TLS connection ends alive, where the ring has {RING_TLS_ENDS}"
    assert ring.counts["open_full"] and ring.rewinds, "a full ring or a rewind was never tried"
