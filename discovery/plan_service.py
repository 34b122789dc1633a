"""``FleetPlanService``: the daemon part that keeps the plan this agent follows, the same on every member.

How agents converge on one plan while their views of the fleet differ for a moment: **one coordinator
plans, everyone follows it.** The coordinator is the longest-running member (the smallest announced start
time, then the smallest node id: :func:`coordinator_of`), as each agent sees its members. It plans with
``discovery.placement.plan`` from its own view, whenever an input changes (the fleet document, the export's
stages, the members' announcements and states), and sends the plan to every member on the control channel
(``discovery.control.PlanOffer``), again every :data:`REPEAT` seconds for links that came up since. Every
other agent follows the plan of the member it takes for the coordinator, once it holds the same fleet
document and export; until then it keeps what it followed.

Why the longest-running member: a PC that joins never takes the coordinator's place, so a running fleet's
plan (and its hysteresis: ``previous``) is never replaced by the blank plan of a newcomer. When the
coordinator leaves, the next one plans on from the plan it followed. Two members that briefly see different
coordinators (a partition) each follow their own side's; once the views meet, they agree on one again
(``tests/lab/test_plan_lab.py`` checks this while members join and leave). A coordinator that was away (frozen,
cut off) and comes back never takes the fleet back to its older plan: a follower refuses a plan its own outranks
and sends its own back, and the coordinator plans on from it (:func:`supersedes`).

Which plan wins when two sides meet: plans rank by ``(quorum, epoch)``, not by epoch alone. A node cut off the
network still plans, for itself (its members seem lost), and its epochs grow as fast as the fleet's; but it saw
no majority of the fleet it knew (:func:`sees_quorum`), so its plan is marked without a quorum and the fleet's
plan, made with one, wins on reconnect, whatever the epochs (issue 46 §3: a cut-off pc2's epoch 3, stage 0
uncovered, had made the coordinator drop its own stage 0). A plan made on from a plan without a quorum has none
either until its coordinator has seen a quorum for :data:`SETTLE` seconds (:func:`planned_with_quorum`): a
coordinator back from a cut must first hear the fleet's plan (its followers send it back) rather than win with
the plans it made alone. In a fleet where no majority can be seen (two nodes, half the PCs lost for good) every
plan ranks without a quorum and the epoch decides, as before. A follower refuses a plan for want of a quorum
only while it sees one itself: on a side of the fleet where nobody does, a coordinator that adopted the
follower's plan and planned on from it without a quorum is followed, not refused in a loop.

Planning is a pure function of what this service gathers; it reads the clock only for :func:`forgive`
(a member on probation is forgiven after :data:`FORGIVE_AFTER` seconds as a steady member).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from agent.errors import RemoteProtocolError, RingNotReadyError, ShoalError
from agent.transport.tasks import OwnedTasks
from discovery import control
from discovery.announcement import Announcement, HeldStage
from discovery.fleet_document import FleetDocument, ModelSource
from discovery.membership import Membership, MemberState
from discovery.placement import Candidate, Plan, StageNeed, candidates, forgive, plan, stage_needs
from discovery.plan_codec import PlanRecord
from discovery.service import MembershipService
from shards.manifest import Manifest

log = logging.getLogger(__name__)

TICK = 0.25
"""Seconds between two looks at the plan's inputs."""
REPEAT = 2.0
"""Seconds between two sends of an unchanged plan (members whose link came up since get it)."""
FORGIVE_AFTER = 60.0
"""Seconds a member on probation for the first time must stay a steady member before it counts for the ring's
speed again; each later probation doubles it (:func:`forgive_after`), so that a PC whose user comes and goes,
or whose network flaps, holds standbys rather than stages."""
FORGIVE_MAX = 3600.0
"""The longest probation: a member steady for an hour is trusted again, whatever its history."""


def forgive_after(probations: int) -> float:
    """Seconds of steadiness that end a member's ``probations``-th probation (1, 2, ...): 60, 120, 240 ... 3600."""
    return min(FORGIVE_MAX, FORGIVE_AFTER * 2 ** min(max(probations, 1) - 1, 16))


MANIFEST_RETRY = 5.0
SETTLE = 10.0
"""Seconds a coordinator must see a quorum before the plans it makes on from a plan without one count as made
with a quorum: time for its followers to send back the fleet's plan (they do every :data:`REPEAT` seconds)."""


def sees_quorum(membership: Membership) -> bool:
    """Whether this agent sees a majority of the fleet it knows: itself and its members, against those and the
    members lost (unheard, or their link broke without a goodbye). Members gone (a goodbye), revoked, foreign or
    not verified do not count: a PC that left cleanly does not hold the quorum hostage."""
    seen = 1 + len(membership.in_state(MemberState.MEMBER))
    return 2 * seen > seen + len(membership.in_state(MemberState.LOST))


def planned_with_quorum(sees: bool, base: PlanRecord | None, seen_for: float) -> bool:
    """Whether a plan made now ranks as made with a quorum: its coordinator ``sees`` one, and it goes on from a
    plan that had one (or from none), or the coordinator has seen a quorum for :data:`SETTLE` seconds
    (``seen_for``) without a member sending back a better plan."""
    return sees and (base is None or base.quorum or seen_for >= SETTLE)


def rank(record: PlanRecord) -> tuple[bool, int]:
    """How a plan ranks against another of the same document and export: made with a quorum first, then epoch."""
    return record.quorum, record.plan.epoch


def supersedes(record: PlanRecord, other: PlanRecord | None) -> bool:
    """Whether ``record`` comes after ``other`` in the fleet's sequence of plans: made for the same fleet document
    and export, and ranking higher (:func:`rank`: a plan made with a quorum over one made without, then the higher
    epoch; epochs only grow: each plan goes on from the one in force).

    Why a follower and a coordinator both ask: a coordinator frozen for a while (SIGSTOP, a laptop lid) comes back
    with the plan it made before, while the next-oldest member planned on without it. Seniority makes it the
    coordinator again, but the fleet must never go back to an older plan than one it has applied: a follower
    refuses an offer its own plan supersedes and sends its plan back, and the coordinator adopts a plan sent to it
    that supersedes its own, then plans on from it."""
    return (
        other is not None
        and record.document == other.document
        and record.export == other.export
        and rank(record) > rank(other)
    )


def refuses(own: PlanRecord, offer: PlanRecord, sees: bool) -> bool:
    """Whether a follower holding ``own`` refuses its coordinator's ``offer`` (and sends ``own`` back): ``own``
    supersedes it, by a higher epoch, or by its quorum alone only if the follower ``sees`` a quorum now (else its
    side of the fleet has none to speak for)."""
    return supersedes(own, offer) and (sees or own.plan.epoch > offer.plan.epoch)


def coordinator_of(membership: Membership) -> str:
    """The node that plans: the longest-running of this agent and its members (smallest start time, then node
    id). Members lost, gone, foreign or revoked do not count."""
    running = [membership.me] + [m.announcement for m in membership.in_state(MemberState.MEMBER)]
    return min(running, key=lambda a: (a.started, a.node)).node


@dataclass(frozen=True)
class Route:
    """Where a head sends a chat's steps (stage 0) and where its answers come from (the last stage)."""

    first: tuple[str, int]
    last: tuple[str, int]
    nodes: tuple[str, ...]
    """The node of each stage, in order."""


class FleetPlanService:
    """Follows (or, as the coordinator, makes) the fleet's plan; a ``DaemonPart`` named ``plan``."""

    name = "plan"

    def __init__(
        self,
        membership: MembershipService,
        load_manifest: Callable[[ModelSource], Awaitable[Manifest]],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``load_manifest(model)``: the manifest of the model the fleet document names (a Hub download or a
        local export: the daemon's business)."""
        self.membership = membership
        self._load_manifest = load_manifest
        self._clock = clock
        self._tasks = OwnedTasks()
        self.model: ModelSource | None = None
        self.manifest: Manifest | None = None
        self.needs: tuple[StageNeed, ...] = ()
        self.record: PlanRecord | None = None
        """The plan this agent follows (None: none yet)."""
        self._offers: dict[str, PlanRecord] = {}
        """The last plan each member sent as its own (a coordinator's, as it sees the fleet)."""
        self._sent_back: dict[str, PlanRecord] = {}
        """The last plan each member sent back, newer than this agent's as its coordinator (:meth:`_send_back`)."""
        self._inputs: tuple[Any, ...] | None = None
        self._quorum_since: float | None = None
        """Since when this agent, as the coordinator, has seen a quorum while its plan had none (:data:`SETTLE`)."""
        self._sent_at = 0.0
        self._steady_since: dict[str, float] = {}
        self._probations: dict[str, int] = {}
        """How many times each member was put on probation, as this agent saw it plan (its history as a donor or
        on the network: the planner's memory, which a new coordinator starts afresh)."""
        self._on_probation: frozenset[str] = frozenset()
        self._manifest_error: str | None = None
        self.listeners: list[Callable[[], None]] = []
        """Called after the plan, the model or the manifest changed (``agent.node.ring_former``)."""
        self.changed = asyncio.Event()

    @property
    def roles(self) -> dict[str, Any]:
        return {}

    @property
    def me(self) -> str:
        return self.membership.me.node

    @property
    def document(self) -> FleetDocument | None:
        return self.membership.fleet.current if self.membership.fleet is not None else None

    @property
    def plan(self) -> Plan | None:
        return self.record.plan if self.record is not None else None

    # -- life cycle ----------------------------------------------------------------------------
    async def start(self, ring: tuple[str, int]) -> None:
        self.membership.on_plan = self._offered
        self._tasks.spawn(self._run())

    async def stop(self) -> None:
        self.membership.on_plan = None
        await self._tasks.cancel_all()

    async def _run(self) -> None:
        failure: str | None = None
        while True:
            try:
                with contextlib.suppress(ShoalError):
                    await self._model_step()
                self._plan_step()
                failure = None
            except Exception as exc:  # the plan must outlive what it did not expect: logged once, tried next tick
                if repr(exc) != failure:
                    log.exception("node=%s the plan's step failed (trying again every %.1f s)", self.me, TICK)
                failure = repr(exc)
            await asyncio.sleep(TICK)

    # -- the model -----------------------------------------------------------------------------
    async def _model_step(self) -> None:
        document = self.document
        model = document.model if document is not None else None
        if model == self.model and (self.manifest is not None or model is None):
            return
        if model != self.model:
            self.model, self.manifest, self.needs, self._manifest_error = model, None, (), None
            self._notify()
        if model is None:
            return
        try:
            manifest = await self._load_manifest(model)
        except ShoalError as exc:
            if str(exc) != self._manifest_error:
                log.warning("node=%s cannot read the manifest of %s: %s (retrying)", self.me, model, exc)
            self._manifest_error = str(exc)
            await asyncio.sleep(MANIFEST_RETRY)
            raise
        if model != self.model:  # the document changed while the manifest came
            return
        self.manifest, self.needs, self._manifest_error = manifest, stage_needs(manifest), None
        log.info(
            "node=%s the fleet serves %s: export %s, %d stages",
            self.me,
            model,
            manifest.export_id,
            len(manifest.stages),
        )
        self._notify()

    # -- the plan ------------------------------------------------------------------------------
    def _plan_step(self) -> None:
        document, manifest = self.document, self.manifest
        if document is None or manifest is None:
            return
        state = self.membership.state
        coordinator = coordinator_of(state)
        if coordinator == self.me:
            self._adopt_newer(document, manifest)
            self._coordinate(document, manifest, candidates(state), self._revoked(), sees_quorum(state))
            return
        offer = self._offers.get(coordinator)
        if offer is None or offer.document != document.version or offer.export != manifest.export_id:
            return
        record = self.record
        if record is not None and refuses(record, offer, sees_quorum(state)):
            self._send_back(record, coordinator)
            return
        if record is None or offer.plan.hash != record.plan.hash or offer.coordinator != record.coordinator:
            self._follow(offer, f"coordinator {self._names().get(coordinator, coordinator)}")
        elif offer != record:  # the same placement, at another epoch or now with a quorum
            self.record = offer

    def _send_back(self, record: PlanRecord, coordinator: str) -> None:
        """Sends the plan this agent follows, newer than the coordinator's, for the coordinator to adopt (again
        every :data:`REPEAT` seconds, until it offers a plan at least as new)."""
        now = self._clock()
        if now - self._sent_at < REPEAT:
            return
        self._sent_at = now
        log.warning(
            "node=%s refused plan epoch %d from coordinator %s: this agent follows epoch %d; sent it back",
            self.me,
            self._offers[coordinator].plan.epoch,
            self._names().get(coordinator, coordinator),
            record.plan.epoch,
        )
        self.membership.broadcast(control.PlanOffer(record.to_json(), sent_back=True))

    def _adopt_newer(self, document: FleetDocument, manifest: Manifest) -> None:
        """As the coordinator, follows the best plan a member sent back if it supersedes this agent's own (this
        agent was away while another planned on, or cut off, planning alone): :meth:`_coordinate` then plans on
        from it. Also at the same rank: back from a freeze, this agent may have planned once from its view of the
        moment (its members seemed lost), reaching the epoch of the plan the fleet applied meanwhile; the fleet's
        plan wins. The plan sent back may be one this agent made itself before a cut: the fleet kept it.

        Each plan sent back is weighed once (members send theirs again every :data:`REPEAT` seconds while they
        disagree): an old one kept would outrank this agent's next plan made without a quorum."""
        record = self.record
        sent = [
            o for o in self._sent_back.values() if o.document == document.version and o.export == manifest.export_id
        ]
        self._sent_back.clear()
        newest = max(sent, key=rank, default=None)
        if newest is None or record is None:
            return
        tied = rank(newest) == rank(record) and newest.plan.hash != record.plan.hash
        if supersedes(newest, record) or (
            tied and newest.document == record.document and newest.export == record.export
        ):
            planner = self._names().get(newest.coordinator, newest.coordinator)
            self._follow(
                newest, f"{planner}'s plan, sent back by a member: the fleet applied it while this agent was away"
            )

    def _revoked(self) -> dict[str, str]:
        """Node id -> name of every node the fleet's revocation list names, whether this agent ever knew it as a
        member or not (a coordinator that restarted since the revocation never did): a required pin on one is
        void."""
        keeper = self.membership.revocations
        revocations = keeper.current if keeper is not None else None
        return {r.node_id: r.name for r in revocations.revoked} if revocations is not None else {}

    def _coordinate(
        self,
        document: FleetDocument,
        manifest: Manifest,
        members: tuple[Candidate, ...],
        revoked: dict[str, str],
        sees: bool,
    ) -> None:
        """Plans (when an input changed) and offers the plan; ``sees``: this agent sees a quorum
        (:func:`sees_quorum`)."""
        base = self.record if self.record is not None and self.record.export == manifest.export_id else None
        previous = self._forgiven(base.plan, members) if base is not None else None
        probation = previous.probation if previous else None
        now = self._clock()
        if not sees or base is None or base.quorum:
            self._quorum_since = None
        elif self._quorum_since is None:
            self._quorum_since = now
        seen_for = 0.0 if self._quorum_since is None else now - self._quorum_since
        quorum = planned_with_quorum(sees, base, seen_for)
        inputs = (document.version, manifest.export_id, members, probation, tuple(sorted(revoked.items())), quorum)
        if inputs != self._inputs or self.record is None or self.record.coordinator != self.me:
            self._inputs = inputs
            new = plan(document, self.needs, members, previous, revoked)
            record = PlanRecord(new, self.me, document.version, manifest.export_id, quorum)
            if self.record is None or record.plan.hash != self.record.plan.hash or self.record.coordinator != self.me:
                self._follow(record, "this agent (the coordinator)")
                self._sent_at = 0.0
            else:
                self.record = record
        if now - self._sent_at >= REPEAT and self.record is not None:
            self._sent_at = now
            self.membership.broadcast(control.PlanOffer(self.record.to_json()))

    def _forgiven(self, previous: Plan, members: tuple[Candidate, ...]) -> Plan:
        """``previous`` with the members forgiven that have been steady for :data:`FORGIVE_AFTER` seconds."""
        now = self._clock()
        for node in previous.probation - self._on_probation:
            self._probations[node] = self._probations.get(node, 0) + 1
        self._on_probation = previous.probation
        steady = {c.node for c in members if c.assignable}
        self._steady_since = {n: self._steady_since.get(n, now) for n in previous.probation if n in steady}
        done = [
            n for n, since in self._steady_since.items() if now - since >= forgive_after(self._probations.get(n, 1))
        ]
        return forgive(previous, done) if done else previous

    def _follow(self, record: PlanRecord, source: str) -> None:
        names = self._names()
        placed = ", ".join(
            f"{a.stage}:{names.get(a.node, a.node) if a.node else 'uncovered'}" for a in record.plan.assignments
        )
        log.info(
            "node=%s plan %s epoch %d (document %d%s) from %s: %s",
            self.me,
            record.plan.hash[:12],
            record.plan.epoch,
            record.document,
            "" if record.quorum else ", without a quorum",
            source,
            placed,
        )
        for outcome in record.plan.pins:
            if not outcome.honoured:
                log.warning(
                    "node=%s pin of %s on stage %d not honoured: %s",
                    self.me,
                    outcome.pin.node,
                    outcome.pin.stage,
                    outcome.reason,
                )
        self.record = record
        self._notify()

    def _offered(self, sender: str, data: dict[str, Any], sent_back: bool = False) -> None:
        try:
            record = PlanRecord.from_json(data)
        except RemoteProtocolError as exc:
            log.warning("node=%s ignored a plan from %s: %s", self.me, sender, exc)
            return
        if sent_back:  # a follower's plan, newer than this agent's as its coordinator: whoever planned it
            self._sent_back[sender] = record
            return
        if record.coordinator != sender:
            log.warning("node=%s ignored a plan from %s naming %s its coordinator", self.me, sender, record.coordinator)
            return
        self._offers[sender] = record

    def _notify(self) -> None:
        self.changed.set()
        for listener in self.listeners:
            listener()

    # -- what the rest of the agent asks -------------------------------------------------------
    def _names(self) -> dict[str, str]:
        state = self.membership.state
        names = {node: m.announcement.name for node, m in state.members.items()}
        names[state.me.node] = state.me.name
        return names

    def _announcement(self, node: str) -> Announcement | None:
        state = self.membership.state
        return state.me if node == state.me.node else (m.announcement if (m := state.get(node)) else None)

    def held(self, node: str, stage: int) -> HeldStage | None:
        """What ``node`` announces of ``stage`` (downloading and how far, compiling, ready, standby)."""
        announcement = self._announcement(node)
        if announcement is None:
            return None
        return next((s for s in announcement.stages if s.index == stage), None)

    def problem_of(self, node: str) -> str:
        """Why ``node`` says its stage is stuck (its last failure), empty if it says nothing of the kind."""
        announcement = self._announcement(node)
        return announcement.problem if announcement is not None else ""

    def held_state(self, node: str, stage: int) -> str | None:
        """The state ``node`` announces of ``stage``, None: nothing."""
        held = self.held(node, stage)
        return None if held is None else held.state

    def _held_view(self, node: str | None, stage: int) -> dict[str, Any]:
        held = None if node is None else self.held(node, stage)
        return {
            "state": held.state if held else ("uncovered" if node is None else None),
            "progress": held.percent if held else None,
        }

    def _layers(self, stage: int, export: str) -> list[int] | None:
        """The decoder layers ``[start, stop)`` of ``stage`` in the export the plan was made for (None: that
        export's manifest is not the one at hand), so a client draws each stage's span over the whole model."""
        manifest = self.manifest
        if manifest is None or manifest.export_id != export or not 0 <= stage < len(manifest.stages):
            return None
        graph = manifest.stages[stage]
        return [graph.layer_start, graph.layer_stop]

    def route(self) -> Route:
        """Where a chat goes through the plan's ring; :class:`RingNotReadyError` saying why it cannot yet."""
        record = self.record
        if self.model is None:
            raise RingNotReadyError("the fleet serves no model yet (the admin runs `shoal fleet serve`)")
        if self.manifest is None or record is None:
            raise RingNotReadyError(f"the fleet serves {self.model}; this agent has no plan for it yet")
        names = self._names()
        nodes = []
        for a in record.plan.assignments:
            if a.node is None:
                raise RingNotReadyError(f"stage {a.stage} is uncovered: {a.reason}")
            held = self.held(a.node, a.stage)
            if held is None or held.state != "ready":
                state = held.describe() if held is not None else "not started"
                problem = self.problem_of(a.node)
                raise RingNotReadyError(
                    f"stage {a.stage} on {names.get(a.node, a.node)} is {state}"
                    + (f"; its last try failed: {problem}" if problem else "")
                )
            nodes.append(a.node)
        first, last = self.membership.address_of(nodes[0]), self.membership.address_of(nodes[-1])
        if first is None or last is None:
            raise RingNotReadyError("the plan names a member whose address this agent does not know")
        return Route(_reachable(first), _reachable(last), tuple(nodes))

    def status(self) -> dict[str, Any]:
        """The ``plan`` section of the agent's status. Besides the plan: ``layers``, the model's decoder layers,
        each stage's ``layers`` ``[start, stop)`` and ``context_tokens``, the export's context (null until the
        export's manifest is read)."""
        record, names = self.record, self._names()
        document = self.document
        base: dict[str, Any] = {
            "document": document.version if document is not None else 0,
            "model": str(self.model) if self.model is not None else None,
            "export": self.manifest.export_id if self.manifest is not None else None,
            "context_tokens": self.manifest.context_tokens if self.manifest is not None else None,
            "manifest_error": self._manifest_error,
            "coordinator": names.get(coordinator_of(self.membership.state)),
        }
        if record is None:
            return {**base, "hash": None, "stages": [], "pins": []}
        try:
            self.route()
            ready, waiting = True, None
        except RingNotReadyError as exc:
            ready, waiting = False, str(exc)
        return {
            **base,
            "hash": record.plan.hash,
            "epoch": record.plan.epoch,
            "planned_by": names.get(record.coordinator, record.coordinator),
            "planned_for": record.document,
            "complete": record.plan.complete,
            "ready": ready,
            "waiting": waiting,
            "bottleneck": round(record.plan.bottleneck, 3),
            "layers": self.manifest.arch.num_layers if self.manifest is not None else None,
            "stages": [
                {
                    "stage": a.stage,
                    "node": a.node,
                    "name": names.get(a.node) if a.node else None,
                    "layers": self._layers(a.stage, record.export),
                    **self._held_view(a.node, a.stage),
                    "standbys": [{"node": n, "name": names.get(n), **self._held_view(n, a.stage)} for n in a.standbys],
                    "reason": a.reason,
                }
                for a in record.plan.assignments
            ],
            "pins": record.to_json()["pins"],
        }


def _reachable(address: tuple[str, int]) -> tuple[str, int]:
    """An address a peer can dial: an agent listening on every interface is reached on loopback from itself."""
    host, port = address
    return ("127.0.0.1" if host in ("0.0.0.0", "") else host, port)
