"""Placement as a pure function: which member serves which stage of the ring, and which ones stand by.

``plan(document, stages, members, previous) -> Plan`` reads the admin's pins and standby policy (the fleet
document, ``discovery.fleet_document``), what each stage needs (:func:`stage_needs`), what each member offers
(:func:`candidates`) and the plan in force, and returns the next plan. It reads no clock and does no I/O: the
same inputs give the same plan and the same :attr:`Plan.hash` in any process, whatever the order of
``members``. The daemon applies the plan.

The rules, in the order they win:

1. **Pins.** A required pin puts its stage on its node or nowhere (uncovered, with why); a preferred pin is
   honoured when its node can hold the stage and is otherwise left to the rules below. A required pin whose
   node is revoked is void: that node never serves again, so its stage is placed by the rules below, and the
   stage's reason says so. That holds whether or not the planner ever knew the node as a member (it may have
   restarted since the revocation): the fleet's revocation list names it (``revoked``). Every pin that is not
   honoured is reported with its reason.
2. **Coverage.** As many stages as possible get a node (a maximum bipartite matching, so that one big stage
   never goes uncovered because a smaller one took the only PC that could hold it). A node serves at most one
   stage (an office PC gives one shard), and only a member (state ``member``, or this agent) with the memory
   a stage needs can serve it.
3. **The ring's speed.** A token passes every stage in turn, so the slowest stage sets the ring's pace: the
   best placement minimises the largest ``cost / speed`` over the stages (:attr:`Plan.bottleneck`). It is
   found exactly, by a threshold search over matchings (the bottleneck assignment problem), not by a greedy.
   A member that has not measured its speed yet counts as the slowest measured one.
4. **The cost of moving.** Moving a stage costs a download and a compile, and the ring waits meanwhile. So any
   placement whose bottleneck is within :data:`MOVE_MARGIN` of the best will do, and among those a stage
   stays where it runs; else it goes to a steady member that holds its files (its named standby first); else
   to its named standby; else to a member that holds its files; else to the fastest free member (members on
   probation last; ties by node id). A stage given to a member that does not hold its files yet goes straight
   to one that does, once one is free, a steady one first (a fleet restarted with its caches: the first plan
   may come before the members have said which stages they hold; or a holder that was lost comes back with its
   files while its stage's new node still downloads them, perhaps from a mirror that is down). A running
   stage moves for speed only when the ring would be more than 20 % faster without it there *and* a member
   holding its files can take it: a faster member that joins first stands by (fetching and compiling the
   stage), and takes the stage over on a later plan, at the cost of no download.
5. **Probation.** A member that dropped a stage it served (lost, gone, revoked) is on probation when it comes
   back: it may stand by, or take a stage no steady member can serve within the margin, but rule 3 ignores
   it, so that a flapping member never pulls stages back and forth. Only :func:`forgive` ends it (the
   daemon's call, once the member has been steady for a while: this module reads no clock).
6. **Standbys.** Each stage served (but a required pin's, which runs on its node or nowhere) gets up to the
   policy's ``per_stage`` spare members that can hold it, each spare standing by for one stage: the standbys
   named before first, then members holding its files, then the fastest.

A plan is its own next plan: planning again from it with the same inputs changes nothing (the property test
checks it), so that re-planning on every membership event is harmless.

Cost: 1,000 candidates and 16 stages plan in about 5 ms (``tests/unit/test_placement.py`` measures it):
each stage only ever needs its few fastest fitting members of each kind, so the matchings stay small.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from agent.wire.jsonbody import canonical_json
from discovery.announcement import HeldStage
from discovery.fleet_document import FleetDocument, Pin, StandbyPolicy
from discovery.membership import Member, Membership
from shards.manifest import Manifest

MOVE_MARGIN = 0.20
"""A placement whose bottleneck is within 20 % of the best possible is good enough not to move a running stage
(or download anything): the speed figures are rough, and this machine's own speed drifts by 10-20 % within
minutes (``agent.measure.stages``), so a smaller margin would move stages on noise."""

ME = "me"
"""The :attr:`Candidate.state` of the agent that plans (``membership.me``)."""
ASSIGNABLE = frozenset({"member", ME})
"""Candidate states that can be given a stage: a verified member whose control link is up, or this agent."""
AWAITED = frozenset({"unverified", "lost", "gone"})
"""Candidate states of a peer that may serve once it links (again): an uncovered stage's reason names those that
could hold it, and why they do not serve (a clock set days wrong, unheard for 12 s)."""
NAMED_AT_MOST = 3
"""Peers an uncovered stage's reason names at the most."""
REVOKED = "revoked"
"""The state of a member whose certificate the fleet revoked: it never serves again, so a required pin on it is
void (a lost or gone member may come back, and its required pin waits for it)."""
SERVING = "serving"
"""The donor state of a PC whose owner lets it work now (the others: ``discovery.announcement.DONOR_STATES``)."""
DONOR_MEANING = {"draining": "its user is back: handing its stage over", "away": "its user is here", "off": "not now"}
HOLDING = frozenset({"cached", "compiling", "ready", "standby"})
"""Announced stage states whose files are on the member's disk already (a ``downloading`` one is not there)."""

KV_SESSIONS = 1
"""Full-context sessions whose KV cache a stage's memory must hold (as the export's ``memory_bytes`` counts)."""
WORKING_SHARE = 0.25
"""Memory beyond the stage's files, as a share of them: the compiled model's buffers, activations and the
allocator's slack (OpenVINO keeps weights and working memory apart)."""
RUNTIME_MB = 256
"""MiB of the agent's own process (Python, OpenVINO's runtime, the TLS links), whatever the stage."""
HEAD_SHARE = 1.0
"""How much of the LM head's size counts in a stage's cost, in decoder layers of parameters: all of it (its
matrix product reads every weight for every token, like a layer's)."""
EMBEDDINGS_SHARE = 0.1
"""How much of the embedding table's size counts: little (a token reads one row of it; a prompt's prefill a
few more)."""
FALLBACK_SPEED = 1.0
"""The speed every member counts with while none has measured its own."""


# -- inputs --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StageNeed:
    """What stage ``index`` needs of a node: ``memory_mb`` MiB, and ``cost``, its time per token in relative
    units (decoder layers' worth of work: a stage's time on a node is ``cost / speed``)."""

    index: int
    memory_mb: int
    cost: float

    def __post_init__(self) -> None:
        if self.index < 0 or self.memory_mb < 0 or not self.cost > 0:
            raise ValueError(f"a stage needs an index, memory and a positive cost, not {self}")


@dataclass(frozen=True)
class Candidate:
    """A PC that could serve a stage, as placement sees it (built from membership by :func:`candidates`)."""

    node: str
    name: str
    memory_mb: int
    """MiB it can give a shard."""
    speed: float
    """Its measured speed (GFLOP/s; 0: not measured yet)."""
    devices: tuple[str, ...] = ()
    held: frozenset[int] = frozenset()
    """Stages whose files it has already: giving it one of them saves a download."""
    state: str = "member"
    """``me``, or its membership state (``member``, ``lost``, ``gone``, ``revoked``, ...): see :data:`ASSIGNABLE`."""
    donor: str = "serving"
    """What its owner allows now (``discovery.announcement.DONOR_STATES``): only ``serving`` takes work."""
    why: str = ""
    """Why it is in its state, for people (``discovery.membership.Member.why``: a clock set days wrong, ...)."""

    @property
    def assignable(self) -> bool:
        return self.state in ASSIGNABLE and self.donor == SERVING

    @property
    def unavailable(self) -> str:
        """Why it cannot be given a stage, for people (empty: it can): ``lost``, ``away (its user is back)``..."""
        if self.state not in ASSIGNABLE:
            return self.state
        return "" if self.donor == SERVING else f"{self.donor} ({DONOR_MEANING.get(self.donor, 'not serving')})"


def stage_needs(manifest: Manifest) -> tuple[StageNeed, ...]:
    """Each stage's memory and cost, from the export's manifest.

    Memory: the stage's files, plus :data:`WORKING_SHARE` of them, plus the KV cache of :data:`KV_SESSIONS`
    sessions at the export's context, plus :data:`RUNTIME_MB`. Cost: its decoder layers, plus the LM head's
    and the embedding table's size in layers of parameters (weighted by :data:`HEAD_SHARE` and
    :data:`EMBEDDINGS_SHARE`): decoding is bound by reading weights, so a stage's time per token follows the
    weights it reads per token.
    """
    arch = manifest.arch
    table = arch.vocab_size * arch.hidden_size / arch.layer_param_count()
    needs = []
    for index, stage in enumerate(manifest.stages):
        files = sum(f.size for f in stage.files)
        kv = stage.kv_bytes_per_token * manifest.context_tokens * KV_SESSIONS
        memory = math.ceil((files * (1 + WORKING_SHARE) + kv) / (1 << 20)) + RUNTIME_MB
        cost = stage.num_layers + HEAD_SHARE * table * stage.head + EMBEDDINGS_SHARE * table * stage.embeddings
        needs.append(StageNeed(index, memory, cost))
    return tuple(needs)


def kv_pool_positions(manifest: Manifest, indices: Sequence[int], offer_mb: int, sessions: int) -> int:
    """The positions each of stages ``indices`` of ``manifest`` keeps in its paged KV pool on a member offering
    ``offer_mb`` MiB and holding at most ``sessions`` sessions: what the offer leaves once the stages' files, their
    :data:`WORKING_SHARE` and :data:`RUNTIME_MB` are counted, in positions of every one of those stages' KV, up to
    ``sessions`` sessions at the export's context (a pool larger than its sessions can fill would only reserve
    memory: Windows commits it); never fewer than :data:`KV_SESSIONS` sessions (what placing the stages there
    counted on)."""
    stages = [manifest.stages[i] for i in indices]
    files = sum(f.size for stage in stages for f in stage.files)
    per_position = sum(stage.kv_bytes_per_token for stage in stages)
    least = KV_SESSIONS * manifest.context_tokens
    most = max(least, sessions * manifest.context_tokens)
    if per_position <= 0:
        return most
    room = (offer_mb - RUNTIME_MB) * (1 << 20) - files * (1 + WORKING_SHARE)
    return max(least, min(most, int(room // per_position)))


def candidates(membership: Membership) -> tuple[Candidate, ...]:
    """Every peer this agent knows, and itself (state :data:`ME`), as candidates, by node id."""
    me = membership.me
    found = {me.node: Candidate(me.node, me.name, me.memory_mb, me.speed, me.devices, _held(me.stages), ME, me.donor)}
    for node, member in membership.members.items():
        if node not in found:
            found[node] = _candidate(member)
    return tuple(found[node] for node in sorted(found))


def _candidate(member: Member) -> Candidate:
    a = member.announcement
    state = member.state.value
    return Candidate(a.node, a.name, a.memory_mb, a.speed, a.devices, _held(a.stages), state, a.donor, member.why)


def _held(stages: Iterable[HeldStage]) -> frozenset[int]:
    return frozenset(s.index for s in stages if s.state in HOLDING)


_OTHERS = (False, True, False, True)
"""Which of :meth:`_Planner._of_kind`'s four lists are of members other than the stage's holders."""


# -- the plan --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Assignment:
    """Stage ``stage`` on ``node`` (None: uncovered), the spare nodes standing by for it, and why, for people."""

    stage: int
    node: str | None
    standbys: tuple[str, ...] = ()
    reason: str = ""


@dataclass(frozen=True)
class PinOutcome:
    """Whether a pin of the fleet document is honoured, and why not."""

    pin: Pin
    honoured: bool
    reason: str


@dataclass(frozen=True)
class Plan:
    """Who serves each stage (``assignments``, by stage), and what became of the pins.

    ``epoch`` grows by one each time the placement changes. ``hash`` is the sha256 of :meth:`canonical`: the
    assignments, standbys and pin outcomes, without times, reasons (worded for people) or epoch, so that two
    agents that planned the same placement agree on it whatever their history. ``bottleneck`` is the slowest
    stage's ``cost / speed``; ``probation`` the members on probation (rule 5 of the module docstring).
    """

    assignments: tuple[Assignment, ...]
    pins: tuple[PinOutcome, ...] = ()
    epoch: int = 1
    bottleneck: float = 0.0
    probation: frozenset[str] = frozenset()
    uncovered: tuple[int, ...] = field(init=False)
    """The stages no node serves."""
    hash: str = field(init=False)

    def __post_init__(self) -> None:
        if [a.stage for a in self.assignments] != list(range(len(self.assignments))):
            raise ValueError("a plan assigns stages 0, 1, 2, ... in order")
        nodes = [a.node for a in self.assignments if a.node is not None]
        nodes += [n for a in self.assignments for n in a.standbys]
        if len(set(nodes)) != len(nodes):
            raise ValueError("a node serves or stands by for one stage at most")
        object.__setattr__(self, "uncovered", tuple(a.stage for a in self.assignments if a.node is None))
        object.__setattr__(self, "hash", hashlib.sha256(self.canonical()).hexdigest())

    def canonical(self) -> bytes:
        """The placement as canonical JSON (what :attr:`hash` digests)."""
        doc = {
            "assignments": [{"stage": a.stage, "node": a.node, "standbys": list(a.standbys)} for a in self.assignments],
            "pins": [
                {"node": o.pin.node, "stage": o.pin.stage, "required": o.pin.required, "honoured": o.honoured}
                for o in self.pins
            ],
        }
        return canonical_json(doc)

    @property
    def complete(self) -> bool:
        """Whether every stage has a node (the ring can serve)."""
        return bool(self.assignments) and not self.uncovered

    def node_of(self, stage: int) -> str | None:
        return self.assignments[stage].node if 0 <= stage < len(self.assignments) else None

    def standbys_of(self, stage: int) -> tuple[str, ...]:
        return self.assignments[stage].standbys if 0 <= stage < len(self.assignments) else ()

    def stage_of(self, node: str) -> int | None:
        """The stage ``node`` serves (None: it serves none; it may stand by)."""
        return next((a.stage for a in self.assignments if a.node == node), None)

    @property
    def first(self) -> str | None:
        """The node of the first stage (the embeddings: where a token enters the ring)."""
        return self.node_of(0)

    @property
    def last(self) -> str | None:
        """The node of the last stage (the LM head: where the ring's logits come out)."""
        return self.node_of(len(self.assignments) - 1)


def forgive(plan: Plan, nodes: Iterable[str]) -> Plan:
    """``plan`` with ``nodes`` off probation: they count for the ring's speed again (rule 5)."""
    return replace(plan, probation=plan.probation - frozenset(nodes))


def plan(
    document: FleetDocument | None,
    stages: Sequence[StageNeed],
    members: Iterable[Candidate],
    previous: Plan | None = None,
    revoked: Mapping[str, str] | None = None,
) -> Plan:
    """The next plan (see the module docstring for its rules).

    ``stages``: one :class:`StageNeed` per stage, indexes 0 to n-1 (:func:`stage_needs`). ``members``: every
    known candidate, this agent included (:func:`candidates`); only assignable ones get stages. ``previous``:
    the plan in force for the same export (None at first, and after the export changes: a plan of another
    number of stages is ignored). ``document`` None: no pins, the default standby policy. ``revoked``: the node
    id and name of every node the fleet's revocation list names, known as a candidate or not (a required pin on
    one is void).
    """
    return _Planner(document, stages, members, previous, revoked or {}).run()


class _Planner:
    """One call of :func:`plan`: its inputs indexed for speed. Candidates are numbered in node-id order, which
    makes every tie break by node id and the result independent of the order of ``members``."""

    def __init__(
        self,
        document: FleetDocument | None,
        stages: Sequence[StageNeed],
        members: Iterable[Candidate],
        previous: Plan | None,
        revoked: Mapping[str, str],
    ) -> None:
        self.needs = tuple(sorted(stages, key=lambda s: s.index))
        if [s.index for s in self.needs] != list(range(len(self.needs))):
            raise ValueError(f"stages must be numbered 0 to {len(self.needs) - 1}, once each")
        self.cands = sorted(members, key=lambda c: c.node)
        self.index = {c.node: i for i, c in enumerate(self.cands)}
        if len(self.index) != len(self.cands):
            raise ValueError("a candidate is listed twice")
        self.pins = document.pins if document is not None else ()
        self.per_stage = (document.standby if document is not None else StandbyPolicy()).per_stage
        self.ok = [c.assignable for c in self.cands]
        self.mem = [c.memory_mb for c in self.cands]
        measured = [c.speed for c, ok in zip(self.cands, self.ok, strict=True) if ok and c.speed > 0]
        floor = min(measured, default=FALLBACK_SPEED)
        self.speed = [c.speed if c.speed > 0 else floor for c in self.cands]
        self.last = previous
        """The plan in force, whatever its export: the epoch goes on from it."""
        if previous is not None and len(previous.assignments) != len(self.needs):
            previous = None
        self.was = {a.stage: a.node for a in previous.assignments if a.node is not None} if previous else {}
        self.stood = {a.stage: a.standbys for a in previous.assignments} if previous else {}
        probation = set(previous.probation) if previous else set()
        for node in self.was.values():
            i = self.index.get(node)
            if i is None or not self.ok[i]:
                probation.add(node)
        self.probation = probation
        self.on_probation = [c.node in probation for c in self.cands]
        self.to_holder: dict[int, int] = {}
        """Stages rule 4 moved to a member holding their files, and where to (set by :meth:`_to_holders`)."""
        self.by_name: dict[str, list[int]] = {}
        for i, c in enumerate(self.cands):
            self.by_name.setdefault(c.name, []).append(i)
        self.revoked = dict(revoked)
        """Revoked node id -> name, and revoked name -> name (what a pin on a node no candidate is may name)."""
        self.revoked.update({name: name for name in revoked.values()})

    def time(self, stage: int, i: int) -> float:
        return self.needs[stage].cost / self.speed[i]

    def fits(self, stage: int, i: int) -> bool:
        return self.mem[i] >= self.needs[stage].memory_mb

    def name(self, i: int) -> str:
        return self.cands[i].name

    # -- the steps ---------------------------------------------------------------------------------------
    def run(self) -> Plan:
        outcomes, fixed, required = self._pin()
        taken = {i: s for s, i in fixed.items()}
        free = [i for i in range(len(self.cands)) if self.ok[i] and i not in taken]
        self.order = sorted(free, key=lambda i: (-self.speed[i], self.cands[i].node))
        self.rank = {i: r for r, i in enumerate(self.order)}
        auto = [s for s in range(len(self.needs)) if s not in fixed and s not in required]
        self.auto_order = sorted(auto, key=lambda s: (-self.needs[s].cost, s))
        self._candidate_lists(auto)

        steady, best = self._bottleneck(self.fastest_steady)
        if steady < len(self._match(self.fastest, math.inf)):
            _, best = self._bottleneck(self.fastest)  # coverage first: members on probation count then
        pinned = max((self.time(s, i) for s, i in fixed.items()), default=0.0)
        limit = max(best, pinned) * (1 + MOVE_MARGIN)
        served = self._assign(auto, taken, limit)
        served.update(fixed)

        users = {i: s for s, i in served.items()}
        standbys = self._standbys(served, self.pinned_required, users)
        assignments = []
        for s in range(len(self.needs)):
            i = served.get(s)
            node = None if i is None else self.cands[i].node
            reason = required.get(s) or self._reason(s, i, fixed, taken, users, limit, free)
            if s in self.void:
                reason = f"{reason}; {self.void[s]}"
            assignments.append(Assignment(s, node, tuple(self.cands[j].node for j in standbys.get(s, ())), reason))
        result = Plan(
            tuple(assignments),
            tuple(outcomes),
            bottleneck=max((self.time(s, i) for s, i in served.items()), default=0.0),
            probation=frozenset(self.probation),
        )
        if self.last is not None:
            result = replace(result, epoch=self.last.epoch + (result.hash != self.last.hash))
        return result

    def _pin(self) -> tuple[list[PinOutcome], dict[int, int], dict[int, str]]:
        """The pins' outcomes, the stages pinned (stage -> candidate) and the required pins' uncovered stages."""
        outcomes: list[PinOutcome] = []
        fixed: dict[int, int] = {}
        required: dict[int, str] = {}
        taken: dict[int, int] = {}
        self.pinned_required: set[int] = set()
        self.void: dict[int, str] = {}
        """Stages placed automatically because their required pin names a revoked node, and why."""
        for pin in self.pins:
            i = self._resolve(pin.node)
            why = self._pin_problem(pin, i, taken, fixed.keys() | required.keys())
            if why is None and i is not None:
                fixed[pin.stage], taken[i] = i, pin.stage
                if pin.required:
                    self.pinned_required.add(pin.stage)
                how = "required" if pin.required else "preferred"
                outcomes.append(PinOutcome(pin, True, f"stage {pin.stage} on {self.name(i)} ({how})"))
            elif pin.required and self._names_revoked(pin.node, i):
                if pin.stage < len(self.needs) and pin.stage not in fixed:
                    self.void[pin.stage] = f"the required pin on {pin.node} is void: {why}"
                outcomes.append(PinOutcome(pin, False, f"{why}; the pin is void, the stage is placed automatically"))
            elif pin.required:
                if pin.stage < len(self.needs) and pin.stage not in fixed:
                    required[pin.stage] = f"required on {pin.node}, which cannot serve it: {why}"
                outcomes.append(PinOutcome(pin, False, f"{why}; the stage waits for it (required pin)"))
            else:
                outcomes.append(PinOutcome(pin, False, f"{why}; the stage is placed automatically"))
        return outcomes, fixed, required

    def _resolve(self, node: str) -> int | None:
        """A pin's node: a node id, else a node name (its assignable candidate first, then by node id)."""
        if node in self.index:
            return self.index[node]
        named = self.by_name.get(node, [])
        return min(named, key=lambda i: (not self.ok[i], self.cands[i].node), default=None)

    def _names_revoked(self, node: str, i: int | None) -> bool:
        """Whether a pin's node (resolved to candidate ``i``) is revoked: a revoked candidate, or no candidate
        and a node id or name the revocation list names."""
        return self.cands[i].state == REVOKED if i is not None else node in self.revoked

    def _pin_problem(self, pin: Pin, i: int | None, taken: dict[int, int], pinned: set[int]) -> str | None:
        n = len(self.needs)
        if pin.stage >= n:
            return f"the export has {n} stages (0 to {n - 1}), no stage {pin.stage}"
        if pin.stage in pinned:
            return f"stage {pin.stage} is pinned already"
        if i is None and pin.node in self.revoked:
            return f"{self.revoked[pin.node]} is revoked"
        if i is None:
            return f"no member {pin.node!r} is known to this agent"
        if not self.ok[i]:
            return f"{self.name(i)} is {self.cands[i].unavailable}"
        if not self.fits(pin.stage, i):
            need = self.needs[pin.stage].memory_mb
            return f"{self.name(i)} offers {self.mem[i]} MiB and stage {pin.stage} needs {need} MiB"
        if i in taken:
            return f"{self.name(i)} serves pinned stage {taken[i]}"
        return None

    def _candidate_lists(self, auto: list[int]) -> None:
        """For each stage, the few free members it could ever need to look at.

        A matching of k stages never needs more than a stage's k fastest fitting members of one kind (steady or
        on probation, holding its files or not): if it used a slower one, one of those k would be free and as
        good. So each stage keeps those, its previous node and its standbys; the rest of a large fleet is never
        looked at again.
        """
        k = len(auto)
        self._kinds()
        self.fastest: dict[int, list[int]] = {}
        self.fastest_steady: dict[int, list[int]] = {}
        self.preferred: dict[int, list[int]] = {}
        self.standby_of: dict[int, set[int]] = {}
        for s in auto:
            kinds = [self._first(s, seq, k, others) for seq, others in zip(self._of_kind(s), _OTHERS, strict=True)]
            listed = sorted({i for kind in kinds for i in kind}, key=self.rank.__getitem__)
            self.fastest[s] = listed[:k]
            self.fastest_steady[s] = sorted(kinds[0] + kinds[1], key=self.rank.__getitem__)[:k]
            standbys = {self.index[n] for n in self.stood.get(s, ()) if n in self.index}
            self.standby_of[s] = {i for i in standbys if i in self.rank and self.fits(s, i)}
            extra = set(self.standby_of[s])
            was = self.index.get(self.was.get(s, ""))
            if was is not None and was in self.rank and self.fits(s, was):
                extra.add(was)
            self.preferred[s] = sorted(set(listed) | extra, key=functools.partial(self._preference, s))

    def _kinds(self) -> None:
        """The free members by kind, each fastest first: steady, on probation, and each stage's holders."""
        self.steady = [i for i in self.order if not self.on_probation[i]]
        self.unsteady = [i for i in self.order if self.on_probation[i]]
        self.holders: dict[int, list[int]] = {}
        for i in self.order:
            for s in self.cands[i].held:
                self.holders.setdefault(s, []).append(i)

    def _of_kind(self, s: int) -> tuple[list[int], list[int], list[int], list[int]]:
        """Stage ``s``'s four kinds of free member, best kind first (see :meth:`_preference`): steady holders of
        its files, other steady members, holders on probation, others on probation. A holder is in two of them;
        :meth:`_first` skips it in the others' (see ``_OTHERS``)."""
        holders = self.holders.get(s, [])
        steady_holders = [i for i in holders if not self.on_probation[i]]
        unsteady_holders = [i for i in holders if self.on_probation[i]]
        return steady_holders, self.steady, unsteady_holders, self.unsteady

    def _first(self, s: int, seq: Iterable[int], k: int, others: bool) -> list[int]:
        """The first ``k`` members of ``seq`` that can hold stage ``s`` (``others``: skipping its holders)."""
        need = self.needs[s].memory_mb
        found: list[int] = []
        for i in seq:
            if self.mem[i] >= need and not (others and s in self.cands[i].held):
                found.append(i)
                if len(found) == k:
                    break
        return found

    def _preference(self, s: int, i: int) -> tuple[bool, bool, bool, bool, int]:
        """Rule 4's order (after staying put): steady members holding its files, its standby, steady members,
        holding its files, fastest. A steady holder comes before a standby that lacks the files (still fetching
        them): the next plan would take the stage from that standby to the holder (:meth:`_to_holders`), and a
        plan must be its own next plan."""
        held = s in self.cands[i].held
        steady_holder = held and not self.on_probation[i]
        return (not steady_holder, i not in self.standby_of[s], self.on_probation[i], not held, self.rank[i])

    def _bottleneck(self, lists: dict[int, list[int]]) -> tuple[int, float]:
        """The most stages ``lists`` can cover, and the smallest bottleneck that covers that many."""
        most = len(self._match(lists, math.inf))
        if most == 0:
            return 0, 0.0
        times = sorted({self.time(s, i) for s in self.auto_order for i in lists[s]})
        lo, hi = 0, len(times) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if len(self._match(lists, times[mid])) == most:
                hi = mid
            else:
                lo = mid + 1
        return most, times[lo]

    def _match(self, lists: dict[int, list[int]], limit: float) -> dict[int, int]:
        """A maximum matching (candidate -> stage) using only stages' times within ``limit``."""
        owner: dict[int, int] = {}
        for s in self.auto_order:
            self._augment(s, lists, limit, owner, set())
        return owner

    def _augment(
        self, s: int, lists: dict[int, list[int]], limit: float, owner: dict[int, int], seen: set[int]
    ) -> bool:
        """Kuhn's augmenting path from stage ``s``: give it a node, moving others along if need be."""
        for i in lists[s]:
            if i in seen or self.time(s, i) > limit:
                continue
            seen.add(i)
            if i not in owner or self._augment(owner[i], lists, limit, owner, seen):
                owner[i] = s
                return True
        return False

    def _assign(self, auto: list[int], taken: dict[int, int], limit: float) -> dict[int, int]:
        """Rule 4: stages that run stay, the others take their preferred free member within ``limit``, then
        augmenting paths cover whatever the preferences left uncovered."""
        owner: dict[int, int] = {}
        lacking: dict[int, int] = {}
        for s in sorted(auto):
            was = self.index.get(self.was.get(s, ""))
            if was is None or was not in self.rank or not self.fits(s, was):
                continue
            if self.time(s, was) > limit:
                if not self._ready_elsewhere(s, was, limit):
                    owner[was] = s
            elif was in self.holders.get(s, [was]):  # it holds the files, or nobody does
                owner[was] = s
            else:
                lacking[s] = was
        self._to_holders(lacking, owner, limit)
        placed = set(owner.values())
        for s in self.auto_order:
            if s in placed:
                continue
            for i in self.preferred[s]:
                if i not in owner and self.time(s, i) <= limit:
                    owner[i] = s
                    placed.add(s)
                    break
        for s in self.auto_order:
            if s not in placed:
                self._augment(s, self.preferred, limit, owner, set())
        return {s: i for i, s in owner.items()}

    def _ready_elsewhere(self, s: int, was: int, limit: float) -> bool:
        """Whether another free member holds stage ``s``'s files and runs it within ``limit`` (rule 4: a running
        stage moves for speed only to a member that has its files, so the move costs no download)."""
        return any(i != was and self.fits(s, i) and self.time(s, i) <= limit for i in self.holders.get(s, []))

    def _to_holders(self, lacking: dict[int, int], owner: dict[int, int], limit: float) -> None:
        """Rule 4: each stage of ``lacking`` (stage -> the node it runs on, within ``limit``, which does not hold
        its files yet: a restarted fleet's first plan came before the members said which stages their caches
        hold, or it still fetches them) goes to a member that holds its files, runs it within ``limit`` and serves
        no stage that stays (one on probation after every steady member), else it stays; in ``owner``.

        It goes straight to that member, not by way of its standby (which may lack the files too), and a stage
        that leaves frees its node, which may hold another stage's files: so this goes on until no stage moves,
        and the next plan finds no stage to move (a plan is its own next plan). Each pass moves a stage to a
        member that holds its files or ends, so there are at most ``len(lacking) + 1`` of them.
        """
        owner.update({was: s for s, was in lacking.items()})
        self.to_holder = {}
        moved = True
        while moved:
            moved = False
            for s, was in sorted(lacking.items()):
                if owner.get(was) != s:
                    continue  # on a member that holds its files already
                to = next((i for i in self.preferred[s] if self._takes_for_its_files(s, i, owner, limit)), None)
                if to is not None:
                    del owner[was]
                    owner[to], self.to_holder[s] = s, to
                    moved = True

    def _takes_for_its_files(self, s: int, i: int, owner: dict[int, int], limit: float) -> bool:
        """Whether member ``i`` is free in ``owner``, holds stage ``s``'s files and runs it within ``limit``.

        A member on probation qualifies too (after every steady one: :attr:`preferred` lists steady holders
        first): probation keeps a flapping member from pulling a running stage back, but here the stage is not
        running, its node still fetches the files, and a holder that came back (its files in its cache, the
        mirror perhaps down) serves it sooner than any download. Stage ``s``'s :attr:`preferred` list is enough
        to look in: it has the stage's fastest holders, more of them than there are other stages to keep busy."""
        return s in self.cands[i].held and i not in owner and self.time(s, i) <= limit

    def _standbys(self, served: dict[int, int], without: set[int], users: dict[int, int]) -> dict[int, list[int]]:
        """Rule 6: spare members that can hold each served stage, the ones named before first; the slowest
        stages choose first (a fast spare stands by where it could make the ring faster)."""
        if self.per_stage == 0:
            return {}
        stages = sorted((s for s in served if s not in without), key=lambda s: (-self.time(s, served[s]), s))
        spare = {i for i in self.order if i not in users}
        chosen: dict[int, list[int]] = {s: [] for s in stages}
        for s in stages:
            for node in self.stood.get(s, ()):
                i = self.index.get(node)
                if i is not None and i in spare and self.fits(s, i) and len(chosen[s]) < self.per_stage:
                    chosen[s].append(i)
                    spare.discard(i)
        for s in stages:
            for seq, others in zip(self._of_kind(s), _OTHERS, strict=True):
                if len(chosen[s]) == self.per_stage:
                    break
                spares = (i for i in seq if i in spare)
                for i in self._first(s, spares, self.per_stage - len(chosen[s]), others):
                    chosen[s].append(i)
                    spare.discard(i)
        return chosen

    # -- reasons, for people ------------------------------------------------------------------------------
    def _reason(
        self,
        s: int,
        i: int | None,
        fixed: dict[int, int],
        taken: dict[int, int],
        users: dict[int, int],
        limit: float,
        free: list[int],
    ) -> str:
        if i is None:
            return self._uncovered(s, free)
        if s in fixed:
            return f"pinned to {self.name(i)} ({'required' if s in self.pinned_required else 'preferred'})"
        was = self.was.get(s)
        if was == self.cands[i].node:
            return f"kept on {self.name(i)}, which serves it already"
        moved = was is not None
        if i in self.standby_of[s]:
            how = f"{self.name(i)} took over as its standby"
        elif s in self.cands[i].held:
            how = f"{'moved' if moved else 'given'} to {self.name(i)}, which holds its files"
        else:
            how = f"{'moved' if moved else 'given'} to {self.name(i)}, a free member that can hold it"
        if was is None:
            return how
        return f"{how} ({self._why_moved(s, i, was, taken, users, limit)})"

    def _uncovered(self, s: int, free: list[int]) -> str:
        """Why stage ``s`` has no node: first the peers that could hold it but do not link, by name and why (what
        people can act on: a clock set days wrong), then what the members do."""
        need = self.needs[s].memory_mb
        awaited = [j for j, c in enumerate(self.cands) if c.state in AWAITED and self.fits(s, j)]
        named = [
            f"{self.name(j)} could hold it but is {self.cands[j].state}"
            + (f" ({self.cands[j].why})" if self.cands[j].why else "")
            for j in awaited[:NAMED_AT_MOST]
        ]
        if len(awaited) > NAMED_AT_MOST:
            named.append(f"{len(awaited) - NAMED_AT_MOST} more peers could hold it but do not serve")
        if any(self.mem[j] >= need for j in free):
            members = "every member that can hold it serves another stage"
        elif not free:
            members = "no member is free to serve it"
        else:
            largest = max(self.mem[j] for j in free)
            members = f"no member can hold it: it needs {need} MiB, the largest free member offers {largest} MiB"
        return "; ".join([*named, members])

    def _why_moved(self, s: int, i: int, was: str, taken: dict[int, int], users: dict[int, int], limit: float) -> str:
        p = self.index.get(was)
        if p is None:
            return f"{was} is no longer known"
        name = self.name(p)
        if not self.ok[p]:
            return f"{name} is {self.cands[p].unavailable}"
        if p in taken:
            return f"{name} is pinned to stage {taken[p]}"
        if not self.fits(s, p):
            return f"{name} no longer has the {self.needs[s].memory_mb} MiB it needs"
        if self.time(s, p) > limit:
            return f"the ring would be over {MOVE_MARGIN:.0%} slower with it on {name}"
        if self.to_holder.get(s) == i:
            return f"{name} does not hold its files yet"
        if p in users:
            return f"{name} serves stage {users[p]} now, so that every stage is covered"
        return f"{name} was needed elsewhere"
