"""A plan as it travels on the control channel: the placement, and what it was planned for.

The coordinator (``discovery.plan_service``) sends its plan to every member as a ``plan`` message
(``discovery.control.PlanOffer``)::

    {"schema": 1, "coordinator": NODE, "document": FLEET DOCUMENT VERSION, "export": EXPORT ID,
     "hash": SHA256, "epoch": N, "bottleneck": 1.5, "probation": [NODE, ...], "quorum": true,
     "assignments": [{"stage": 0, "node": NODE | null, "standbys": [NODE, ...], "reason": "..."}, ...],
     "pins": [{"node": ..., "stage": ..., "required": ..., "honoured": ..., "reason": "..."}, ...]}

A reader rebuilds the :class:`~discovery.placement.Plan` and checks that its hash is the one sent: the same
placement hashes the same in every process, so a mismatch is a corrupt or foreign message. ``quorum`` (how
the plan ranks when two sides of a partition meet: ``discovery.plan_service.supersedes``) is read as ``true``
when absent, as a sender from before it meant.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from agent.errors import FleetError, RemoteProtocolError
from discovery.fleet_document import Pin
from discovery.placement import Assignment, PinOutcome, Plan

SCHEMA = 1


@dataclass(frozen=True)
class PlanRecord:
    """A plan, who computed it, and for which fleet document version and export."""

    plan: Plan
    coordinator: str
    document: int
    export: str
    quorum: bool = True
    """Whether its coordinator planned it seeing a majority of the fleet it knew, on from a plan that did too
    (``discovery.plan_service.planned_with_quorum``): a plan made by a node cut off alone never wins over the
    fleet's on reconnect."""

    def to_json(self) -> dict[str, Any]:
        plan = self.plan
        return {
            "schema": SCHEMA,
            "coordinator": self.coordinator,
            "document": self.document,
            "export": self.export,
            "hash": plan.hash,
            "epoch": plan.epoch,
            "bottleneck": plan.bottleneck,
            "probation": sorted(plan.probation),
            "quorum": self.quorum,
            "assignments": [
                {"stage": a.stage, "node": a.node, "standbys": list(a.standbys), "reason": a.reason}
                for a in plan.assignments
            ],
            "pins": [
                {
                    "node": o.pin.node,
                    "stage": o.pin.stage,
                    "required": o.pin.required,
                    "honoured": o.honoured,
                    "reason": o.reason,
                }
                for o in plan.pins
            ],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlanRecord:
        """The record in ``data``; :class:`RemoteProtocolError` if it is malformed or its hash is wrong."""
        try:
            if data.get("schema") != SCHEMA:
                raise ValueError(f"schema {data.get('schema')!r}, this shoal reads {SCHEMA}")
            assignments = tuple(
                Assignment(
                    _int(a["stage"]),
                    None if a["node"] is None else _str(a["node"]),
                    tuple(_str(n) for n in a["standbys"]),
                    _str(a["reason"]),
                )
                for a in data["assignments"]
            )
            pins = tuple(
                PinOutcome(Pin(p["node"], p["stage"], p["required"]), bool(p["honoured"]), _str(p["reason"]))
                for p in data["pins"]
            )
            plan = Plan(
                assignments,
                pins,
                epoch=_int(data["epoch"]),
                bottleneck=float(data["bottleneck"]),
                probation=frozenset(_str(n) for n in data["probation"]),
            )
            record = cls(
                plan,
                _str(data["coordinator"]),
                _int(data["document"]),
                _str(data["export"]),
                _bool(data.get("quorum", True)),
            )
        except (KeyError, TypeError, ValueError, OverflowError, FleetError) as exc:  # FleetError: a bad pin
            raise RemoteProtocolError(f"malformed plan: {exc}") from exc
        if plan.hash != data.get("hash"):
            raise RemoteProtocolError(f"the plan's hash is {plan.hash[:12]}, not the {str(data.get('hash'))[:12]} sent")
        return record


def _int(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, not {value!r}")
    return value


def _bool(value: object) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"expected true or false, not {value!r}")
    return value


def _str(value: object) -> str:
    if not isinstance(value, str) or len(value) > 1000:
        raise ValueError(f"expected a string, not {value!r}")
    return value
