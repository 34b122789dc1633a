"""The two signed documents an agent keeps beside its identity (``agent.fleet.signed.Kept``), across restarts.

Both travel between agents (``discovery.control``): the revocation list (``agent.fleet.revocation``) and the
fleet document (``discovery.fleet_document``). Each agent keeps the newest one the fleet CA signed, and refuses
anything unsigned, badly signed, of another fleet or older.
"""

from __future__ import annotations

from pathlib import Path

from cryptography import x509

from agent.fleet.revocation import RevocationList
from agent.fleet.signed import Kept
from discovery.fleet_document import FleetDocument

REVOCATIONS_FILE = "revocations.json"
FLEET_FILE = "fleet.json"


RevocationKeeper = Kept[RevocationList]
FleetDocumentKeeper = Kept[FleetDocument]


def revocation_keeper(folder: Path, ca: x509.Certificate) -> RevocationKeeper:
    """The revocation list kept in the identity folder ``folder``. Blocking."""
    return Kept.load(folder / REVOCATIONS_FILE, ca, RevocationList.verify)


def fleet_document_keeper(folder: Path, ca: x509.Certificate) -> FleetDocumentKeeper:
    """The fleet document kept in the identity folder ``folder``. Blocking."""
    return Kept.load(folder / FLEET_FILE, ca, FleetDocument.verify)
