"""``RevocationKeeper``: the newest validly signed revocation list an agent knows, kept across restarts.

Members gossip the list (``discovery.control``); each keeps the newest one the fleet CA signed, in a file
beside its identity, and refuses anything unsigned, badly signed, of another fleet or older.
"""

from __future__ import annotations

import logging
from pathlib import Path

from cryptography import x509

from agent.errors import FleetError
from agent.fleet.authority import write_atomic
from agent.fleet.revocation import RevocationList

log = logging.getLogger(__name__)

FILE = "revocations.json"


class RevocationKeeper:
    """Holds :attr:`current` (None: nothing revoked yet) and its signed :attr:`document`."""

    def __init__(self, path: Path, ca: x509.Certificate) -> None:
        self.path = path
        self._ca = ca
        self.current: RevocationList | None = None
        self.document: bytes | None = None

    @classmethod
    def load(cls, folder: Path, ca: x509.Certificate) -> RevocationKeeper:
        """The keeper of ``folder/revocations.json``; a damaged file is logged and ignored (a peer sends the
        list again). Blocking: call it off the event loop."""
        keeper = cls(folder / FILE, ca)
        try:
            data = keeper.path.read_bytes()
        except FileNotFoundError:
            return keeper
        except OSError as exc:
            log.warning("cannot read the revocation list %s: %s", keeper.path, exc)
            return keeper
        try:
            keeper.current, keeper.document = RevocationList.verify(data, ca), data
        except FleetError as exc:
            log.warning("ignored the revocation list %s: %s", keeper.path, exc)
        return keeper

    @property
    def version(self) -> int:
        return self.current.version if self.current is not None else 0

    def check(self, document: bytes) -> RevocationList | None:
        """The list in ``document`` if it is validly signed and newer than the one held, None if it is not
        newer; :class:`FleetError` if it is not validly signed by this fleet's CA."""
        offered = RevocationList.verify(document, self._ca)
        return offered if offered.is_newer_than(self.current) else None

    def keep(self, revocations: RevocationList, document: bytes) -> None:
        """Hold (and write) a list that :meth:`check` returned. Blocking: call it off the event loop."""
        write_atomic(self.path, document, private=False)
        self.current, self.document = revocations, document
