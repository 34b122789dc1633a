"""A head's side of the ring: its sessions' frames out to the first stage, results in from the last.

If the head holds stage 0 itself (``local_stages``), it runs it in-process and sends hidden states
to the next stage, saving a hop. The last stage answers over the head's own connection to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from agent.errors import (
    FleetBusyError,
    PeerUnavailableError,
    ProtocolError,
    RingError,
    RingMovedError,
    SessionEvictedError,
    SessionFailedError,
)
from agent.head.local_packer import HEAD_PACKING, LocalOutput, LocalPacker, LocalStep
from agent.head.prefill import DEFAULT_PREFILL_CHUNK, PrefillWatcher, prefill_chunks
from agent.head.targets import ignore_unawaited_failure
from agent.head.turn import HeadTurn
from agent.runtime.packed import PackedStep
from agent.runtime.packer import PackPolicy
from agent.runtime.protocol import KVSession, Stage, new_sessions, wire_numpy_dtype
from agent.runtime.repeatable import stages_alike, stages_exact, step_is_repeatable, step_is_settled
from agent.sampling.params import SamplingParams
from agent.sampling.readout import StepOutput
from agent.transport.connection import FrameConnection, expect
from agent.transport.heartbeat import Heartbeat, Liveness
from agent.transport.network import Network
from agent.wire import Frame, FrameType, StepFlags
from agent.wire.codec import DEFAULT_MAX_PAYLOAD
from agent.wire.frames import FrameFields
from agent.wire.messages import ErrorReport, Hello, SessionOpen, parse
from agent.wire.result import parse_result
from shards.manifest import Manifest

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Pending:
    """A step sent and not yet answered: its answer's future, or for a chunk of a prompt (``StepFlags.PART``)
    none, and the prompt's progress once the chunk is through: (positions done, positions in all)."""

    future: asyncio.Future[StepOutput] | None
    count: int
    progress: tuple[int, int] = (0, 0)
    settled_here: bool = True
    """The head's own stages computed it as a fresh prompt's step would (``agent.runtime.repeatable``)."""


@dataclass(frozen=True)
class StepDeadline:
    """How long a head waits for the answer to one step before it gives the session up.

    Heartbeats notice a frozen or vanished peer within seconds; this is the backstop for an answer that
    will never come over a link that lives (a stage that dropped the session without a word). A prompt's
    step may take long (a 4,095-token prompt took 138 s through a 3-agent ring on 2 cores), so the
    allowance grows with the positions a step carries."""

    base: float = 30.0
    per_position: float = 0.1

    def seconds(self, positions: int) -> float:
        return self.base + self.per_position * positions


class RingClient:
    """Connections from one head to the ring, shared by all of its sessions."""

    def __init__(
        self,
        manifest: Manifest,
        first: tuple[str, int],
        last: tuple[str, int],
        network: Network,
        node: str,
        *,
        local_stages: Sequence[Stage] = (),
        executor: Executor | None = None,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        wire_dtype: str = "auto",
        liveness: Liveness | None = None,
        deadline: StepDeadline | None = None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        on_local_step: Callable[[float], None] | None = None,
        packing: PackPolicy | None = HEAD_PACKING,
        on_local_pack: Callable[[int], None] | None = None,
        make_kv_room: Callable[[Iterable[PackedStep]], None] | None = None,
    ) -> None:
        """``liveness``: how the head's two links are watched (heartbeats; ``Liveness()`` by default);
        ``on_local_step``: told the seconds of each step computed on ``local_stages`` (on the event loop: the agent
        counts them with its stages' ring steps);
        ``deadline``: how long one step's answer is waited for (``StepDeadline()`` by default);
        ``prefill_chunk``: positions per chunk of a long prompt, pipelined through the ring (0: one step;
        ``agent.head.prefill``);
        ``packing``: how the steps that the head's sessions queue for ``local_stages`` meanwhile go through them
        together (``agent.head.local_packer``; None: one at a time); ``on_local_pack``: told the steps (or prompt
        chunks) of each pack computed on them; ``make_kv_room``: frees the KV blocks a pack's steps need on them
        (``LocalPacker``'s ``make_room``)."""
        self.manifest = manifest
        self.first_address = first
        self.last_address = last
        self._network = network
        self.node = node
        self.local_stages = list(local_stages)
        if self.local_stages and self.local_stages[-1].graph.head:
            raise RingError("the head holds every stage: use the in-process pipeline instead of a ring")
        self._executor = executor
        self._max_payload = max_payload
        self._liveness = liveness or Liveness()
        self.deadline = deadline or StepDeadline()
        if prefill_chunk < 0:
            raise RingError(f"a prefill chunk is a number of positions, not {prefill_chunk}")
        self.prefill_chunk = prefill_chunk
        self._wire_dtype = wire_numpy_dtype(wire_dtype, self.local_stages[-1]) if self.local_stages else np.float32
        self.head_id = secrets.randbits(32) or 1
        self.local = LocalPacker(
            self.local_stages,
            executor,
            packing,
            self._wire_dtype,
            node,
            on_pack=on_local_pack,
            make_room=make_kv_room,
        )
        self._first: FrameConnection | None = None
        self._last: FrameConnection | None = None
        self._sessions: dict[int, RingSession] = {}
        self._readers: list[asyncio.Task[Any]] = []
        self.failure: RingError | None = None
        self._reconnecting = asyncio.Lock()
        """Held by the one reconnect under way: chats that find the ring lost at once reach it once, not each
        over the other's connections (orphaned, they kept the sessions opened on them held on the stages)."""
        self._connected = 0
        """How many times the ring was reached: a reconnect that waited for another one sees it done."""
        self._on_local_step = on_local_step
        self.turn = HeadTurn()
        """The head's core, shared by its sessions: each step's local work is done holding it
        (``decode(turn=...)``), so that sessions take whole turns instead of interleaving: its drafting, and the
        queueing of its step for the head's stages (``local``), which compute the steps queued meanwhile packed."""

    @property
    def first_layer(self) -> int:
        return self.local_stages[-1].graph.layer_stop if self.local_stages else 0

    async def connect(self, timeout: float = 30.0) -> None:
        """Reach the first and last stages (retrying until ``timeout``: bring-up order is free). On failure
        nothing stays connected: half a ring (the first stage reached, the last not) is no ring."""
        if self._first is not None:
            raise RingError("already connected: reconnect() replaces a lost ring")
        try:
            await self._connect(timeout)
        except Exception:
            await self._drop_connections()
            raise

    async def _connect(self, timeout: float) -> None:
        hello = Hello(node=self.node, role="head", export_id=self.manifest.export_id, head_id=self.head_id)
        self._first, first = await self._handshake(self.first_address, hello, timeout, "first stage")
        if first.layer_start != self.first_layer:
            raise RingError(f"{first.node} serves layers from {first.layer_start}, the head needs {self.first_layer}")
        if self.last_address == self.first_address:
            self._last, last = self._first, first
        else:
            self._last, last = await self._handshake(self.last_address, hello, timeout, "last stage")
        if not last.is_last:
            raise RingError(f"{last.node} at {self.last_address[0]}:{self.last_address[1]} is not the last stage")
        loop = asyncio.get_running_loop()
        for connection in {id(c): c for c in (self._first, self._last)}.values():
            heartbeat = Heartbeat(connection, self._liveness, self.node)
            self._readers.append(loop.create_task(self._read(connection, heartbeat)))
            self._readers.append(loop.create_task(heartbeat.run()))
        self._connected += 1
        log.info("node=%s head %x connected: first %s, last %s", self.node, self.head_id, first.node, last.node)

    async def _handshake(
        self, address: tuple[str, int], hello: Hello, timeout: float, what: str
    ) -> tuple[FrameConnection, Hello]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        delay = 0.1
        while True:
            try:
                connection = await self._network.dial(
                    address, max_payload=self._max_payload, label=f"{what} {address[0]}:{address[1]}"
                )
                await connection.send(hello.to_frame())
                peer = parse(await expect(connection, FrameType.HELLO, 10.0), Hello)
                return connection, peer
            except PeerUnavailableError as exc:
                if loop.time() + delay > deadline:
                    raise RingError(f"cannot join the ring: {exc}") from exc
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
            except ProtocolError as exc:
                raise RingError(f"{what} {address[0]}:{address[1]}: {exc}") from exc

    async def reconnect(self, timeout: float = 30.0) -> None:
        """Drop the connections (sessions still on them fail: their state on the stages is gone with them)
        and reach the ring afresh, retrying with backoff until ``timeout``. One at a time: a reconnect asked for
        while another is under way waits for it, and is done if it reached the ring."""
        connected = self._connected
        async with self._reconnecting:
            if self._connected != connected and self.failure is None and self._first is not None:
                return
            await self._reconnect(timeout)

    async def _reconnect(self, timeout: float) -> None:
        error = self.failure or PeerUnavailableError("the head reconnects")
        for session in list(self._sessions.values()):
            session._fail(error)
        self._sessions.clear()  # they cannot go on: no longer counted as open (``useful_depth``)
        await self._drop_connections()
        self.failure = None
        log.info("node=%s head %x reconnecting (%s)", self.node, self.head_id, error)
        try:
            await self.connect(timeout)
        except RingError as exc:
            # still lost: the next session tries again (a frozen stage that thaws, a PC that reboots)
            self.failure = PeerUnavailableError(f"the ring cannot be reached again: {exc}")
            raise

    async def open_session(self, params: SamplingParams, timeout: float = 30.0) -> RingSession:
        """A new conversation, reconnecting first if the ring was lost since the last one: a stage that
        died and came back (or its replacement at the same address) serves the next answer."""
        if self.failure is not None or self._reconnecting.locked():
            await self.reconnect(timeout)
        # the local stages' infer requests are made on the compute thread, not on the event loop
        local = await asyncio.get_running_loop().run_in_executor(self._executor, new_sessions, self.local_stages)
        return self.session(params, local)

    @property
    def open_sessions(self) -> int:
        """This head's sessions on the ring that have not been closed."""
        return len(self._sessions)

    def session(self, params: SamplingParams, local: list[KVSession] | None = None) -> RingSession:
        """A new conversation (its state on the stages is created by the first step); on a lost ring its
        first step fails with the loss (``open_session`` reconnects instead). ``local``: the sessions of this
        head's own stages, made here when not given (a blocking call: on an event loop use ``open_session``)."""
        if self._first is None:
            raise RingMovedError(
                "the fleet's ring moved (a new plan) just as this request opened its session: "
                "this is transient, retry the request in a moment"
            )
        if local is None:
            local = new_sessions(self.local_stages)
        session = RingSession(self, secrets.randbits(63) or 1, params, local)
        self._sessions[session.id] = session
        return session

    async def _read(self, connection: FrameConnection, heartbeat: Heartbeat) -> None:
        """Deliver results and errors to their sessions until the connection ends."""
        try:
            while True:
                frame = await connection.receive()
                heartbeat.heard(frame)
                if frame.type is FrameType.PONG:
                    continue
                if frame.type is FrameType.GOODBYE:
                    raise PeerUnavailableError(f"{connection.label} left the ring")
                session = self._sessions.get(frame.session)
                if session is None:
                    continue  # a late answer for a session that already ended
                if frame.type is FrameType.RESULT:
                    session._deliver(frame)
                elif frame.type is FrameType.ERROR:
                    session._fail(_error(parse(frame, ErrorReport)))
                else:
                    raise ProtocolError(f"unexpected {frame.type.name} from {connection.label}")
        except (PeerUnavailableError, ProtocolError) as exc:
            error = PeerUnavailableError(f"ring connection lost: {heartbeat.lost or exc}")
            self.failure = error
            for session in list(self._sessions.values()):
                session._fail(error)
            if isinstance(exc, ProtocolError):
                connection.abort()

    async def send_first(self, frame: Frame) -> None:
        if self.failure is not None:
            raise self.failure
        if self._first is None:  # closed: the plan moved the ring, or the agent stops
            raise PeerUnavailableError(f"{self.node}: this head's ring connection is closed")
        await self._first.send(frame)

    def forget(self, session: RingSession) -> None:
        self._sessions.pop(session.id, None)

    def counted_local(self, seconds: float) -> None:
        """One step computed on the head's own stages, in ``seconds``."""
        if self._on_local_step is not None:
            self._on_local_step(seconds)

    async def close(self) -> None:
        """End every session (each stage frees it) and drop the connections. A step still waiting fails now, as
        a lost ring (a chat replays it on the plan's new ring): its answer can no longer arrive."""
        closed = PeerUnavailableError(
            f"{self.node}: this head's ring connection was closed (the plan moved the ring, or the agent stops)"
        )
        for session in list(self._sessions.values()):
            session._fail(closed)
            with contextlib.suppress(RingError):
                await session.close()
        await self._drop_connections()

    async def _drop_connections(self) -> None:
        for task in self._readers:
            task.cancel()
        self._readers = []
        connections = {id(c): c for c in (self._first, self._last) if c is not None}.values()
        self._first = self._last = None
        for connection in connections:
            await connection.close()  # the goodbye is skipped or times out where the peer is gone


def _error(report: ErrorReport) -> RingError:
    where = f" ({report.node})" if report.node else ""
    if report.code == "busy":
        return FleetBusyError(report.message)
    if report.code == "peer_lost":
        return PeerUnavailableError(report.message + where)
    if report.code == "evicted":
        return SessionEvictedError(report.message)
    return SessionFailedError(f"{report.code}: {report.message}{where}")


class RingSession:
    """One conversation driven around the ring; a :class:`~agent.head.targets.Target`."""

    def __init__(self, client: RingClient, session_id: int, params: SamplingParams, local: list[KVSession]) -> None:
        self.client = client
        self.id = session_id
        self.params = params
        self._local = local
        self._opened = False
        self._closed = False
        self._step = 0
        self._logical = 0
        # Steps sent and not yet answered, oldest first: the stages answer a session's steps in order.
        self._pending: dict[int, _Pending] = {}
        self.on_prefill: PrefillWatcher | None = None
        """Told the progress of a prompt sent in chunks (``agent.head.prefill``), chunk by chunk."""
        self.prefill_progress: tuple[int, int] | None = None
        """The progress of the prompt being computed, (positions done, positions in all); ``None`` when none is."""
        self._watchdog: asyncio.TimerHandle | None = None
        """Fails the session when the oldest pending step goes unanswered too long (``_arm``)."""
        self._failure: RingError | None = None
        self.bytes_sent = 0
        self.bytes_received = 0
        """Payload bytes of this session's steps to the first stage, and of the answers back, prompt included."""
        self.prompt_bytes_sent = 0
        self.prompt_bytes_received = 0
        """Of those, the first prompt's steps (one, or its chunks): the rest, divided by the steps after it, is a
        decode step's."""
        self._prompt_steps = 0
        self._repeatable = True
        """No step so far was computed unlike another grouping of its positions, on this head's stages or the
        ring's (``agent.runtime.repeatable``): the session's readouts are what plain decoding gives."""
        self._settled = True
        """No chunk of the step being answered was marked ``StepFlags.UNSETTLED`` so far (``StepOutput.settled``)."""
        self._sender: asyncio.Task[None] | None = None
        """Sends the latest steps' hidden states on once the head's stages computed them (``_send_computed``)."""

    def _deliver(self, frame: Frame) -> None:
        if not self._pending:
            return
        oldest = next(iter(self._pending))
        pending = self._pending.pop(oldest)
        self._arm()  # the next step's deadline runs from this answer
        if frame.step != oldest:
            error = SessionFailedError(f"result for step {frame.step} arrived where {oldest} was due")
            if pending.future is not None:
                pending.future.set_exception(error)
            self._fail(error)
            return
        self.bytes_received += len(frame.payload)
        if frame.flags & StepFlags.UNREPEATABLE:
            self._repeatable = False
        self._settled = self._settled and pending.settled_here and not frame.flags & StepFlags.UNSETTLED
        if frame.step < self._prompt_steps:
            self.prompt_bytes_received += len(frame.payload)
        if pending.future is None:  # a chunk of a prompt: its answer says only that it went through
            if not frame.flags & StepFlags.PART or frame.payload:
                self._fail(SessionFailedError(f"step {frame.step}, a chunk of a prompt, was answered with a readout"))
                return
            self.prefill_progress = pending.progress
            if self.on_prefill is not None:
                self.on_prefill(*pending.progress)
            return
        self.prefill_progress = None
        settled, self._settled = self._settled, True  # the next step starts afresh
        try:
            output = parse_result(frame, self.client.manifest.arch.vocab_size, pending.count)
            pending.future.set_result(replace(output, settled=settled))
        except ProtocolError as exc:
            pending.future.set_exception(exc)
            self._fail(SessionFailedError(f"bad result for step {frame.step}: {exc}"))

    def _arm(self) -> None:
        """Watch the oldest step awaiting its answer. Steps queue behind each other on the stages (a replay
        sends a whole history at once), so the deadline runs from the last answer, not from each send."""
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if self._pending:
            step, pending = next(iter(self._pending.items()))
            seconds = self.client.deadline.seconds(pending.count)
            self._watchdog = asyncio.get_running_loop().call_later(seconds, self._overdue, step, seconds)

    def _overdue(self, step: int, seconds: float) -> None:
        """No answer for ``seconds`` while ``step`` waited for it: the session is given up, the user told why."""
        self._watchdog = None
        if step in self._pending:
            last = self.client.last_address
            log.warning(
                "node=%s session=%016x: no answer to step %d within %.0f s", self.client.node, self.id, step, seconds
            )
            self._fail(
                PeerUnavailableError(
                    f"no answer to step {step} within {seconds:.0f} s, though every link of the head answers its "
                    f"heartbeats (the last stage is {last[0]}:{last[1]})"
                )
            )

    def _fail(self, error: RingError) -> None:
        self._failure = error
        self._settled = False
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        pending, self._pending = self._pending, {}
        self.prefill_progress = None
        for step in pending.values():
            if step.future is not None and not step.future.done():
                step.future.set_exception(error)

    async def step(self, ids: list[int], rewind: int, last_only: bool) -> StepOutput:
        return await (await self.submit(ids, rewind, last_only))

    def useful_depth(self) -> int:
        """One step in flight per stage, shared among this head's open sessions: with as many sessions
        as stages the ring is already full, and a deeper pipeline would only queue drafts that may be void."""
        stages = len(self.client.manifest.stages)
        return max(1, stages // max(1, self.client.open_sessions))

    def repeatable(self) -> bool:
        return self._repeatable

    def answers_elsewhere(self) -> bool:
        return True  # at least the last stage is an agent: the head waits for the ring

    def watch_prefill(self, watcher: PrefillWatcher | None) -> None:
        self.on_prefill = watcher

    def usable(self) -> bool:
        return not self._closed and self._failure is None and self.client.failure is None

    async def submit(self, ids: list[int], rewind: int, last_only: bool) -> asyncio.Future[StepOutput]:
        """Send one step now; the returned future holds its readout. Steps may be submitted before earlier
        ones are answered (pipelined speculation): the stages run a session's steps in order. A prompt
        (``last_only``) goes as chunks cut at multiples of the client's ``prefill_chunk``, back to back
        (``agent.head.prefill``); the future holds the readout of its last position, as for one step."""
        if self._failure is not None:
            raise self._failure
        if self._closed:
            raise RingError("the session is closed")
        if not self._opened:
            request = SessionOpen.of(self.client.head_id, self.params)
            await self.client.send_first(request.to_frame(self.id))
            self._opened = True
        if self._local and not step_is_repeatable(stages_exact(self.client.local_stages), len(ids), rewind, last_only):
            self._repeatable = False
        alike = stages_alike(self.client.local_stages)
        position = self._logical - rewind
        if position < 0:
            raise RingError(f"cannot rewind {rewind} of {self._logical} positions")
        sizes = prefill_chunks(position, len(ids), self.client.prefill_chunk) if last_only else [len(ids)]
        # Step numbers, positions and places in the answer queue are claimed before the first await, so a
        # step submitted meanwhile comes after these.
        loop = asyncio.get_running_loop()
        future: asyncio.Future[StepOutput] = loop.create_future()
        future.add_done_callback(ignore_unawaited_failure)
        steps: list[tuple[FrameFields, list[int]]] = []
        start = 0
        for index, size in enumerate(sizes):
            part = index < len(sizes) - 1
            flags = StepFlags.PART if part else StepFlags.LAST_ONLY if last_only else StepFlags.NONE
            fields: FrameFields = {
                "session": self.id,
                "step": self._step,
                "position": position + start,
                "count": size,
                "rewind": rewind if index == 0 else 0,
                "flags": flags,
            }
            progress = (start + size, len(ids))
            here = step_is_settled(alike, size, last_only)
            self._pending[self._step] = _Pending(None if part else future, size, progress, here)
            steps.append((fields, ids[start : start + size]))
            self._step += 1
            start += size
        self._logical = position + len(ids)
        if not self._prompt_steps:
            self._prompt_steps = len(sizes)
        if len(sizes) > 1:
            self.prefill_progress = (0, len(ids))
        if self._watchdog is None:
            self._arm()
        if self._local:
            # queued on the head's stages now, sent on as they are computed: the turn this step was submitted in
            # ends at once, so the head's other sessions queue theirs meanwhile and the head packs them
            queued = [
                (fields, self.client.local.queue(self.id, self._local_step(fields, ids))) for fields, ids in steps
            ]
            self._sender = asyncio.get_running_loop().create_task(self._send_computed(self._sender, queued))
        else:
            for fields, chunk in steps:
                await self._send(Frame.tensor(FrameType.STEP, np.asarray([chunk], dtype=np.int32), **fields))
        return future

    def _local_step(self, fields: FrameFields, ids: list[int]) -> LocalStep:
        prompt = bool(fields["flags"] & (StepFlags.PART | StepFlags.LAST_ONLY))
        return LocalStep(self._local, ids, fields["position"], fields["rewind"], prompt)

    async def _send_computed(
        self, before: asyncio.Task[None] | None, queued: list[tuple[FrameFields, asyncio.Future[LocalOutput]]]
    ) -> None:
        """Send each step's hidden states on once the head's stages computed them, after the steps submitted
        before (``before``); a step that failed there fails the session."""
        if before is not None:
            await asyncio.wait([before])
        for fields, computed in queued:
            try:
                output = await computed
                if self._closed or self._failure is not None:
                    return
                self.client.counted_local(output.seconds)
                self._repeatable = self._repeatable and output.repeatable
                pending = self._pending.get(fields["step"])
                if pending is not None and not output.settled:
                    self._pending[fields["step"]] = replace(pending, settled_here=False)
                await self._send(Frame.tensor(FrameType.STEP, output.hidden, **fields))
            except RingError as exc:
                self._fail(exc)
                return
            except Exception as exc:  # the head's stages failed it: the session cannot go on, the others do
                log.warning(
                    "node=%s session=%016x: step %d failed on the head's stages: %s",
                    self.client.node,
                    self.id,
                    fields["step"],
                    exc,
                )
                self._fail(SessionFailedError(f"step {fields['step']} failed on the head's own stages: {exc}"))
                return

    async def _send(self, frame: Frame) -> None:
        sent = len(frame.payload) if isinstance(frame.payload, bytes) else frame.payload.nbytes
        self.bytes_sent += sent
        if frame.step < self._prompt_steps:
            self.prompt_bytes_sent += sent
        await self.client.send_first(frame)

    async def park(self) -> None:
        """Tell every stage the session waits for its conversation's next turn (``FrameType.PARK``): a stage
        short of room evicts it rather than turn a new session away, and its ERROR ``evicted`` then fails it
        here. The next step makes it active again."""
        if self._opened and not self._closed and self._failure is None:
            await self.client.send_first(Frame(FrameType.PARK, session=self.id))

    async def close(self) -> None:
        """End the session: every stage frees its state."""
        if self._closed:
            return
        self._closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        self.client.forget(self)
        if self._opened and self.client.failure is None:
            # also after a failure: a stage that still holds the session (an answer that never came) frees it;
            # a closed connection freed it already (every stage drops the sessions of a head that left)
            with contextlib.suppress(PeerUnavailableError):
                await self.client.send_first(Frame(FrameType.CLOSE, session=self.id))
