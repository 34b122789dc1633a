"""``StageServer``: one agent serving its stage(s) of an export on the ring.

Frames flow one way: a predecessor (or a head) sends OPEN / STEP / PARK / CLOSE; this agent runs the
step on its stages and passes the hidden states to the next stage, or, on the last stage, sends the result
straight to the session's head. ERROR frames go back up the way the session came.

One worker computes on one thread. Each session's frames are handled in their order; the steps of several
sessions that are ready at once go through the stages together, in one ``run_packed`` call, as
``agent.runtime.packer`` chooses (decode rows first, then prompt chunks within a token budget; issue 45), and
each step's frame goes on as if it had been computed alone (``pack_budget = 0``: one step at a time).

A parked session (its head keeps it for the conversation's next turn) holds its place only until a new
session needs it: then the one parked the longest ago is evicted, its head told (ERROR ``evicted``) and the
next stages freed of it, so an idle conversation never turns another user away as "fleet busy".
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np

from agent.errors import FleetBusyError, PeerUnavailableError, ProtocolError, RemoteProtocolError, ShoalError
from agent.node.config import AgentConfig
from agent.node.facts import resident_mb
from agent.node.sessions import SessionState, SessionTable
from agent.node.step_times import StepTimes
from agent.node.successor import SuccessorLink
from agent.runtime.kv_blocks import Holder, PooledSession, evictions
from agent.runtime.packed import (
    PackedStep,
    block_needs,
    held_blocks,
    kv_blocks,
    kv_mode,
    packs_alike,
    run_packed_or_each,
)
from agent.runtime.packer import Pack, ReadyStep, Slice, Turns, Wait, plan
from agent.runtime.protocol import Stage, new_sessions, wire_numpy_dtype
from agent.runtime.repeatable import stages_alike, stages_exact, step_is_repeatable, step_is_settled
from agent.sampling.readout import read_out
from agent.transport.connection import FrameConnection, expect, send_quietly
from agent.transport.heartbeat import pong
from agent.transport.network import HANDSHAKE_TIMEOUT, Listener, Network
from agent.transport.tasks import OwnedTasks
from agent.wire import Frame, FrameType, StepFlags
from agent.wire.frames import FrameFields
from agent.wire.messages import ErrorReport, Hello, SessionOpen, parse
from agent.wire.result import result_frame
from shards.manifest import Manifest

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class _Work:
    frame: Frame
    upstream: FrameConnection | None
    """None for frames this agent makes itself (a CLOSE after its upstream vanished)."""


@dataclass
class _Running:
    """A checked step being computed: in one pack, or a prompt's chunks in several."""

    work: _Work
    state: SessionState
    inputs: np.ndarray
    ready: ReadyStep
    """What the packer sees of it (its ``done`` positions advance chunk by chunk)."""
    flags: StepFlags
    """The frame's flags and the marks its slices earned (``StepFlags.UNREPEATABLE``, ``UNSETTLED``)."""
    hidden: list[np.ndarray] = field(default_factory=list)
    """A middle stage's outputs of the chunks done."""
    seconds: float = 0.0
    """The compute time of the packs it was in."""

    @property
    def last_only(self) -> bool:
        return bool(self.work.frame.flags & (StepFlags.PART | StepFlags.LAST_ONLY))

    def piece(self, piece: Slice) -> PackedStep:
        """The slice ``piece`` of this step, for ``run_packed``: its positions go on from those done."""
        frame = self.work.frame
        return PackedStep(
            self.state.stages,
            self.inputs[:, piece.start : piece.start + piece.rows],
            frame.position + piece.start,
            rewind=frame.rewind if piece.start == 0 else 0,
            last_only=self.last_only,
        )


class StageServer:
    """Accepts fleet peers (over mutual TLS: ``TlsNetwork``) and serves the configured stages."""

    def __init__(
        self,
        config: AgentConfig,
        manifest: Manifest | None,
        stages: Sequence[Stage],
        node: str,
        network: Network,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.node = node
        self._network = network
        self._clock = clock
        self.successor: SuccessorLink | None = None
        self._take(manifest, stages, config.stages, config.next)
        self.table = SessionTable(config.max_sessions, on_evict=self._evicted)
        self.heads: dict[int, FrameConnection] = {}
        self._connections: set[FrameConnection] = set()
        self._ring_peers: set[FrameConnection] = set()
        """The connections of heads and stages (not of control links or status clients)."""
        self._queue: asyncio.Queue[_Work] = asyncio.Queue()
        self._pending: collections.deque[_Work] = collections.deque()
        """Frames taken from the queue and not handled yet: each waits behind its session's step being computed."""
        self._running: dict[int, _Running] = {}
        """The checked steps to compute, one per session (a session's next step waits until its last is sent)."""
        self._turns = Turns()
        self._idle_since: float | None = None
        self.packs = 0
        self.packed_steps = 0
        """Packed inferences run, and the session steps (or prompt chunks) they held together."""
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"stage-{node}")
        self._listener: Listener | None = None
        self._tasks = OwnedTasks()
        self._started = clock()
        self.address: tuple[str, int] = config.listen
        """Where this agent listens (the bound port once started)."""
        self.steps_served = 0
        self.compute_seconds = 0.0
        """Ring steps this agent's stages computed for the heads that sent them, and their seconds."""
        self.local_steps = 0
        self.local_compute_seconds = 0.0
        """Steps this agent's stages computed in-process for the chats it heads (:meth:`count_local_step`)."""
        self.step_times = StepTimes()
        """The durations of every step its stages computed: the ring's and its own chats'."""
        self.kv_cut_seconds = 0.0
        """Of ``compute_seconds``: cutting rejected drafts out of the KV state (``--rewind compact``)."""
        self.status_sections: dict[str, Callable[[], Any]] = {}
        self.roles: dict[str, Callable[[FrameConnection, Hello], Awaitable[None]]] = {}
        """Who serves connections of the other roles (``member``: the fleet's control links), after their HELLO:
        one listening port per agent."""
        """More of ``status()``, from what runs beside the stages (the agent's chats)."""

    def _take(
        self,
        manifest: Manifest | None,
        stages: Sequence[Stage],
        indices: Sequence[int],
        next_address: tuple[str, int] | None,
    ) -> None:
        """Serve ``stages`` (numbers ``indices``) of ``manifest``, passing on to ``next_address``."""
        self.manifest = manifest
        self.stages = stages
        self.indices = tuple(indices)
        graphs = [s.graph for s in stages]
        self.serves = bool(stages)
        """False for a head that holds no stage: it listens for ``shoal status`` only, and refuses sessions."""
        self.is_last = self.serves and graphs[-1].head
        self.hello = Hello(
            node=self.node,
            role="stage",
            export_id=manifest.export_id if manifest is not None else "",
            layer_start=graphs[0].layer_start if graphs else 0,
            layer_stop=graphs[-1].layer_stop if graphs else 0,
            is_last=self.is_last,
        )
        self._wire_dtype = wire_numpy_dtype(self.config.wire_dtype, stages[-1]) if stages else np.float32
        self.successor = None
        if self.serves and not self.is_last:
            if next_address is None:
                raise ShoalError(f"stage(s) {list(indices)} are not the last: the next stage's address is needed")
            self.successor = SuccessorLink(
                next_address,
                self._network,
                self.hello,
                on_frame=self._from_successor,
                on_lost=self._successor_lost,
                max_payload=self.config.max_payload,
                liveness=self.config.liveness,
            )

    async def serve(
        self,
        manifest: Manifest | None,
        stages: Sequence[Stage],
        indices: Sequence[int],
        next_address: tuple[str, int] | None,
    ) -> None:
        """Serve other stages from now on (the fleet plan moved them): the sessions open here fail (their heads
        replay them on the new ring), the link to the old next stage closes and one to the new opens."""
        old = self.successor
        reason = f"{self.node} now serves stage(s) {', '.join(map(str, indices)) or 'none'} (the fleet plan changed)"
        for session in list(self.table.sessions):
            state = self.table.pop(session)
            if state is not None and state.upstream is not None:
                await send_quietly(state.upstream, ErrorReport("peer_lost", reason, self.node).to_frame(session))
        self._take(manifest, stages, indices, next_address)
        if old is not None:
            await old.close()
        if self.successor is not None and self._listener is not None:
            self._spawn(self.successor.run())
        for connection in list(self._ring_peers):
            connection.abort()  # heads and stages of the old placement dial the ring the plan names now
        self.heads.clear()
        log.info(
            "node=%s now serves stage(s) %s%s",
            self.node,
            ", ".join(map(str, indices)) or "none",
            f" -> {next_address[0]}:{next_address[1]}" if self.successor is not None and next_address else "",
        )

    @property
    def executor(self) -> ThreadPoolExecutor:
        """The one thread this agent computes on: its chats' local work queues there behind ring steps."""
        return self._executor

    # -- life cycle ----------------------------------------------------------------------------
    async def start(self) -> tuple[str, int]:
        """Listen, connect to the successor in the background, start the worker; returns the address."""
        host, port = self.config.listen
        self._listener = await self._network.listen((host, port), self._accept, max_payload=self.config.max_payload)
        self._spawn(self._work())
        if self.successor is not None:
            self._spawn(self.successor.run())
        address = self.address = self._listener.address
        if self.serves:
            log.info(
                "node=%s serving layers %d-%d on %s:%d%s",
                self.node,
                self.hello.layer_start,
                self.hello.layer_stop - 1,
                address[0],
                address[1],
                " (last stage)" if self.is_last else "",
            )
        else:
            log.info("node=%s holds no stage; status on %s:%d", self.node, address[0], address[1])
        return address[0], address[1]

    async def stop(self) -> None:
        """Leave the ring on purpose: GOODBYE to every peer, so that none mistakes it for a crash."""
        if self._listener is not None:
            self._listener.close()
        for connection in list(self._connections):
            await connection.close(goodbye=True)
        if self.successor is not None:
            await self.successor.close()
        await self._tasks.cancel_all()
        self._executor.shutdown(wait=True, cancel_futures=True)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        return self._tasks.spawn(coro)

    # -- connections ---------------------------------------------------------------------------
    async def _accept(self, connection: FrameConnection) -> None:
        """Serve one peer that passed the network's handshake (its certificate is of this fleet)."""
        self._tasks.adopt()
        where = connection.peer
        self._connections.add(connection)
        hello: Hello | None = None
        try:
            hello = parse(await expect(connection, FrameType.HELLO, HANDSHAKE_TIMEOUT), Hello)
            other_role = self.roles.get(hello.role)
            if other_role is not None:
                await other_role(connection, hello)
                return
            if hello.role not in ("status", "head", "stage"):
                raise RemoteProtocolError(f"this agent takes no {hello.role} connections")
            if hello.role != "status" and (self.manifest is None or hello.export_id != self.manifest.export_id):
                raise RemoteProtocolError(
                    f"peer runs export {hello.export_id}, this agent serves "
                    f"{self.manifest.export_id if self.manifest is not None else 'no export yet'}"
                )
            await connection.send(self.hello.to_frame())
            log.info("node=%s accepted %s %s (%s)", self.node, hello.role, hello.node, where)
            if hello.role == "head" and self.is_last:
                self.heads[hello.head_id] = connection
            if hello.role in ("head", "stage"):
                self._ring_peers.add(connection)
            await self._serve(connection, watched=hello.role in ("head", "stage"))
        except RemoteProtocolError as exc:
            log.warning("node=%s dropped %s: protocol error: %s", self.node, where, exc)
            connection.abort()
        except PeerUnavailableError as exc:
            log.warning("node=%s %s vanished: %s", self.node, where, exc)
        finally:
            self._connections.discard(connection)
            self._ring_peers.discard(connection)
            if hello is not None and hello.role == "head" and self.heads.get(hello.head_id) is connection:
                del self.heads[hello.head_id]
                for session in self.table.of_head(hello.head_id):
                    self._queue.put_nowait(_Work(Frame(FrameType.CLOSE, session=session), None))
            for session in self.table.owned_by(connection):
                # the upstream is gone: free the state here and downstream, after its queued steps
                self._queue.put_nowait(_Work(Frame(FrameType.CLOSE, session=session), None))
            if not connection.closed:
                await connection.close(goodbye=False)

    async def _serve(self, connection: FrameConnection, watched: bool) -> None:
        """Take frames from one peer until it leaves. ``watched``: a ring peer, which pings at least every
        heartbeat interval; one silent for the link timeout is gone (a status client is not watched)."""
        timeout = self.config.liveness.timeout if watched else None
        while True:
            try:
                async with asyncio.timeout(timeout):
                    frame = await connection.receive()
            except TimeoutError as exc:
                raise PeerUnavailableError(
                    f"{connection.label} sent nothing for {timeout:.1f} s, not even a heartbeat (its agent froze, "
                    "or its network is gone)"
                ) from exc
            kind = frame.type
            if kind is FrameType.PING:
                await connection.send(pong(frame))
                continue
            if kind is FrameType.GOODBYE:
                await connection.close(goodbye=False)
                return
            if kind in (FrameType.OPEN, FrameType.STEP, FrameType.PARK, FrameType.CLOSE):
                if frame.session == 0:
                    raise RemoteProtocolError(f"{kind.name} without a session id")
                if not self.serves:
                    report = ErrorReport("bad_request", f"{self.node} holds no stage: it serves no session", self.node)
                    await connection.send(report.to_frame(frame.session))
                    continue
                self._queue.put_nowait(_Work(frame, connection))
            elif kind is FrameType.STATUS_REQUEST:
                await connection.send(Frame.message(FrameType.STATUS, _json(self.status())))
            else:
                raise RemoteProtocolError(f"unexpected {kind.name} frame from upstream")

    # -- the worker: each session's frames in order, the ready steps of several sessions packed -----------
    async def _work(self) -> None:
        while True:
            # a call per round, so that nothing of a frame outlives its handling here: a loop variable would keep
            # the last frame's upstream connection, dropped meanwhile, alive with its TLS buffer until the next one
            try:
                await self._round()
            except Exception:  # a bug in the worker's own bookkeeping: its steps' sessions fail, the worker goes on
                log.exception("node=%s the worker failed; the sessions of its steps fail", self.node)
                await self._fail_running()

    async def _fail_running(self) -> None:
        running, self._running = self._running, {}
        for step in running.values():
            report = ErrorReport("stage_failed", "internal error", self.node)
            await self._fail(step.state.id, step.work.upstream, report)

    async def _round(self) -> None:
        """Take what is queued (waiting for a frame when nothing is), handle each session's first frame, then
        compute one pack of the ready steps (or wait the gathering window)."""
        if not self._pending and not self._running:
            self._pending.append(await self._queue.get())
        while not self._queue.empty():
            self._pending.append(self._queue.get_nowait())
        await self._admit()
        ready = [step.ready for step in self._running.values()]
        if not ready:
            return
        # stages whose sessions keep their own KV state compute a pack one step after another: packing them would
        # only hold the first step's frame back until the last is computed, and the next stage idle meanwhile
        policy = self.config.packing if any(kv_mode(stage) == "paged" for stage in self.stages) else None
        if policy is None:  # no packing: the step that came first, whole
            first = min(ready, key=lambda r: r.arrived)
            decision: Pack | Wait | None = Pack((Slice(first.session, 0, first.count, last=True),))
        else:
            idle = self._idle_since if not self._queue.qsize() else None
            # a prompt alone goes whole where the stages compute it the same however it is cut
            policy = dataclasses.replace(policy, fixed_cuts=self.alike == "none")
            decision = plan(ready, self._clock(), idle, policy, self._turns)
        if isinstance(decision, Wait):
            await asyncio.sleep(max(0.0, decision.until - self._clock()))
            self._idle_since = None
        elif decision is not None:
            self._idle_since = None
            self._make_kv_room(decision)
            await self._run_pack(decision)
            self._turns = self._turns.after(decision, ready)
            if not self._running and not self._pending and self._queue.empty():
                self._idle_since = self._clock()

    async def _admit(self) -> None:
        """In arrival order, each session's first frame: an OPEN, PARK or CLOSE is handled now; a STEP is checked
        and joins the steps to compute. A session's later frames wait behind its step being computed."""
        waiting: collections.deque[_Work] = collections.deque()
        busy = set(self._running)
        while self._pending:
            work = self._pending.popleft()
            session = work.frame.session
            if session in busy:
                waiting.append(work)
            elif work.frame.type is FrameType.STEP:
                step = await self._guarded(work, self._admit_step(work))
                if step is not None:
                    self._running[session] = step
                    busy.add(session)
            else:
                await self._guarded(work, self._control(work))
        self._pending = waiting

    async def _control(self, work: _Work) -> None:
        frame = work.frame
        if frame.type is FrameType.OPEN:
            await self._open(frame, work.upstream)
        elif frame.type is FrameType.PARK:
            await self._park(frame)
        else:
            await self._close(frame.session, forward=True)

    async def _guarded(self, work: _Work, action: Awaitable[T]) -> T | None:
        """``action`` for ``work`` 's session: a failure fails that session only (None then)."""
        return await self._guard(work.frame.session, work.upstream, action)

    async def _guard(self, session: int, upstream: FrameConnection | None, action: Awaitable[T]) -> T | None:
        try:
            return await action
        except _SessionFailure as failure:
            await self._fail(session, upstream, failure.report)
        except Exception:  # a bug must not take the agent down for everyone else
            log.exception("node=%s session=%016x: unexpected failure", self.node, session)
            await self._fail(session, upstream, ErrorReport("stage_failed", "internal error", self.node))
        return None

    async def _open(self, frame: Frame, upstream: FrameConnection | None) -> None:
        try:
            request = parse(frame, SessionOpen)
        except RemoteProtocolError as exc:
            raise _SessionFailure("bad_request", str(exc)) from exc
        if self.table.get(frame.session) is not None:
            raise _SessionFailure("bad_request", f"session {frame.session:016x} is already open")
        if self.is_last:
            self._head_of(request)
        if self._asker_gone(frame.session, upstream):
            return
        if not self.table.make_room():
            log.warning(
                "node=%s session=%016x refused: all %d sessions in use", self.node, frame.session, self.table.capacity
            )
            # refuse without touching the session of the same id downstream: it was never opened
            if upstream is not None:
                await send_quietly(
                    upstream,
                    ErrorReport(
                        "busy",
                        f"fleet busy: {self.node} already serves {self.table.capacity} sessions; try again later",
                        self.node,
                    ).to_frame(frame.session),
                )
            return
        loop = asyncio.get_running_loop()
        sessions = await loop.run_in_executor(self._executor, new_sessions, self.stages)
        if self._asker_gone(frame.session, upstream):  # it went while they were made: its clean-up missed this one
            return
        self.table.add(SessionState(frame.session, request, sessions, upstream))
        log.info(
            "node=%s session=%016x opened (head %x, %d/%d sessions)",
            self.node,
            frame.session,
            request.head_id,
            len(self.table.sessions),
            self.table.capacity,
        )
        if self.successor is not None:
            try:
                await self.successor.wait_ready(HANDSHAKE_TIMEOUT)
            except TimeoutError as exc:
                raise _SessionFailure("peer_lost", f"{self.node}: the next stage is not connected") from exc
            except PeerUnavailableError as exc:  # the plan moved this agent's next stage meanwhile
                raise _SessionFailure("peer_lost", f"{self.node}: {exc}") from exc
            await self._forward(frame)

    def _asker_gone(self, session: int, upstream: FrameConnection | None) -> bool:
        """Whether the connection an OPEN came on has ended, and with it (``_accept``) the sessions it owned here:
        then the session is not opened (logged).

        Its frames may still wait in the queue behind another session's step (or be read from its buffer after a
        re-plan aborted it): a session such an OPEN opened now would be owned by a connection whose clean-up is
        done, and held here and on the next stages for good, as no close could come for it (issue 46)."""
        if upstream is None or not (upstream.closed or upstream not in self._connections):
            return False
        log.info(
            "node=%s session=%016x not opened: %s, which asked for it, is gone", self.node, session, upstream.label
        )
        return True

    async def _admit_step(self, work: _Work) -> _Running:
        """Check a step (its session, order, inputs and position) before it joins the steps to compute."""
        frame = work.frame
        state = self.table.get(frame.session)
        if state is None:
            raise _SessionFailure("unknown_session", f"session {frame.session:016x} is not open on {self.node}")
        if frame.step != state.next_step:
            raise _SessionFailure("bad_request", f"step {frame.step} arrived where {state.next_step} was expected")
        state.parked_at = None
        inputs = self._inputs(frame)
        if frame.rewind > state.logical_length or frame.position != state.logical_length - frame.rewind:
            raise _SessionFailure(
                "bad_request",
                f"step at position {frame.position} with rewind {frame.rewind} "
                f"does not follow the {state.logical_length} positions held",
            )
        if self.is_last:
            self._head_of(state.open)  # before computing an answer nobody could be given
        prompt = bool(frame.flags & (StepFlags.PART | StepFlags.LAST_ONLY))
        ready = ReadyStep(frame.session, state.open.head_id, frame.count, prompt, self._clock())
        return _Running(work, state, inputs, ready, frame.flags)

    async def _run_pack(self, pack: Pack) -> None:
        """Compute ``pack`` in one ``run_packed`` call on the worker thread, then send on each finished step's
        frame. A session dropped meanwhile (failed downstream, its stage moved) is skipped; a failure to deliver
        fails that session only; a failure of the computation fails the sessions of the pack (their KV states are
        unknown)."""
        batch = [(self._running[piece.session], piece) for piece in pack.slices]
        for running, _ in batch:
            if self.table.get(running.state.id) is not running.state:  # gone while it waited for its next chunk
                del self._running[running.state.id]
        batch = [(running, piece) for running, piece in batch if running.state.id in self._running]
        if not batch:
            return
        loop = asyncio.get_running_loop()
        started = self._clock()
        cut_before = sum(s.kv_cut_seconds for running, _ in batch for s in running.state.stages)
        try:
            frames = await loop.run_in_executor(self._executor, self._compute, batch)
        except Exception as exc:  # OpenVINO's, or a bug: the pack's sessions cannot go on, the others can
            log.exception("node=%s a pack of %d session(s) failed", self.node, len(batch))
            for running, _ in batch:
                del self._running[running.state.id]
                report = ErrorReport("stage_failed", f"{self.node}: the stage's inference failed: {exc}", self.node)
                await self._fail(running.state.id, running.work.upstream, report)
            return
        took = self._clock() - started
        self.compute_seconds += took
        self.kv_cut_seconds += sum(s.kv_cut_seconds for running, _ in batch for s in running.state.stages) - cut_before
        self.packs += 1
        self.packed_steps += len(batch)
        for (running, _), frame in zip(batch, frames, strict=True):
            running.seconds += took
            if frame is None:
                continue  # a prompt's chunk: the rest of it comes in a later pack
            del self._running[running.state.id]
            self.step_times.observe(running.seconds)
            if self.table.get(running.state.id) is not running.state:
                continue  # failed, evicted or moved while it was computed: its head has been told
            await self._guard(running.state.id, running.work.upstream, self._deliver(running, frame))

    async def _deliver(self, running: _Running, output: Frame | Exception) -> None:
        if isinstance(output, Exception):
            raise output
        self.steps_served += 1
        running.state.next_step += 1
        if self.is_last:
            head = self._head_of(running.state.open)
            await send_quietly(head, output)
        else:
            await self._forward(output)

    def _head_of(self, session: SessionOpen) -> FrameConnection:
        """The connection to a session's head (the last stage answers there), or a failure saying why not:
        it goes up the way the session came, which leads to the head, so the head fails at once."""
        head = self.heads.get(session.head_id)
        if head is None:
            raise _SessionFailure(
                "head_unreachable",
                f"{self.node} is the last stage, and head {session.head_id:x} has no connection to it: its "
                "answers cannot be delivered (does the head name this agent as the ring's last stage?)",
            )
        return head

    def _inputs(self, frame: Frame) -> np.ndarray:
        count, manifest = frame.count, self.manifest
        if manifest is None:
            raise _SessionFailure("bad_request", f"{self.node} serves no export yet")
        if count < 1:
            raise _SessionFailure("bad_request", "a step carries at least one position")
        try:
            array = frame.array()
        except ProtocolError as exc:
            raise _SessionFailure("bad_request", str(exc)) from exc
        if self.stages[0].graph.embeddings:
            if array.shape != (1, count) or array.dtype.kind != "i":
                raise _SessionFailure("bad_request", f"stage 0 takes [1, {count}] token ids, not {array.shape}")
            ids = array.astype(np.int64)
            vocab = manifest.arch.vocab_size
            outside = ids[(ids < 0) | (ids >= vocab)]
            if outside.size:  # refused here: the embedding's gather would read past its table, or give zeros
                raise _SessionFailure(
                    "bad_request",
                    f"token id {int(outside[0])} is outside the model's vocabulary of {vocab} tokens "
                    f"(ids 0-{vocab - 1}); the head must refuse such a prompt before sending it",
                )
            return ids
        hidden = manifest.arch.hidden_size
        if array.shape != (1, count, hidden) or array.dtype.kind != "f":
            raise _SessionFailure("bad_request", f"expected hidden states [1, {count}, {hidden}], got {array.shape}")
        return array.astype(np.float32)

    def _compute(self, batch: Sequence[tuple[_Running, Slice]]) -> list[Frame | Exception | None]:
        """Runs on the worker thread: the pack's inference, then each finished step's frame to send on (None for
        a prompt whose chunks go on; an exception where reading one session's output out failed)."""
        steps = [running.piece(slice_) for running, slice_ in batch]
        outputs = _run_packed(steps)
        # a step packed beside others is computed otherwise than alone where the stages say packing changes numbers
        beside = len(steps) > 1 and not packs_alike(self.stages)
        frames: list[Frame | Exception | None] = []
        for (running, slice_), x in zip(batch, outputs, strict=True):
            if isinstance(x, Exception):
                frames.append(x)
                continue
            if beside:
                running.flags |= StepFlags.UNREPEATABLE | StepFlags.UNSETTLED
            try:
                frames.append(self._output(running, slice_, x))
            except Exception as exc:  # one session's sampling, say: that session fails, the others go on
                frames.append(exc)
        return frames

    def _output(self, running: _Running, piece: Slice, x: np.ndarray) -> Frame | None:
        """What one step's slice computed: its flags, and once the step is done, the frame to send on."""
        frame = running.work.frame
        last_only = running.last_only
        rewind = frame.rewind if piece.start == 0 else 0
        if not step_is_repeatable(self.exact, piece.rows, rewind, last_only):
            running.flags |= StepFlags.UNREPEATABLE
        if not step_is_settled(self.alike, piece.rows, last_only):
            running.flags |= StepFlags.UNSETTLED
        running.ready = dataclasses.replace(running.ready, done=piece.start + piece.rows)
        if not self.is_last:  # every position's hidden states go on, of all the step's chunks
            running.hidden.append(np.array(x, dtype=self._wire_dtype))  # a copy: x may be reused
        if not piece.last:
            return None
        flags = running.flags
        if self.is_last:
            told = flags & (StepFlags.UNREPEATABLE | StepFlags.UNSETTLED)
            if frame.flags & StepFlags.PART:  # the prompt goes on in the next step: only its progress is told
                return Frame(FrameType.RESULT, session=frame.session, step=frame.step, flags=StepFlags.PART | told)
            output = read_out(x, running.state.open.sampling, last_only=last_only)
            return result_frame(output, frame.session, frame.step, told)
        hidden = running.hidden[0] if len(running.hidden) == 1 else np.concatenate(running.hidden, axis=1)
        fields: FrameFields = {
            "session": frame.session,
            "step": frame.step,
            "position": frame.position,
            "count": frame.count,
            "rewind": frame.rewind,
            "flags": flags,
        }
        return Frame.tensor(FrameType.STEP, hidden, **fields)

    async def _park(self, frame: Frame) -> None:
        """The session waits for its next turn: it may be evicted when a new session needs its place."""
        state = self.table.get(frame.session)
        if state is None:
            return  # closed or evicted meanwhile
        state.parked_at = self._clock()
        log.info("node=%s session=%016x parked at %d positions", self.node, frame.session, state.logical_length)
        await self._forward_quietly(frame)

    def _make_kv_room(self, pack: Pack) -> None:
        """Evict parked sessions whose KV blocks ``pack`` 's steps need (``make_kv_room``)."""
        # a prompt's whole rest counts, not the chunk: a parked session is never evicted for a prompt with no room
        running = self._running
        self.make_kv_room(running[p.session].piece(p.to_end(running[p.session].ready.count)) for p in pack.slices)

    def make_kv_room(self, steps: Iterable[PackedStep]) -> None:
        """Evict the sessions parked the longest ago whose KV blocks ``steps`` (about to run on this agent's
        stages, in order) need, for as many of the first steps as can then get them: a parked conversation never
        turns an active one away as "fleet busy". Also asked by the head's own chats (``LocalPacker``). ``steps``
        is read only where a session is parked (a generator then costs the packs nothing otherwise)."""
        parked = [s for s in self.table.sessions.values() if s.parked_at is not None]
        if not parked:
            return
        needs, free = block_needs(list(steps))
        holders = [Holder(s.id, s.parked_at or 0.0, held_blocks(s.stages)) for s in parked]
        for victim in evictions(needs, free, holders):
            state = self.table.evict(victim, "its KV blocks went to the steps of active sessions")
            for session in state.stages if state is not None else ():
                if isinstance(session, PooledSession):
                    session.release()  # its blocks go back before the next step, not when the session is collected

    def _evicted(self, state: SessionState, why: str) -> None:
        """The table dropped a parked session (``why``): tell its head, free it on the next stages."""
        parked = self._clock() - (state.parked_at or self._clock())
        log.info(
            "node=%s session=%016x evicted after %.1f s parked: %s (%d/%d sessions)",
            self.node,
            state.id,
            parked,
            why,
            len(self.table.sessions),
            self.table.capacity,
        )
        message = f"{self.node} evicted this session, parked for {parked:.0f} s: {why}"
        report = ErrorReport("evicted", message, self.node)

        async def notify() -> None:
            if state.upstream is not None:
                await send_quietly(state.upstream, report.to_frame(state.id))
            await self._forward_quietly(Frame(FrameType.CLOSE, session=state.id))

        self._spawn(notify())

    async def _close(self, session: int, forward: bool) -> None:
        state = self.table.pop(session)
        if state is not None:
            log.info(
                "node=%s session=%016x closed after %d steps (%d/%d sessions)",
                self.node,
                session,
                state.next_step,
                len(self.table.sessions),
                self.table.capacity,
            )
        if forward and self.successor is not None and (state is not None):
            await self._forward_quietly(Frame(FrameType.CLOSE, session=session))

    # -- failures ------------------------------------------------------------------------------
    async def _fail(self, session: int, upstream: FrameConnection | None, report: ErrorReport) -> None:
        """Give up one session: free it here and downstream, tell the way it came."""
        report = dataclasses.replace(report, node=report.node or self.node)
        log.warning("node=%s session=%016x failed: %s: %s", self.node, session, report.code, report.message)
        state = self.table.pop(session)
        target = state.upstream if state is not None else upstream
        if target is not None:
            await send_quietly(target, report.to_frame(session))
        if self.successor is not None:
            await self._forward_quietly(Frame(FrameType.CLOSE, session=session))

    async def _forward(self, frame: Frame) -> None:
        if self.successor is None:
            raise _SessionFailure("stage_failed", f"{self.node} is the last stage and has no next stage")
        try:
            await self.successor.send(frame)
        except PeerUnavailableError as exc:
            raise _SessionFailure("peer_lost", f"{self.node}: {exc}") from exc

    async def _forward_quietly(self, frame: Frame) -> None:
        if self.successor is not None and self.successor.connected:
            with contextlib.suppress(PeerUnavailableError):
                await self.successor.send(frame)

    async def _from_successor(self, frame: Frame) -> None:
        """An ERROR for a session coming back up: free it here and relay it towards the head."""
        if frame.type is not FrameType.ERROR:
            log.warning("node=%s ignored %s from the next stage", self.node, frame.type.name)
            return
        state = self.table.pop(frame.session)
        if state is not None and state.upstream is not None:
            await send_quietly(state.upstream, frame)

    async def _successor_lost(self, reason: str) -> None:
        """Every session that crossed the link is gone downstream: fail them all."""
        for session in list(self.table.sessions):
            state = self.table.pop(session)
            if state is not None and state.upstream is not None:
                report = ErrorReport("peer_lost", f"{self.node} lost the next stage: {reason}", self.node)
                await send_quietly(state.upstream, report.to_frame(session))

    def count_local_step(self, seconds: float) -> None:
        """Count a step of this agent's own chats that its stages computed in-process (on the event loop)."""
        self.local_steps += 1
        self.local_compute_seconds += seconds
        self.step_times.observe(seconds)

    @property
    def exact(self) -> bool | None:
        """Whether this agent's stages compute a step the same in any grouping of its positions
        (``agent.runtime.repeatable``; None: a device not measured)."""
        return stages_exact(self.stages)

    @property
    def alike(self) -> str:
        """What this agent's stages compute the same however positions are grouped into steps
        (``agent.runtime.repeatable``: ``all``, ``prompts`` or ``none``)."""
        return stages_alike(self.stages)

    # -- status --------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """What ``shoal status`` shows: held sessions, load, the link to the next stage."""
        return {
            "node": self.node,
            "export_id": self.manifest.export_id if self.manifest is not None else None,
            "layers": [self.hello.layer_start, self.hello.layer_stop],
            "stages": list(self.indices),
            "is_last": self.is_last,
            "device": self.stages[0].device if self.serves else None,
            "rewind": ("compact" if self.stages[0].compact_rewind else "mask") if self.serves else None,
            # whether speculative greedy decoding here equals plain decoding (null: not measured on this device)
            "exact_speculation": self.exact if self.serves else None,
            # what each stage decodes in (``auto``: f32 activations quantized on the fly; chosen by timing on this PC)
            "precision": [stage.decode_precision for stage in self.stages] if self.serves else None,
            # where each stage keeps its sessions' KV (``paged``: one shared pool, whose steps it packs)
            "kv": [kv_mode(stage) for stage in self.stages],
            "kv_blocks": [kv_blocks(stage) for stage in self.stages],
            "sessions": [f"{s:016x}" for s in self.table.sessions],
            "parked": self.table.parked(),
            "evicted": self.table.evicted,
            "local_chats": self.table.local,
            "max_sessions": self.table.capacity,
            "steps_served": self.steps_served,
            "compute_seconds": round(self.compute_seconds, 6),
            "local_steps": self.local_steps,
            "local_compute_seconds": round(self.local_compute_seconds, 6),
            "step_seconds": self.step_times.to_json(),
            "kv_cut_seconds": round(self.kv_cut_seconds, 6),
            "queued": self._queue.qsize() + len(self._pending),
            "packs": self.packs,
            "packed_steps": self.packed_steps,
            "next_stage": None if self.successor is None else ("connected" if self.successor.connected else "down"),
            "heads": len(self.heads),
            "uptime_s": round(self._clock() - self._started, 3),
            "memory_mb": resident_mb(),  # the whole agent process: its stages' weights, sessions and KV caches
            **{name: section() for name, section in self.status_sections.items()},
        }


class _SessionFailure(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.report = ErrorReport(code, message)


def _run_packed(steps: Sequence[PackedStep]) -> list[np.ndarray | Exception]:
    """``run_packed_or_each``, a step with no room even alone failing its session as a busy fleet."""
    return [_SessionFailure("busy", str(x)) if isinstance(x, FleetBusyError) else x for x in run_packed_or_each(steps)]


def _json(data: dict[str, Any]) -> bytes:
    import json

    return json.dumps(data, separators=(",", ":")).encode()
