"""What a control link's handshake decides (``discovery.service``), as plain functions of what each side said and
showed: whether a peer is refused and why, and which of two processes with one identity keeps it."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from cryptography import x509

from agent.fleet.authority import cert_fingerprint, common_name, node_id_of
from discovery import control
from discovery.announcement import Announcement
from discovery.membership import Seniority

SAME_IDENTITY = "same identity"
"""What :func:`refusal` says of another process with this agent's own node id (the link's two hellos then
decide which process keeps it: :func:`duplicate_refusal`)."""
ITSELF = "self"
"""What :func:`refusal` says of this very process (a seed or gossip naming this agent's own address)."""


def refusal(
    der: bytes | None,
    peer: Announcement,
    me: Announcement,
    revoked: Collection[str],
    announced: Mapping[str, Announcement],
) -> str | None:
    """Why this agent (``me``) refuses a control link whose peer showed the certificate ``der`` and announced
    ``peer``, or None: a certificate of another node than announced, a revoked node, a second process of a node
    already linked here (``announced``: what each linked peer announced), this agent itself (:data:`ITSELF`),
    or another process with its identity (:data:`SAME_IDENTITY`)."""
    if der is None:
        return "no fleet certificate on the link"
    cert = x509.load_der_x509_certificate(der)
    node, fingerprint = node_id_of(cert), cert_fingerprint(cert)
    if peer.node != node or peer.fingerprint != fingerprint:
        return f"announces node {peer.node}, but its certificate ({common_name(cert)}) is node {node}"
    if peer.node == me.node:
        return ITSELF if peer.instance == me.instance else SAME_IDENTITY
    if peer.node in revoked:
        return f"node {peer.node} ({peer.name}) is revoked"
    held = announced.get(peer.node)
    if held is not None and held.instance != peer.instance:
        # the process linked first stays the member; had this one's link been taken, its goodbye on the
        # way out (a copy that loses stops) would have marked the node gone while the first one serves
        return (
            f"node {peer.node} ({peer.name}) is already linked here from another process: two agents run "
            "with one identity folder (a copy), or this is a restart before the old link timed out"
        )
    return None


def seniority(hello: control.Hello) -> Seniority:
    """How long the process that said ``hello`` has been a member and up (which of two with one identity stays)."""
    return Seniority(hello.announcement.instance, hello.member_for, hello.up_for)


def duplicate_refusal(peer: Announcement, keep: bool) -> str:
    """What this agent tells another process with its own identity (``keep``: this agent keeps it)."""
    verdict = "this agent keeps it, yours stops" if keep else "yours keeps it, this agent stops"
    return (
        f"node {peer.node} is this agent's own identity: two agents run with one identity folder (a copy); the one "
        f"a member accepted first keeps it ({verdict}); enroll the PC that stops with `shoal join`"
    )
