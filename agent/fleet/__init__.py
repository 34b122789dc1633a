"""The fleet's private CA, the node identities (certificate + key + CA copy) it issues, enrollment with
one-time join tokens (``agent.fleet.enrollment``) and the signed revocation list (``agent.fleet.revocation``)."""

from agent.fleet.authority import (
    EnrolledNode,
    FleetPaths,
    NodeIdentity,
    cert_fingerprint,
    common_name,
    enrolled_nodes,
    fleet_id_of,
    init_fleet,
    issue_node,
    node_id_of,
    read_certificate,
    spki_sha256,
    validate_node_name,
)
from agent.fleet.enrollment import (
    EnrollmentServer,
    JoinToken,
    create_token,
    join,
    parse_join_address,
)
from agent.fleet.revocation import RevocationList, RevokedNode, load_revocations, revoke_node

__all__ = [
    "EnrolledNode",
    "EnrollmentServer",
    "FleetPaths",
    "JoinToken",
    "NodeIdentity",
    "RevocationList",
    "RevokedNode",
    "cert_fingerprint",
    "common_name",
    "create_token",
    "enrolled_nodes",
    "fleet_id_of",
    "init_fleet",
    "issue_node",
    "join",
    "load_revocations",
    "node_id_of",
    "parse_join_address",
    "read_certificate",
    "revoke_node",
    "spki_sha256",
    "validate_node_name",
]
