"""The signed revocation list, ``revoke_node`` and ``shoal fleet list`` / ``revoke`` (no network)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest

from agent.cli.fleet_cmd import NodeRow, merge_live_state
from agent.cli.main import main
from agent.errors import FleetError
from agent.fleet import (
    RevocationList,
    RevokedNode,
    enrolled_nodes,
    fleet_id_of,
    init_fleet,
    issue_node,
    load_revocations,
    read_certificate,
    revoke_node,
)
from agent.fleet.authority import load_ca

NOW = dt.datetime(2030, 5, 1, 12, 0, tzinfo=dt.UTC)


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    init_fleet(tmp_path / "fleet", "ours")
    return tmp_path / "fleet"


def sample(fleet: Path, version: int = 3) -> RevocationList:
    ca = read_certificate(fleet / "ca.pem")
    gone = RevokedNode("0123456789ab", "sha256:" + "ab" * 32, "pc-7", NOW)
    return RevocationList(fleet_id_of(ca), version, NOW, (gone,))


def test_signature_round_trip(fleet: Path) -> None:
    ca_key, ca = load_ca(fleet)
    revocations = sample(fleet)
    document = revocations.sign(ca_key)
    assert RevocationList.verify(document, ca) == revocations
    doc = json.loads(document)
    assert set(doc) == {"schema", "body", "signature"} and doc["schema"] == 1
    body = doc["body"]
    assert body == json.dumps(json.loads(body), sort_keys=True, separators=(",", ":"))  # canonical
    assert revocations.revokes("sha256:" + "ab" * 32) and not revocations.revokes("sha256:" + "cd" * 32)
    assert revocations.revokes_node("0123456789ab") and not revocations.revokes_node("ba9876543210")


def test_tampered_body_is_refused(fleet: Path) -> None:
    ca_key, ca = load_ca(fleet)
    doc = json.loads(sample(fleet).sign(ca_key))
    for change in (lambda b: b.replace("pc-7", "pc-8"), lambda b: b.replace('"version":3', '"version":9')):
        forged = dict(doc, body=change(doc["body"]))
        assert forged["body"] != doc["body"]
        with pytest.raises(FleetError, match="signature is not the fleet CA's"):
            RevocationList.verify(json.dumps(forged).encode(), ca)


def test_signed_by_another_ca_is_refused(fleet: Path, tmp_path: Path) -> None:
    init_fleet(tmp_path / "theirs", "theirs")
    their_key, their_ca = load_ca(tmp_path / "theirs")
    _, ca = load_ca(fleet)
    # our list, signed with their key
    with pytest.raises(FleetError, match="signature is not the fleet CA's"):
        RevocationList.verify(sample(fleet).sign(their_key), ca)
    # their own valid list, shown to us
    theirs = RevocationList.empty(fleet_id_of(their_ca), NOW).sign(their_key)
    with pytest.raises(FleetError, match="signature is not the fleet CA's"):
        RevocationList.verify(theirs, ca)
    # a list that names their fleet though signed by our CA (a bug's list): the fleet id is checked too
    ours_key, _ = load_ca(fleet)
    mislabelled = RevocationList(fleet_id_of(their_ca), 1, NOW).sign(ours_key)
    with pytest.raises(FleetError, match=f"for fleet {fleet_id_of(their_ca)}, not this fleet"):
        RevocationList.verify(mislabelled, ca)


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (b"not json", "not JSON"),
        (b"[]", "not a JSON object"),
        (b'{"schema": 2, "body": "{}", "signature": "AA=="}', "schema 2"),
        (b'{"schema": 1, "body": "{}"}', "no signature"),
        (b'{"schema": 1, "body": "{}", "signature": "***"}', "not base64"),
    ],
)
def test_malformed_documents_are_refused(fleet: Path, document: bytes, message: str) -> None:
    with pytest.raises(FleetError, match=message):
        RevocationList.verify(document, read_certificate(fleet / "ca.pem"))


def test_versions(fleet: Path, tmp_path: Path) -> None:
    older, newer = sample(fleet, 2), sample(fleet, 3)
    assert newer.is_newer_than(older) and not older.is_newer_than(newer)
    assert not newer.is_newer_than(newer)
    assert newer.is_newer_than(None)
    init_fleet(tmp_path / "theirs", "theirs")
    theirs = RevocationList.empty(fleet_id_of(read_certificate(tmp_path / "theirs" / "ca.pem")))
    with pytest.raises(FleetError, match="cannot compare"):
        newer.is_newer_than(theirs)
    with pytest.raises(FleetError, match="version"):
        RevocationList(older.fleet_id, -1, NOW)


def test_revoke_node(fleet: Path) -> None:
    ca = read_certificate(fleet / "ca.pem")
    assert load_revocations(fleet / "revocations.json", ca) is None
    alpha, beta = issue_node(fleet, "alpha"), issue_node(fleet, "beta")
    first = revoke_node(fleet, "alpha", now=NOW)
    assert first.version == 1 and first.fleet_id == fleet_id_of(ca)
    assert first.revoked == (RevokedNode(alpha.node_id, alpha.fingerprint, "alpha", NOW),)
    assert load_revocations(fleet / "revocations.json", ca) == first
    with pytest.raises(FleetError, match="already revoked"):
        revoke_node(fleet, "alpha")

    second = revoke_node(fleet, beta.node_id)  # by node id
    assert second.version == 2 and second.is_newer_than(first)
    assert second.revokes(alpha.fingerprint) and second.revokes_node(beta.node_id)


def test_revoke_covers_every_certificate_of_a_name(fleet: Path, tmp_path: Path) -> None:
    old = issue_node(fleet, "pc1")
    new = issue_node(fleet, "pc1", out=tmp_path / "renewed", force=True)  # a re-issue: another key
    assert [e.node_id for e in enrolled_nodes(fleet)] == [old.node_id, new.node_id]
    revocations = revoke_node(fleet, "pc1")
    assert revocations.revokes(old.fingerprint) and revocations.revokes(new.fingerprint)


def test_revoke_unknown_node_lists_the_enrolled(fleet: Path) -> None:
    with pytest.raises(FleetError, match=r"no node 'ghost' is enrolled .*\(enrolled: none yet\)"):
        revoke_node(fleet, "ghost")
    issue_node(fleet, "beta")
    issue_node(fleet, "alpha")
    with pytest.raises(FleetError, match=r"\(enrolled: alpha, beta\)"):
        revoke_node(fleet, "ghost")
    assert not (fleet / "revocations.json").exists()


def test_a_damaged_list_is_not_overwritten(fleet: Path) -> None:
    issue_node(fleet, "alpha")
    revoke_node(fleet, "alpha")
    (fleet / "revocations.json").write_text('{"schema": 1, "body": "{}", "signature": "AAAA"}')
    issue_node(fleet, "beta")
    with pytest.raises(FleetError, match=r"revocations\.json.*signature"):
        revoke_node(fleet, "beta")


def test_cli_list_and_revoke(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SHOAL_DATA_DIR", str(tmp_path / "data"))
    assert main(["fleet", "list", "--dir", str(fleet)]) == 1
    assert "shoal fleet token" in capsys.readouterr().err
    alpha, beta = issue_node(fleet, "alpha"), issue_node(fleet, "beta")

    assert main(["fleet", "revoke", "beta", "--dir", str(fleet)]) == 0
    out = capsys.readouterr().out
    assert "revoked beta" in out and beta.node_id in out and "version 1" in out

    assert main(["fleet", "list", "--dir", str(fleet)]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split() == ["NAME", "NODE", "ID", "FINGERPRINT", "ENROLLED", "(UTC)", "HOW", "STATUS"]
    rows = {line.split()[0]: line for line in lines}
    assert alpha.node_id in rows["alpha"] and alpha.fingerprint[7:23] in rows["alpha"]
    assert "issued" in rows["alpha"] and not rows["alpha"].endswith("revoked")
    assert rows["beta"].endswith("revoked")

    assert main(["fleet", "revoke", "ghost", "--dir", str(fleet)]) == 1
    assert "enrolled: alpha, beta" in capsys.readouterr().err


def test_merge_live_state_hook() -> None:
    row = NodeRow("pc1", "0123456789ab", "sha256:" + "ab" * 32, NOW, "issued", revoked=False)
    gone = NodeRow("pc2", "ba9876543210", "sha256:" + "cd" * 32, NOW, "issued", revoked=True)
    members = [
        {"node": "0123456789ab", "state": "member", "last_heard": "2s ago"},
        {"node": "pc2", "state": "member", "last_heard": "1s ago"},
    ]
    merged = merge_live_state([row, gone], members)
    assert (merged[0].state, merged[0].last_heard) == ("member", "2s ago")
    assert merged[1] == gone  # a revoked node's row is not dressed up as live
    assert merge_live_state([row], []) == [row]
