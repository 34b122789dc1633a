"""``RingFormer``: the daemon part that makes this agent do what the fleet plan asks of it.

The plan (``discovery.plan_service``) says, for every stage, which node serves it and which stand by. This
part turns that into work on this PC, one step at a time, always towards the plan in force:

- serving stage *s*: fetch the stage's files (``agent.node.shard_source``: only that stage), check them,
  compile them, then serve them on the agent's port, linked to the node of stage *s* + 1;
- standing by for stage *s*: the same fetch and compile, so that taking the stage over costs no download,
  but no serving;
- neither: drop what it held;
- heading chats: fetch the tokenizer and the draft model, and hand them to the chat service.

Each step is announced (``downloading``, ``compiling``, ``ready``, ``standby``), so that every member's plan
status shows it, and a head sends its chats only once every stage of the plan is ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agent.errors import ShoalError
from agent.node.config import AgentConfig, stage_runtime
from agent.node.server import StageServer
from agent.node.shard_source import ShardSource
from agent.runtime.protocol import Stage
from agent.transport.tasks import OwnedTasks
from discovery.announcement import HeldStage, problem_text
from discovery.fleet_document import ModelSource
from discovery.placement import Plan
from discovery.plan_service import FleetPlanService
from discovery.service import MembershipService
from shards.manifest import Manifest

log = logging.getLogger(__name__)

RETRY = 2.0
"""Seconds before trying again a step that must wait (a next stage not known yet), and before the first retry of a
step that failed (a download cut off, a file that fails its check)."""
RETRY_MAX = 60.0
"""A step that keeps failing is tried again after 2, 4, 8 ... seconds, never more than this apart."""
PROGRESS_STEP = 10
"""A download's progress is announced to the fleet each time it passes a multiple of this many percent."""


class ChatHead(Protocol):
    """The agent's chats (``agent.chat.service.ChatService``), as far as the plan concerns them."""

    async def use_export(self, export_dir: Path, manifest: Manifest) -> None: ...


@dataclass(frozen=True)
class Duty:
    """What the plan asks of this agent: serve ``stage`` (``serve``) or stand by for it."""

    stage: int
    serve: bool


def retry_delay(tries: int) -> float:
    """Seconds before the next pass after ``tries`` failed passes in a row: 2, 4, 8, ... up to ``RETRY_MAX``."""
    return min(RETRY_MAX, RETRY * 2 ** min(max(tries, 1) - 1, 16))


def duty_of(plan: Plan, node: str) -> Duty | None:
    """What ``plan`` asks of ``node`` (None: nothing)."""
    stage = plan.stage_of(node)
    if stage is not None:
        return Duty(stage, True)
    standing = next((a.stage for a in plan.assignments if node in a.standbys), None)
    return Duty(standing, False) if standing is not None else None


@dataclass(frozen=True)
class _Held:
    export: str
    index: int
    stage: Stage


class _NotYet(ShoalError):
    """A step that must wait (told in the status, retried)."""


class RingFormer:
    """Applies the fleet plan to this agent; a ``DaemonPart`` named ``ring``."""

    name = "ring"

    def __init__(
        self,
        config: AgentConfig,
        plan: FleetPlanService,
        membership: MembershipService,
        server: StageServer,
        source: ShardSource,
        chats: ChatHead | None = None,
        *,
        compile_stage: Callable[[Path, Manifest, int], Stage] | None = None,
    ) -> None:
        """``compile_stage(folder, manifest, index)``: compiles one stage (blocking; default: OpenVINO's
        ``CompiledStage`` with the agent's runtime settings)."""
        self.config = config
        self.plan = plan
        self.membership = membership
        self.server = server
        self.source = source
        self.chats = chats
        self._compile = compile_stage or self._compile_stage
        self._tasks = OwnedTasks()
        self._held: _Held | None = None
        self._cache_seen: tuple[str, tuple[int, ...]] | None = None
        """(export, stages) the shard cache was found holding (looked at once per export: a fetch adds to it)."""
        self._head_export: str | None = None
        self._serving: tuple[str, int, tuple[str, int] | None] | None = None
        """(export, stage, next address) the server serves now."""
        self.activity = "waiting for the fleet document"
        self.progress: dict[str, Any] | None = None
        """The download in progress: ``{"stage", "done", "total"}`` bytes (for the status and the TUI)."""
        self.error: str | None = None
        """Why the last pass did not finish (a failure, or what it waits for)."""
        self.tries = 0
        """Passes that failed in a row (what the plan waits for does not count)."""

    @property
    def roles(self) -> dict[str, Any]:
        return {}

    async def start(self, ring: tuple[str, int]) -> None:
        self._tasks.spawn(self._run())

    async def stop(self) -> None:
        await self._tasks.cancel_all()

    # -- the loop ------------------------------------------------------------------------------
    async def _run(self) -> None:
        changed = self.plan.changed
        while True:
            changed.clear()
            try:
                await self._converge()
            except _NotYet as exc:
                self._waiting(exc)
                await self._tell_problem("")
                await self._pause(changed, RETRY)
            except Exception as exc:  # a long-lived loop must outlive what it did not expect: try again later
                delay = self._failed(exc)
                await self._tell_problem(f"{self.error} (try {self.tries})")
                await self._pause(changed, delay)
            else:
                self.error, self.tries = None, 0
                await self._tell_problem("")
                await changed.wait()

    def _waiting(self, exc: _NotYet) -> None:
        if str(exc) != self.error:
            log.info("node=%s %s", self.server.node, exc)
        self.error, self.tries = str(exc), 0

    def _failed(self, exc: Exception) -> float:
        """Note a failed pass (logged once while it repeats; with its traceback if it is not one of shoal's own
        errors) and return the seconds to wait before the next."""
        self.tries += 1
        message = str(exc) if isinstance(exc, ShoalError) else f"{type(exc).__name__}: {exc}"
        delay = retry_delay(self.tries)
        if message != self.error:
            log.warning(
                "node=%s %s (try %d; next in %.0f s)",
                self.server.node,
                message,
                self.tries,
                delay,
                exc_info=None if isinstance(exc, ShoalError) else exc,
            )
        else:
            log.debug("node=%s %s (try %d; next in %.0f s)", self.server.node, message, self.tries, delay)
        self.error = message
        return delay

    @staticmethod
    async def _pause(changed: asyncio.Event, seconds: float) -> None:
        """Wait ``seconds``, or less if the plan changes meanwhile (then its pass is due now)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), seconds)

    async def _converge(self) -> None:
        """One pass towards the plan in force (a plan that changes meanwhile gets the next pass)."""
        model, manifest, record = self.plan.model, self.plan.manifest, self.plan.record
        if model is None or manifest is None:
            self.activity = "waiting for the fleet document" if model is None else f"reading the manifest of {model}"
            await self._unserve(None)
            return
        if self.chats is not None and self._head_export != manifest.export_id:
            self.activity = "fetching the tokenizer and draft model"
            folder = await self._fetch(model, (), head=True)
            await self.chats.use_export(folder, manifest)
            self._head_export = manifest.export_id
        duty = None if record is None else duty_of(record.plan, self.plan.me)
        if duty is None:
            # say which stages this agent's cache holds: the plan gives them to it before anyone downloads
            cached = await self._cached(model, manifest)
            await self._announce(tuple(HeldStage(i, "cached") for i in cached))
        if record is None:
            self.activity = "waiting for the plan"
            return
        if duty is None:
            self.activity = "serving no stage (the plan needs no more PCs)"
            await self._unserve(manifest)
            self._held = None
            return
        stage = await self._hold(model, manifest, duty.stage)
        if not duty.serve:
            await self._unserve(manifest)
            self.activity = f"standing by for stage {duty.stage}"
            await self._announce((HeldStage(duty.stage, "standby"),))
            return
        next_address = self._next_address(record.plan, duty.stage)
        wanted = (manifest.export_id, duty.stage, next_address)
        if self._serving != wanted:
            await self.server.serve(manifest, [stage], [duty.stage], next_address)
            self._serving = wanted
        self.activity = f"serving stage {duty.stage}"
        await self._announce((HeldStage(duty.stage, "ready"),))

    async def _cached(self, model: ModelSource, manifest: Manifest) -> tuple[int, ...]:
        if self._cache_seen is None or self._cache_seen[0] != manifest.export_id:
            loop = asyncio.get_running_loop()
            found = await loop.run_in_executor(None, self.source.cached_stages, model, manifest)
            self._cache_seen = (manifest.export_id, found)
        return self._cache_seen[1]

    async def _hold(self, model: ModelSource, manifest: Manifest, index: int) -> Stage:
        """Stage ``index`` of ``manifest``, compiled (fetched first if it is not held already)."""
        held = self._held
        if held is not None and held.export == manifest.export_id and held.index == index:
            return held.stage
        if self._serving is not None and self._serving[1] != index:
            await self._unserve(manifest)
        self._held = None  # free the old stage's memory before the new one loads
        await self._announce((HeldStage(index, "downloading"),))
        self.activity = f"fetching stage {index}"
        folder = await self._fetch(model, (index,), head=False)
        if self._cache_seen is not None and self._cache_seen[0] == manifest.export_id:
            self._cache_seen = (manifest.export_id, tuple(sorted({*self._cache_seen[1], index})))
        await self._announce((HeldStage(index, "compiling"),))
        self.activity = f"compiling stage {index}"
        loop = asyncio.get_running_loop()
        stage = await loop.run_in_executor(None, self._compile, folder, manifest, index)
        self._held = _Held(manifest.export_id, index, stage)
        log.info("node=%s stage %d of export %s fetched and compiled", self.server.node, index, manifest.export_id)
        return stage

    async def _fetch(self, model: ModelSource, stages: tuple[int, ...], *, head: bool) -> Path:
        loop = asyncio.get_running_loop()
        label = "head files" if head else f"stage {stages[0]}"

        announced = [-1]

        def progress(done: int, total: int) -> None:  # called on the download's thread
            self.progress = {"what": label, "done": done, "total": total}
            percent = min(100, done * 100 // total) if total > 0 else 0
            if not head and percent // PROGRESS_STEP != announced[0] // PROGRESS_STEP:
                announced[0] = percent
                asyncio.run_coroutine_threadsafe(self._announce_download(stages[0], percent), loop)

        try:
            return await loop.run_in_executor(None, lambda: self.source.fetch(model, stages, head, progress))
        finally:
            self.progress = None

    async def _announce_download(self, index: int, percent: int) -> None:
        # a report that arrives late must not undo the step after the download (compiling, ready)
        now = self.membership.me.stages
        downloading = len(now) == 1 and now[0].index == index and now[0].state == "downloading"
        if downloading and (now[0].percent is None or now[0].percent < percent):
            await self._announce((HeldStage(index, "downloading", percent),))

    def _compile_stage(self, folder: Path, manifest: Manifest, index: int) -> Stage:
        from agent.runtime.stage import CompiledStage

        runtime = stage_runtime(self.config, manifest, [index], self.membership.me.memory_mb)
        return CompiledStage(folder, manifest.stages[index], manifest.weights, runtime)

    def _next_address(self, plan: Plan, stage: int) -> tuple[str, int] | None:
        if stage == len(plan.assignments) - 1:
            return None
        node = plan.node_of(stage + 1)
        if node is None:
            raise _NotYet(f"stage {stage + 1} is uncovered: stage {stage} waits for a node to pass its work to")
        address = self.membership.address_of(node)
        if address is None:
            raise _NotYet(f"the address of {node} (stage {stage + 1}) is not known yet")
        host, port = address
        return ("127.0.0.1" if host in ("0.0.0.0", "") else host, port)

    async def _unserve(self, manifest: Manifest | None) -> None:
        if self._serving is not None:
            await self.server.serve(manifest, [], [], None)
            self._serving = None

    async def _tell_problem(self, message: str) -> None:
        """Announce why this agent's stage is stuck (empty: it is not), so that a head waiting for the stage
        says why instead of "downloading 0 %" (a failure to announce is not one more failure of the pass)."""
        problem = problem_text(message)
        if self.membership.me.problem != problem:
            try:
                await self.membership.announce(problem=problem)
            except Exception as exc:  # the loop this serves must not die of it: the next pass says it again
                log.debug("node=%s could not announce its stage's problem: %s", self.server.node, exc)

    async def _announce(self, stages: tuple[HeldStage, ...]) -> None:
        if self.membership.me.stages != stages:
            await self.membership.announce(stages=stages)

    def holds_stage(self) -> bool:
        """Whether this agent serves a stage or holds one compiled (standing by): a donor's drain waits for neither."""
        return self._serving is not None or self._held is not None

    def status(self) -> dict[str, Any]:
        """The ``ring`` section of the agent's status: what this agent does for the plan."""
        held = self._held
        return {
            "activity": self.activity,
            "held": None if held is None else {"export": held.export, "stage": held.index},
            "serving": None if self._serving is None else self._serving[1],
            "download": self.progress,
            "error": self.error,
            "tries": self.tries,
        }
