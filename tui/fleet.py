"""What the fleet view shows, computed from status documents (pure functions).

The local agent's status has a section per part of the agent: ``plan`` (``discovery/plan_service.py``: the plan's
stages with the node, state, download percent and layers of each, their standbys, the model's layer count),
``members`` (``discovery/service.py``: every peer this agent knows, with its state and what it announces:
devices, memory offered), ``ring`` (what this agent does for the plan) and ``chat``. A hand-wired agent
(``--stage``/``--next``) has none of the fleet's sections.

A stage's own figures (the device it computes on, its step latency, its sessions open and parked, the memory
its agent holds) are in the status of the agent serving it (``agent/node/server.py``): the app reads those of
the plan's nodes besides the local one's and hands them in as ``peers``. Nothing here trusts a document's
shape: a missing or odd field shows as unknown (``—``), it never raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

Severity = Literal["ok", "warning", "error"]
Health = Literal["ok", "busy", "bad", "idle"]
"""ok: serving; busy: on its way (downloading, compiling, standing by); bad: uncovered or lost; idle: nothing."""

_STATE_HEALTH: dict[str, Health] = {
    "ready": "ok",
    "downloading": "busy",
    "compiling": "busy",
    "standby": "busy",
    "draining": "busy",
    "uncovered": "bad",
    "lost": "bad",
    "gone": "bad",
    "failed": "bad",
}
_GONE_MEMBER = frozenset({"lost", "gone", "revoked", "foreign"})
UNKNOWN = "—"
"""What a figure that no status gave shows as."""


@dataclass(frozen=True)
class Held:
    """A node's hold on a stage: its name and what it announces (``downloading`` 40 %, ``ready``...)."""

    name: str
    state: str
    progress: int | None = None

    @property
    def text(self) -> str:
        return self.state if self.progress is None else f"{self.state} {self.progress} %"

    @property
    def health(self) -> Health:
        return _STATE_HEALTH.get(self.state, "idle")


@dataclass(frozen=True)
class StageLoad:
    """What a stage's agent says of its own work (``agent/node/server.py``'s status); None: not known."""

    device: str | None = None
    step_ms: float | None = None
    """Milliseconds of one step: the mean of the steps since the previous reading, else of all its steps."""
    sessions: int | None = None
    """Sessions its stages hold, the parked ones included (as ``shoal_sessions_open`` counts them)."""
    parked: int | None = None
    """Of those, sessions kept between a chat's turns."""
    memory_mb: int | None = None
    """MiB the agent's process holds."""


def stage_load(status: Mapping[str, Any] | None, before: Mapping[str, Any] | None = None) -> StageLoad:
    """The load in one agent's status document; ``before``, its previous document, makes the step latency the
    recent steps' (a lifetime mean would hide a stage that just slowed down)."""
    if status is None:
        return StageLoad()
    device = status.get("device")
    sessions = status.get("sessions")
    return StageLoad(
        device=device if isinstance(device, str) and device else None,
        step_ms=_step_ms(_mapping(status.get("step_seconds")), _mapping((before or {}).get("step_seconds"))),
        sessions=len(sessions) if isinstance(sessions, list) else None,
        parked=_count(status.get("parked")),
        memory_mb=_count(status.get("memory_mb")),
    )


def _step_ms(now: Mapping[str, Any] | None, before: Mapping[str, Any] | None) -> float | None:
    count, seconds = _number(now, "count"), _number(now, "sum")
    if count is None or seconds is None or count <= 0:
        return None
    count0, seconds0 = _number(before, "count"), _number(before, "sum")
    if count0 is not None and seconds0 is not None and 0 <= count0 < count and seconds0 <= seconds:
        return (seconds - seconds0) / (count - count0) * 1000
    return seconds / count * 1000


@dataclass(frozen=True)
class StageRow:
    stage: int
    holder: Held | None
    """None: no member covers the stage."""
    standbys: tuple[Held, ...]
    reason: str
    layers: tuple[int, int] | None = None
    """The decoder layers ``[start, stop)`` the stage computes."""
    load: StageLoad = field(default_factory=StageLoad)
    share: float | None = None
    """The stage's part of the ring's step time (0-1): the sum of the stages' step latencies is the ring's
    computing per token, so the largest share is the stage that sets the pace. None unless every stage's is known."""

    @property
    def state(self) -> Held:
        return self.holder if self.holder is not None else Held("", "uncovered")


@dataclass(frozen=True)
class MemberRow:
    """A member that serves no stage of the plan: a standby, a spare, or one lost, foreign or revoked."""

    name: str
    state: str
    role: str
    address: str
    heard: str
    stuck: bool = False
    """It cannot link until people act, and ``role`` says why (its clock or this PC's set days wrong)."""

    @property
    def health(self) -> Health:
        if self.state in _GONE_MEMBER or self.stuck:
            return "bad"
        return "busy" if self.role.startswith("standby") else "idle"


@dataclass(frozen=True)
class FleetReport:
    """The fleet as the local agent sees it, or why it cannot be seen."""

    banner: str
    severity: Severity
    headline: str
    """The banner in a few words, for the status line."""
    reachable: bool = True
    summary: str = ""
    """The model, the plan and who planned it, in one line."""
    stages: tuple[StageRow, ...] = ()
    others: tuple[MemberRow, ...] = ()
    ready: bool = False
    layers: int | None = None
    """The model's decoder layers (the span bars' whole)."""


WAITING = FleetReport("Asking the agent for the fleet's state…", "warning", "asking the agent…", reachable=False)


def unreachable(error: str) -> FleetReport:
    return FleetReport(f"Agent unreachable: {error}", "error", "agent unreachable", reachable=False)


def fleet_report(
    status: Mapping[str, Any],
    peers: Mapping[str, Mapping[str, Any]] | None = None,
    before: Mapping[str, Mapping[str, Any]] | None = None,
) -> FleetReport:
    """The report of the local agent's status document (``StatusLink.get``). ``peers``: the status documents
    of the plan's nodes, by node id (the local agent's own is ``status``, unless given); ``before``: the
    previous ones, for recent step latencies."""
    plan = _mapping(status.get("plan"))
    members = _mapping(status.get("members"))
    if plan is None:
        stages = ", ".join(str(s) for s in _sequence(status.get("stages"))) or "none"
        return FleetReport(
            "No fleet plan: this agent's ring is wired by hand (--stage, --next)",
            "ok",
            "ring wired by hand",
            summary=f"agent {status.get('node') or '?'} serves stages: {stages}",
            ready=True,
        )
    states = {
        str(m.get("node")): str(m.get("state"))
        for m in (_mapping(raw) for raw in _sequence(members.get("members") if members else None))
        if m is not None
    }
    docs = dict(peers or {})
    if members is not None and members.get("node") and str(members["node"]) not in docs:
        docs[str(members["node"])] = status  # the local agent's stage, if it holds one
    loads = {node: stage_load(_mapping(doc), _mapping((before or {}).get(node))) for node, doc in docs.items()}
    devices = _announced_devices(members)
    entries = [entry for entry in (_mapping(raw) for raw in _sequence(plan.get("stages"))) if entry is not None]
    rows = _shared([row for row in (_stage_row(entry, states, loads, devices) for entry in entries) if row is not None])
    in_ring = {str(entry.get("node")) for entry in entries if entry.get("node")}
    banner, severity, headline = _banner(plan, rows)
    total = plan.get("layers")
    return FleetReport(
        banner,
        severity,
        headline,
        summary=_summary(plan, members),
        stages=rows,
        others=_others(members, plan, in_ring),
        ready=bool(plan.get("ready")),
        layers=total if isinstance(total, int) and not isinstance(total, bool) and total > 0 else None,
    )


def peer_addresses(status: Mapping[str, Any]) -> dict[str, str]:
    """The agents whose own status the fleet view reads besides the local one's: each node of the plan's stages
    that is a member (a lost one would only time out), by node id, with the ``host:port`` it was heard at."""
    plan, members = _mapping(status.get("plan")), _mapping(status.get("members"))
    if plan is None or members is None:
        return {}
    heard = {}
    for raw in _sequence(members.get("members")):
        member = _mapping(raw) or {}
        if member.get("state") == "member" and isinstance(member.get("address"), str) and member.get("node"):
            heard[str(member["node"])] = member["address"]
    nodes = [str(entry.get("node")) for entry in (_mapping(raw) or {} for raw in _sequence(plan.get("stages")))]
    return {node: heard[node] for node in nodes if node in heard and node != members.get("node")}


def _announced_devices(members: Mapping[str, Any] | None) -> dict[str, str]:
    """The devices each member announces (the one a stage runs on is in its own status; this is the fallback)."""
    found = {}
    for raw in _sequence(members.get("members") if members else None):
        member = _mapping(raw) or {}
        devices = _sequence((_mapping(member.get("announces")) or {}).get("devices"))
        if member.get("node") and devices:
            found[str(member["node"])] = ",".join(str(d) for d in devices)
    return found


def _shared(rows: list[StageRow]) -> tuple[StageRow, ...]:
    """``rows`` with each one's share of the ring's step time, when every stage's latency is known."""
    latencies = [row.load.step_ms for row in rows]
    total = sum(ms for ms in latencies if ms is not None)
    if not rows or any(ms is None for ms in latencies) or total <= 0:
        return tuple(rows)
    return tuple(replace(row, share=(row.load.step_ms or 0.0) / total) for row in rows)


def _banner(plan: Mapping[str, Any], rows: Sequence[StageRow]) -> tuple[str, Severity, str]:
    """The banner, its severity and its headline."""
    if plan.get("manifest_error"):
        return f"The fleet's model cannot be read: {plan['manifest_error']}", "error", "model unreadable"
    if not plan.get("model"):
        return "The fleet serves no model yet (the admin runs `shoal fleet serve`)", "warning", "no model served yet"
    if not plan.get("hash"):
        return f"No plan yet for {_model_name(str(plan['model']))}", "warning", "no plan yet"
    uncovered = [row.stage for row in rows if row.holder is None]
    if uncovered:
        which = ", ".join(map(str, uncovered))
        reason = next(row.reason for row in rows if row.holder is None)
        many = len(uncovered) > 1
        return (
            f"Stage{'s' if many else ''} {which} {'are' if many else 'is'} uncovered: {reason}",
            "error",
            f"stage{'s' if many else ''} {which} uncovered",
        )
    lost = [row for row in rows if row.holder is not None and row.holder.health == "bad"]
    if lost:
        stage, name = lost[0].stage, lost[0].state.name
        return f"Stage {stage} is lost: {name} is unheard", "error", f"stage {stage} lost"
    if not plan.get("ready"):
        return f"Ring not ready: {plan.get('waiting') or 'waiting for its stages'}", "warning", "ring not ready"
    count = f"{len(rows)} stage{'s' if len(rows) != 1 else ''}"
    return f"Ring ready: {count}", "ok", f"ring ready · {count}"


def _stage_row(
    entry: Mapping[str, Any], states: Mapping[str, str], loads: Mapping[str, StageLoad], devices: Mapping[str, str]
) -> StageRow | None:
    if not isinstance(entry.get("stage"), int) or isinstance(entry.get("stage"), bool):
        return None
    node = entry.get("node")
    holder = None
    load = StageLoad()
    if node:
        state = str(entry.get("state") or "starting")
        if states.get(str(node)) in _GONE_MEMBER:
            state = "lost"  # it still announced its stage, but the fleet has not heard it since
        else:
            load = loads.get(str(node), load)  # a lost node's last figures are no longer true
        if load.device is None and str(node) in devices:
            load = replace(load, device=devices[str(node)])
        holder = Held(str(entry.get("name") or node), state, _percent(entry.get("progress")))
    standbys = tuple(
        Held(str(s.get("name") or s.get("node") or "?"), str(s.get("state") or "starting"), _percent(s.get("progress")))
        for s in (_mapping(x) for x in _sequence(entry.get("standbys")))
        if s is not None
    )
    return StageRow(
        int(entry["stage"]), holder, standbys, str(entry.get("reason") or ""), _layers(entry.get("layers")), load
    )


def _layers(value: object) -> tuple[int, int] | None:
    span = _sequence(value)
    if len(span) != 2 or not all(isinstance(n, int) and not isinstance(n, bool) for n in span):
        return None
    start, stop = span
    return (start, stop) if 0 <= start < stop else None


_DONOR_ROLES = {
    "draining": "its owner is back, its stage moves away",
    "away": "its owner is at the PC",
    "off": "not allowed to serve now (battery, schedule, load)",
}
"""A donor PC that stepped aside, in the fleet view's role column (``agent.donor.policy.DonorState``)."""


def _others(members: Mapping[str, Any] | None, plan: Mapping[str, Any], in_ring: set[str]) -> tuple[MemberRow, ...]:
    if members is None:
        return ()
    standing: dict[str, int] = {}
    for raw in _sequence(plan.get("stages")):
        entry = _mapping(raw) or {}
        for s in _sequence(entry.get("standbys")):
            if (standby := _mapping(s)) is not None and isinstance(entry.get("stage"), int):
                standing.setdefault(str(standby.get("node")), entry["stage"])
    rows = []
    for raw in _sequence(members.get("members")):
        member = _mapping(raw)
        if member is None or str(member.get("node")) in in_ring:
            continue
        node = str(member.get("node"))
        state = str(member.get("state") or "?")
        donor = str((_mapping(member.get("announces")) or {}).get("donor") or "serving")
        if node in standing:
            role = f"standby for stage {standing[node]}"
        elif state == "member" and donor != "serving":
            role = f"{donor}: {_DONOR_ROLES.get(donor, 'not serving now')}"
        elif state == "member":
            role = "spare: the plan needs no more PCs"
        else:
            role = str(member.get("why") or state)
        heard = member.get("last_heard")
        rows.append(
            MemberRow(
                name=str(member.get("name") or node),
                state=state,
                role=role,
                address=str(member.get("address") or ""),
                heard=f"{heard:.0f} s ago" if isinstance(heard, (int, float)) else "never",
                stuck=bool(member.get("clock")),
            )
        )
    return tuple(sorted(rows, key=lambda r: (r.health != "busy", r.name)))


def _summary(plan: Mapping[str, Any], members: Mapping[str, Any] | None) -> str:
    parts = []
    if plan.get("model"):
        parts.append(f"model {_model_name(str(plan['model']))}")
    if plan.get("hash"):
        parts.append(f"plan {str(plan['hash'])[:8]} epoch {plan.get('epoch')}")
    if plan.get("coordinator"):
        parts.append(f"coordinator {plan['coordinator']}")
    if members is not None and members.get("name"):
        parts.append(f"this PC {members['name']}")
    return " · ".join(parts)


def _model_name(model: str) -> str:
    """The last part of an export folder or Hub id, which is what people recognise."""
    return model.rstrip("/").rsplit("/", 1)[-1] or model


def _percent(value: object) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(mapping: Mapping[str, Any] | None, key: str) -> float | None:
    value = None if mapping is None else mapping.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _mapping(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _sequence(value: object) -> Sequence[Any]:
    return value if isinstance(value, list) else ()
