"""The fleet's private CA and the node identities (certificate + key + CA copy) it issues."""

from agent.fleet.authority import (
    FleetPaths,
    NodeIdentity,
    cert_fingerprint,
    common_name,
    init_fleet,
    issue_node,
    read_certificate,
    validate_node_name,
)

__all__ = [
    "FleetPaths",
    "NodeIdentity",
    "cert_fingerprint",
    "common_name",
    "init_fleet",
    "issue_node",
    "read_certificate",
    "validate_node_name",
]
