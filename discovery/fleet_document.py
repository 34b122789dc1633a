"""The fleet document: what the fleet's admin decides, typed, versioned and signed by the fleet CA.

The admin decides three things and the agents decide everything else (``discovery.placement``):

- which model the fleet serves (:class:`ModelSource`: a Hub repository pinned to a commit, or a local export);
- pins (:class:`Pin`): a stage that must (``required``) or should (preferred) run on a named PC;
- how many standbys each stage keeps (:class:`StandbyPolicy`).

It travels like the revocation list (``agent.fleet.revocation``): the body's canonical JSON (sorted keys,
no spaces, ASCII) as a string, with an ECDSA-SHA256 signature of exactly those bytes by the fleet CA key::

    {"schema": 1, "body": "{\\"fleet_id\\":...,\\"version\\":4,...}", "signature": "<base64 DER ECDSA signature>"}

The body travels as a string so that a verifier checks the very bytes that were signed, whatever JSON library
re-encodes the outer document. Every node holds the CA certificate, so any node can check a document a peer
hands it and keep the one with the highest ``version``; nobody without the CA key can write one.
The envelope is ``agent.fleet.signed``'s, shared with the revocation list.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from typing import Any

from agent.errors import FleetError
from agent.files import parse_utc, utc_iso
from agent.fleet.authority import FLEET_ID_RE, NODE_NAME_RE
from agent.fleet.signed import SignedDocument
from agent.wire.jsonbody import canonical_json, loads_json

_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?")
"""A Hub repository id: ``name`` or ``owner/name``."""
_COMMIT = re.compile(r"[0-9a-f]{40}")
"""A Hub revision pinned to a commit: a branch or tag moves, and every member must load the same weights."""
_BODY_KEYS = {"fleet_id", "version", "issued_at", "model", "pins", "standby"}


# -- what the admin decides ------------------------------------------------------------------------
@dataclass(frozen=True)
class Pin:
    """Stage ``stage`` on the PC ``node`` (a node id, or a node name as enrolled).

    ``required``: on that node or nowhere (the stage stays uncovered while the node cannot hold it). Otherwise
    preferred: honoured while the node can hold the stage, else the stage is placed automatically, and the
    plan says why the pin was not honoured.
    """

    node: str
    stage: int
    required: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.node, str) or not NODE_NAME_RE.fullmatch(self.node):
            raise FleetError(f"a pin names a node id or node name, not {self.node!r}")
        if isinstance(self.stage, bool) or not isinstance(self.stage, int) or self.stage < 0:
            raise FleetError(f"a pin's stage is a stage index (0 or more), not {self.stage!r}")
        if not isinstance(self.required, bool):
            raise FleetError(f"a pin is required or not (true/false), not {self.required!r}")

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "stage": self.stage, "required": self.required}


@dataclass(frozen=True)
class StandbyPolicy:
    """How many spare PCs stand by for each stage, its files at hand, to take over when its node is lost."""

    per_stage: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.per_stage, bool) or not isinstance(self.per_stage, int) or self.per_stage < 0:
            raise FleetError(f"standbys per stage must be 0 or more, not {self.per_stage!r}")

    def to_json(self) -> dict[str, Any]:
        return {"per_stage": self.per_stage}


@dataclass(frozen=True)
class ModelSource:
    """The model the fleet serves: a Hub repository at one commit, or an export folder (exactly one of them).

    A Hub revision must be a commit (40 hex digits): a branch moves, and a ring whose members loaded two
    revisions computes nonsense.
    """

    repo_id: str | None = None
    revision: str | None = None
    export_dir: str | None = None

    def __post_init__(self) -> None:
        if self.export_dir is not None:
            if self.repo_id is not None or self.revision is not None:
                raise FleetError("a model is a Hub repository or an export folder, not both")
            if not isinstance(self.export_dir, str) or not self.export_dir or not self.export_dir.isprintable():
                raise FleetError(f"invalid export folder {self.export_dir!r}")
            return
        if self.repo_id is None:
            raise FleetError("a model needs a Hub repository (with its commit) or an export folder")
        if not isinstance(self.repo_id, str) or not _REPO_ID.fullmatch(self.repo_id):
            raise FleetError(f"invalid Hub repository id {self.repo_id!r} (expected owner/name)")
        if not isinstance(self.revision, str) or not _COMMIT.fullmatch(self.revision):
            raise FleetError(
                f"the Hub model {self.repo_id} must be pinned to a commit (40 lowercase hex digits), "
                f"not {self.revision!r}: a branch or tag can move under a running fleet"
            )

    def to_json(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "revision": self.revision, "export_dir": self.export_dir}

    def __str__(self) -> str:
        return self.export_dir if self.export_dir is not None else f"{self.repo_id}@{self.revision}"


@dataclass(frozen=True)
class FleetDocument(SignedDocument):
    """The admin's decisions for one fleet; ``version`` grows by one with every change (the highest wins).

    ``issued_at`` is kept in UTC to the second (as every fleet file writes a moment). ``pins`` are kept sorted
    by stage, so that two documents saying the same thing are equal and sign the same bytes.
    """

    WHAT = "the fleet document"
    KINDS = "the fleet documents"

    fleet_id: str
    version: int
    issued_at: dt.datetime
    model: ModelSource | None = None
    pins: tuple[Pin, ...] = ()
    standby: StandbyPolicy = field(default_factory=StandbyPolicy)

    def __post_init__(self) -> None:
        if not isinstance(self.fleet_id, str) or not FLEET_ID_RE.fullmatch(self.fleet_id):
            raise FleetError(f"invalid fleet id {self.fleet_id!r} in a fleet document")
        if isinstance(self.version, bool) or not isinstance(self.version, int) or self.version < 0:
            raise FleetError(f"invalid fleet document version {self.version!r}")
        if not isinstance(self.issued_at, dt.datetime) or self.issued_at.tzinfo is None:
            raise FleetError("a fleet document's issue time must be a moment in UTC")
        if self.model is not None and not isinstance(self.model, ModelSource):
            raise FleetError(f"a fleet document's model is a ModelSource, not {self.model!r}")
        if not isinstance(self.standby, StandbyPolicy):
            raise FleetError(f"a fleet document's standby policy is a StandbyPolicy, not {self.standby!r}")
        pins = tuple(self.pins)
        if not all(isinstance(p, Pin) for p in pins):
            raise FleetError("a fleet document's pins must be Pins")
        _check_pins(pins)
        object.__setattr__(self, "issued_at", self.issued_at.astimezone(dt.UTC).replace(microsecond=0))
        object.__setattr__(self, "pins", tuple(sorted(pins, key=lambda p: (p.stage, p.node))))

    @classmethod
    def empty(cls, fleet_id: str, now: dt.datetime) -> FleetDocument:
        """Version 0: no model chosen, no pins, the default standby policy."""
        return cls(fleet_id, 0, now)

    def pin_of(self, node: str) -> Pin | None:
        """The pin naming ``node`` (as written in the document), if any."""
        return next((p for p in self.pins if p.node == node), None)

    def body(self) -> bytes:
        """The canonical JSON that is signed."""
        doc = {
            "fleet_id": self.fleet_id,
            "version": self.version,
            "issued_at": utc_iso(self.issued_at),
            "model": None if self.model is None else self.model.to_json(),
            "pins": [p.to_json() for p in self.pins],
            "standby": self.standby.to_json(),
        }
        return canonical_json(doc)

    @classmethod
    def _from_body(cls, body: bytes) -> FleetDocument:
        # Signed by our CA, so malformed only through a bug or a newer shoal; still checked field by field.
        try:
            doc: Any = loads_json(body)
            if not isinstance(doc, dict) or set(doc) != _BODY_KEYS:
                raise ValueError(f"expected the keys {', '.join(sorted(_BODY_KEYS))}")
            if not isinstance(doc["fleet_id"], str) or not isinstance(doc["issued_at"], str):
                raise ValueError("fleet_id and issued_at must be strings")
            return cls(
                doc["fleet_id"],
                doc["version"],
                parse_utc(doc["issued_at"], "issued_at"),
                _model(doc["model"]),
                tuple(_pin(p) for p in _list(doc["pins"], "pins")),
                _standby(doc["standby"]),
            )
        except (FleetError, ValueError) as exc:
            raise FleetError(f"the fleet document is malformed: {exc}") from exc


def _check_pins(pins: tuple[Pin, ...]) -> None:
    by_node: dict[str, Pin] = {}
    by_stage: dict[int, Pin] = {}
    for pin in pins:
        if pin.node in by_node:
            raise FleetError(
                f"{pin.node} is pinned twice (stages {by_node[pin.node].stage} and {pin.stage}): a PC serves one stage"
            )
        if pin.stage in by_stage:
            raise FleetError(
                f"stage {pin.stage} is pinned twice ({by_stage[pin.stage].node} and {pin.node}): a stage runs on one PC"
            )
        by_node[pin.node], by_stage[pin.stage] = pin, pin


def _list(value: object, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{what} is not a list")
    return value


def _object(value: object, keys: set[str], what: str) -> dict[str, Any]:
    if not isinstance(value, dict) or set(value) != keys:
        raise ValueError(f"{what} must have exactly the keys {', '.join(sorted(keys))}")
    return value


def _pin(value: object) -> Pin:
    item = _object(value, {"node", "stage", "required"}, "a pin")
    return Pin(item["node"], item["stage"], item["required"])


def _model(value: object) -> ModelSource | None:
    if value is None:
        return None
    item = _object(value, {"repo_id", "revision", "export_dir"}, "the model")
    return ModelSource(item["repo_id"], item["revision"], item["export_dir"])


def _standby(value: object) -> StandbyPolicy:
    return StandbyPolicy(_object(value, {"per_stage"}, "the standby policy")["per_stage"])


# -- the next version ------------------------------------------------------------------------------
def with_pin(doc: FleetDocument, pin: Pin, now: dt.datetime) -> FleetDocument:
    """The next version with ``pin``, replacing any pin of the same node or of the same stage (a PC serves one
    stage and a stage runs on one PC, so the new pin is what the admin means now)."""
    kept = tuple(p for p in doc.pins if p.node != pin.node and p.stage != pin.stage)
    return _next(doc, now, pins=(*kept, pin))


def without_pin(doc: FleetDocument, node: str, now: dt.datetime) -> FleetDocument:
    """The next version without the pin of ``node``; :class:`FleetError` listing the pins if it has none."""
    pin = doc.pin_of(node)
    if pin is None:
        pinned = ", ".join(f"{p.node} (stage {p.stage})" for p in doc.pins) or "none"
        raise FleetError(f"{node} has no pin in fleet document version {doc.version} (pinned: {pinned})")
    return without_pins(doc, (pin,), now)


def without_pins(doc: FleetDocument, pins: Collection[Pin], now: dt.datetime) -> FleetDocument:
    """The next version without ``pins`` (those of them it has)."""
    return _next(doc, now, pins=tuple(p for p in doc.pins if p not in pins))


def serving(doc: FleetDocument, model: ModelSource | None, now: dt.datetime) -> FleetDocument:
    """The next version serving ``model`` (None: the fleet serves nothing until a model is chosen)."""
    return _next(doc, now, model=model)


def with_standby(doc: FleetDocument, standby: StandbyPolicy, now: dt.datetime) -> FleetDocument:
    """The next version with the standby policy ``standby``."""
    return _next(doc, now, standby=standby)


def _next(doc: FleetDocument, now: dt.datetime, **changes: Any) -> FleetDocument:
    return replace(doc, version=doc.version + 1, issued_at=now, **changes)
