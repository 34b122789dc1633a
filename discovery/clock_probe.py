"""What the membership service's clock probes learn (``discovery.service``): a peer whose certificate failed on
its dates by this PC's clock is dialled once more without the dates, the two tell each other the time, and
``discovery.clocks`` judges whose clock is wrong. Here: that judgement for one probe, and what was learnt of each
peer not linked since."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from cryptography import x509

from agent.errors import RemoteProtocolError
from agent.fleet.authority import cert_fingerprint, node_id_of
from discovery.announcement import Announcement
from discovery.clocks import Validity, clock_problem


@dataclass(frozen=True)
class ClockReading:
    """What a clock probe learnt of a peer: its wall clock minus ours (seconds), and why the two cannot link
    (None: they can)."""

    skew: float
    problem: str | None


class ClockProbes:
    """The readings of this agent's clock probes, by peer; ``certificates``: this agent's certificate and the
    fleet CA's, whose dates a peer's clock is checked against (None: no probes)."""

    def __init__(self, certificates: tuple[x509.Certificate, x509.Certificate] | None) -> None:
        self.certificates = certificates
        self.readings: dict[str, ClockReading] = {}
        """What the clock probe learnt of each peer not linked since (the links' own skews are on the links)."""
        self._told: set[str] = set()
        """Peers whose clock problem was logged at warning (later ones go to debug)."""

    def judge(
        self,
        me: Announcement,
        peer: Announcement,
        der: bytes | None,
        their_time: float,
        now: float,
        revoked: Collection[str],
    ) -> str | None:
        """Record what ``peer`` (its certificate ``der``, its wall clock ``their_time`` against ours, ``now``) means
        for linking with ``me``; returns why the two cannot link, or None. :class:`RemoteProtocolError` if the
        certificate is another node's than the peer announced."""
        if der is None or self.certificates is None:
            return None
        cert = x509.load_der_x509_certificate(der)
        if peer.node != node_id_of(cert) or peer.fingerprint != cert_fingerprint(cert):
            raise RemoteProtocolError(f"announces node {peer.node}, but its certificate is node {node_id_of(cert)}")
        if peer.node == me.node or peer.node in revoked:
            return None
        mine, ca = self.certificates
        problem = clock_problem(me.name, peer.name, now, their_time, Validity.of(mine, ca), Validity.of(cert, ca))
        self.readings[peer.node] = ClockReading(their_time - now, problem)
        return problem

    def first_told(self, node: str) -> bool:
        """Whether ``node``'s clock problem is told for the first time (logged at warning; later ones at debug)."""
        first = node not in self._told
        self._told.add(node)
        return first
