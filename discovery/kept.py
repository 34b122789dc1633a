"""``Kept``: the newest validly signed fleet document of one kind an agent knows, kept across restarts.

Two documents travel this way (``discovery.control``): the revocation list (``agent.fleet.revocation``) and
the fleet document (``discovery.fleet_document``). Each agent keeps the newest one the fleet CA signed, in a
file beside its identity, and refuses anything unsigned, badly signed, of another fleet or older.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Generic, Protocol, Self, TypeVar

from cryptography import x509

from agent.errors import FleetError
from agent.files import write_atomic
from agent.fleet.revocation import RevocationList
from discovery.fleet_document import FleetDocument

log = logging.getLogger(__name__)

REVOCATIONS_FILE = "revocations.json"
FLEET_FILE = "fleet.json"


class Versioned(Protocol):
    """A signed document: its version grows with every change, and the higher one replaces the other."""

    @property
    def version(self) -> int: ...

    def is_newer_than(self, other: Self | None) -> bool: ...


D = TypeVar("D", bound=Versioned)


class Kept(Generic[D]):
    """Holds :attr:`current` (None: none received yet) and its signed :attr:`document`."""

    def __init__(self, path: Path, ca: x509.Certificate, verify: Callable[[bytes, x509.Certificate], D]) -> None:
        self.path = path
        self._ca = ca
        self._verify = verify
        self.current: D | None = None
        self.document: bytes | None = None

    @classmethod
    def load(cls, path: Path, ca: x509.Certificate, verify: Callable[[bytes, x509.Certificate], D]) -> Kept[D]:
        """The keeper of the file ``path``; a damaged file is logged and ignored (a peer sends the document
        again). Blocking: call it off the event loop."""
        keeper = cls(path, ca, verify)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return keeper
        except OSError as exc:
            log.warning("cannot read %s: %s", path, exc)
            return keeper
        try:
            keeper.current, keeper.document = verify(data, ca), data
        except FleetError as exc:
            log.warning("ignored %s: %s", path, exc)
        return keeper

    @property
    def version(self) -> int:
        return self.current.version if self.current is not None else 0

    def verify(self, document: bytes) -> D:
        """The document in ``document``; :class:`FleetError` if it is not validly signed by this fleet's CA."""
        return self._verify(document, self._ca)

    def check(self, document: bytes) -> D | None:
        """The document in ``document`` if it is validly signed and newer than the one held, None if it is not
        newer; :class:`FleetError` if it is not validly signed by this fleet's CA."""
        offered = self.verify(document)
        return offered if offered.is_newer_than(self.current) else None

    def keep(self, offered: D, document: bytes) -> None:
        """Hold (and write) a document that :meth:`check` returned. Blocking: call it off the event loop."""
        write_atomic(self.path, document, private=False)
        self.current, self.document = offered, document


RevocationKeeper = Kept[RevocationList]
FleetDocumentKeeper = Kept[FleetDocument]


def revocation_keeper(folder: Path, ca: x509.Certificate) -> RevocationKeeper:
    """The revocation list kept in the identity folder ``folder``. Blocking."""
    return Kept.load(folder / REVOCATIONS_FILE, ca, RevocationList.verify)


def fleet_document_keeper(folder: Path, ca: x509.Certificate) -> FleetDocumentKeeper:
    """The fleet document kept in the identity folder ``folder``. Blocking."""
    return Kept.load(folder / FLEET_FILE, ca, FleetDocument.verify)
