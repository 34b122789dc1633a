"""What the fleet view shows, computed from one status document of the local agent (a pure function).

The status has a section per part of the agent: ``plan`` (``discovery/plan_service.py``: the plan's stages
with the node, state and download percent of each, their standbys), ``members`` (``discovery/service.py``:
every peer this agent knows, with its state), ``ring`` (what this agent does for the plan) and ``chat``.
A hand-wired agent (``--stage``/``--next``) has none of the fleet's sections. Nothing here trusts the
document's shape: a missing or odd field shows as unknown, it never raises.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
class StageRow:
    stage: int
    holder: Held | None
    """None: no member covers the stage."""
    standbys: tuple[Held, ...]
    reason: str

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

    @property
    def health(self) -> Health:
        return "bad" if self.state in _GONE_MEMBER else "busy" if self.role.startswith("standby") else "idle"


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


WAITING = FleetReport("Asking the agent for the fleet's state…", "warning", "asking the agent…", reachable=False)


def unreachable(error: str) -> FleetReport:
    return FleetReport(f"Agent unreachable: {error}", "error", "agent unreachable", reachable=False)


def fleet_report(status: Mapping[str, Any]) -> FleetReport:
    """The report of one status document (``StatusLink.get``)."""
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
    entries = [entry for entry in (_mapping(raw) for raw in _sequence(plan.get("stages"))) if entry is not None]
    rows = tuple(row for row in (_stage_row(entry, states) for entry in entries) if row is not None)
    in_ring = {str(entry.get("node")) for entry in entries if entry.get("node")}
    banner, severity, headline = _banner(plan, rows)
    return FleetReport(
        banner,
        severity,
        headline,
        summary=_summary(plan, members),
        stages=rows,
        others=_others(members, plan, in_ring),
        ready=bool(plan.get("ready")),
    )


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


def _stage_row(entry: Mapping[str, Any], states: Mapping[str, str]) -> StageRow | None:
    if not isinstance(entry.get("stage"), int):
        return None
    node = entry.get("node")
    holder = None
    if node:
        state = str(entry.get("state") or "starting")
        if states.get(str(node)) in _GONE_MEMBER:
            state = "lost"  # it still announced its stage, but the fleet has not heard it since
        holder = Held(str(entry.get("name") or node), state, _percent(entry.get("progress")))
    standbys = tuple(
        Held(str(s.get("name") or s.get("node") or "?"), str(s.get("state") or "starting"), _percent(s.get("progress")))
        for s in (_mapping(x) for x in _sequence(entry.get("standbys")))
        if s is not None
    )
    return StageRow(int(entry["stage"]), holder, standbys, str(entry.get("reason") or ""))


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
        if node in standing:
            role = f"standby for stage {standing[node]}"
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


def _mapping(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


def _sequence(value: object) -> Sequence[Any]:
    return value if isinstance(value, list) else ()
