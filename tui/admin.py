"""The fleet admin's side of the TUI: what an :class:`AdminSource` does, and the plain values it answers with.

Only a user holding the fleet's CA key (the folder ``shoal fleet init`` made) administers the fleet, so the app
gets a source only then. The real one (``agent/cli/chat_admin.py``) runs the code of ``shoal pin``,
``shoal unpin``, ``shoal fleet list``, ``shoal fleet token`` and ``shoal fleet revoke`` on that folder and hands
each change to this PC's agent, which gossips it; this package sees none of that (the TUI never imports the
transport), only this protocol. Tests hand in a fake, or the real source on a temporary fleet folder.

Failures arrive as :class:`~agent.errors.ShoalError` (a pin of a node name that cannot be one, revoking a node
revoked already...), whose message says what to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

Severity = Literal["ok", "warning", "error"]


@dataclass(frozen=True)
class PinEntry:
    """A pin of the fleet document: stage ``stage`` on ``node`` (a node name or id)."""

    node: str
    stage: int
    required: bool

    @property
    def kind(self) -> str:
        return "required" if self.required else "preferred"


@dataclass(frozen=True)
class EnrolledEntry:
    """An enrolled node certificate, as ``shoal fleet list`` lists it."""

    name: str
    node_id: str
    fingerprint: str
    enrolled_at: str
    """UTC, ``YYYY-MM-DD HH:MM``."""
    how: str
    """``issued`` (``shoal fleet issue``) or ``token <id>`` (``shoal join``)."""
    revoked: bool


@dataclass(frozen=True)
class AdminOverview:
    """What the admin screen lists: the fleet document's pins and the enrolled nodes."""

    fleet_dir: str
    version: int
    """The fleet document's version (0: none written yet)."""
    model: str | None
    pins: tuple[PinEntry, ...] = ()
    nodes: tuple[EnrolledEntry, ...] = ()
    note: str = ""
    """Why a list is empty, when it says something (no node enrolled yet)."""


@dataclass(frozen=True)
class JoinInvite:
    """A join token, as the command the new PC runs."""

    command: str
    """``shoal join TOKEN@HOST:PORT``: what the user copies."""
    token_id: str
    expires: str
    """UTC, ``YYYY-MM-DD HH:MM``."""
    uses: int
    note: str = ""
    """What must run for the token to be redeemed (the enrollment server), or what to pass to reach this PC."""


@dataclass(frozen=True)
class AdminOutcome:
    """What a change did: written into the fleet folder, and handed to this PC's agent or why not."""

    text: str
    severity: Severity = "ok"
    """``warning``: written, but not handed to a running agent (the fleet learns it when one takes it), or a
    revocation left a void pin in the fleet document."""


class AdminSource(Protocol):
    async def overview(self) -> AdminOverview:
        """The pins and the enrolled nodes now."""
        ...

    async def pin(self, node: str, stage: int, prefer: bool) -> AdminOutcome:
        """Pin ``stage`` to ``node`` (required, or preferred with ``prefer``), as ``shoal pin`` does."""
        ...

    async def unpin(self, node: str) -> AdminOutcome:
        """Remove ``node``'s pin, as ``shoal unpin`` does."""
        ...

    async def token(self) -> JoinInvite:
        """A new join token for one PC, valid a day, as ``shoal fleet token`` makes it."""
        ...

    async def revoke(self, node: str, drop_pins: bool = False) -> AdminOutcome:
        """Revoke ``node`` (a node name or id), as ``shoal fleet revoke`` does; ``drop_pins``: and remove the pins
        that name only it (``--drop-pins``)."""
        ...
