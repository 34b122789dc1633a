"""``DonorWatch``: the donor policy applied on this PC; a ``DaemonPart`` named ``donor``.

Once a second it reads the PC (``sense``: the idle source, battery, other programs' load, free memory; blocking
calls, so off the event loop), adds whether this agent still holds a stage (``holds_stage``: a drain is over
when it holds none), asks ``agent.donor.policy.decide`` what to do, and announces a new state to the fleet. The
rest follows from the announcement, through parts that exist already:

- the plan gives a stage or a standby only to a ``serving`` PC (``discovery.placement``), so a PC that announces
  ``draining`` sees its stage move to a standby or another member on the next plan, every member alike;
- the ring former (``agent.node.ring_former``) then stops serving the stage and frees its compiled model and KV
  states (the shard and compile caches stay on disk: coming back costs a compile from the cache);
- the sessions that were running on it continue on the stage's new holder: their heads replay them, as for a
  stage that was lost, with the same tokens on one-thread stages;
- the PC's own chats are untouched: it still heads its user's conversations.

A decision the policy reaches is logged once, as one line with the reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from agent.donor.policy import Decision, DonorSettings, DonorState, Readings, decide
from agent.transport.tasks import OwnedTasks
from discovery.service import MembershipService

log = logging.getLogger(__name__)

POLL = 1.0
"""Seconds between two readings of the PC: a user's return is seen within this, and stepping aside begins."""


class DonorWatch:
    """Reads the PC, decides with the donor policy, and announces the donor state."""

    name = "donor"

    def __init__(
        self,
        settings: DonorSettings,
        sense: Callable[[], Readings],
        membership: MembershipService,
        holds_stage: Callable[[], bool],
        *,
        poll: float = POLL,
        source: Callable[[], str | None] = lambda: None,
    ) -> None:
        """``sense``: this PC's readings now (blocking); ``holds_stage``: whether the agent still serves or holds a
        stage (its drain is over when not); ``source``: the idle source's name, for the status."""
        self.settings = settings
        self.sense = sense
        self.membership = membership
        self.holds_stage = holds_stage
        self.poll = poll
        self.source = source
        self.decision: Decision | None = None
        self.readings: Readings | None = None
        self.changes = 0
        """Decisions that changed the state (each was announced)."""
        self._failure: str | None = None
        self._tasks = OwnedTasks()

    @property
    def roles(self) -> Mapping[str, Any]:
        return {}

    async def start(self, ring: tuple[str, int]) -> None:
        await self.step()  # the first state is announced before the plan can give this PC a stage
        self._tasks.spawn(self._run())

    async def stop(self) -> None:
        await self._tasks.cancel_all()

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.poll)
            try:
                await self.step()
                self._failure = None
            except Exception as exc:  # the watch must outlive a source that fails in a way nobody foresaw
                if repr(exc) != self._failure:
                    log.exception("node=%s the donor watch's step failed (trying again each second)", self._node)
                self._failure = repr(exc)

    async def step(self) -> Decision:
        """Read the PC once, decide, and announce a change."""
        readings = await asyncio.get_running_loop().run_in_executor(None, self.sense)
        readings = dataclasses.replace(readings, drained=not self.holds_stage())
        decision = decide(readings, self.settings, self.decision)
        before = self.decision.state if self.decision is not None else None
        self.readings, self.decision = readings, decision
        if decision.state is not before or str(decision.state) != self.membership.me.donor:
            self.changes += 1
            log.info("node=%s donor: %s: %s", self._node, decision.state, decision.reason)
            await self.membership.announce(donor=str(decision.state))
        return decision

    @property
    def _node(self) -> str:
        return self.membership.me.name

    def status(self) -> dict[str, Any]:
        """The ``donor`` section of the agent's status: the state, why, since when, and the idle reading."""
        decision, readings = self.decision, self.readings
        if decision is None or readings is None:
            return {"state": None}
        return {
            "state": str(decision.state),
            "reason": decision.reason,
            "for_seconds": round(readings.now - decision.since, 1),
            "idle_source": self.source(),
            "idle_seconds": None if readings.idle_seconds is None else round(readings.idle_seconds, 1),
            "idle_problem": readings.idle_problem,
            "serving": decision.state is DonorState.SERVING,
        }
