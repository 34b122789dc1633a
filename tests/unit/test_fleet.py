"""The fleet CA, node identities and ``shoal fleet`` (no network, no model)."""

from __future__ import annotations

import ipaddress
import os
import stat
import sys
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from agent.cli.main import main
from agent.errors import FleetError
from agent.fleet import (
    FleetPaths,
    NodeIdentity,
    cert_fingerprint,
    enrolled_nodes,
    init_fleet,
    issue_node,
    read_certificate,
    revoke_node,
)

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="file modes are POSIX")


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_init_writes_a_ca(tmp_path: Path) -> None:
    ca_path = init_fleet(tmp_path / "fleet", "acme")
    paths = FleetPaths(tmp_path / "fleet")
    assert ca_path == paths.ca_cert
    assert paths.ca_key.is_file()
    ca = read_certificate(ca_path)
    assert ca.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "acme fleet CA"
    assert ca.issuer == ca.subject
    bc = ca.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and bc.value.ca and bc.value.path_length == 0
    ku = ca.extensions.get_extension_for_class(x509.KeyUsage)
    assert ku.critical and ku.value.key_cert_sign and ku.value.crl_sign and not ku.value.digital_signature
    ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier)
    assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
    assert isinstance(ca.public_key().curve, ec.SECP256R1)
    lifetime = ca.not_valid_after_utc - ca.not_valid_before_utc
    assert 3649 <= lifetime.days <= 3651
    ca.verify_directly_issued_by(ca)  # self-signed
    # Nothing left over from the atomic writes.
    assert sorted(p.name for p in paths.root.iterdir()) == ["ca.key", "ca.pem"]


def test_init_refuses_to_overwrite_unless_forced(tmp_path: Path) -> None:
    init_fleet(tmp_path, "acme")
    before = cert_fingerprint(read_certificate(tmp_path / "ca.pem"))
    with pytest.raises(FleetError, match=r"already exists.*--force"):
        init_fleet(tmp_path, "acme")
    assert cert_fingerprint(read_certificate(tmp_path / "ca.pem")) == before
    init_fleet(tmp_path, "acme", force=True)
    assert cert_fingerprint(read_certificate(tmp_path / "ca.pem")) != before


def test_init_refuses_when_only_the_key_exists(tmp_path: Path) -> None:
    (tmp_path / "ca.key").write_text("something")
    with pytest.raises(FleetError, match="already exists"):
        init_fleet(tmp_path, "acme")


@pytest.mark.parametrize("name", ["", "   ", "x" * 56, "tab\there"])
def test_init_rejects_bad_fleet_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(FleetError, match="invalid fleet name"):
        init_fleet(tmp_path, name)


def test_issue_node_certificate(tmp_path: Path) -> None:
    init_fleet(tmp_path, "acme")
    identity = issue_node(tmp_path, "pc-07", ips=["10.0.0.7", "fd00::7", "127.0.0.1"], days=30)
    folder = tmp_path / "nodes" / "pc-07"
    assert identity == NodeIdentity(folder / "cert.pem", folder / "key.pem", folder / "ca.pem")
    assert NodeIdentity.load(folder) == identity
    assert identity.name == "pc-07"
    assert identity.ca.read_bytes() == (tmp_path / "ca.pem").read_bytes()

    cert = identity.certificate()
    ca = read_certificate(tmp_path / "ca.pem")
    assert identity.fingerprint == cert_fingerprint(cert)
    assert identity.fingerprint.startswith("sha256:") and len(identity.fingerprint) == 7 + 64
    # Signed by the fleet CA (cryptography checks issuer name and signature).
    cert.verify_directly_issued_by(ca)
    assert cert.issuer == ca.subject

    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["pc-07", "pc-07.local"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("10.0.0.7"),
        ipaddress.ip_address("fd00::7"),
    ]
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    bc = cert.extensions.get_extension_for_class(x509.BasicConstraints)
    assert bc.critical and not bc.value.ca
    aki = cert.extensions.get_extension_for_class(x509.AuthorityKeyIdentifier).value
    ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    assert aki.key_identifier == ski.digest
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert 29 <= (cert.not_valid_after_utc - cert.not_valid_before_utc).days <= 30


def test_issue_always_includes_loopback(tmp_path: Path) -> None:
    init_fleet(tmp_path, "acme")
    cert = issue_node(tmp_path, "solo").certificate()
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]


def test_issue_to_custom_folder_and_reissue(tmp_path: Path) -> None:
    init_fleet(tmp_path / "fleet", "acme")
    out = tmp_path / "elsewhere" / "id"
    first = issue_node(tmp_path / "fleet", "pc1", out=out)
    assert first.cert == out / "cert.pem"
    assert not (tmp_path / "fleet" / "nodes").exists()
    old = first.fingerprint
    with pytest.raises(FleetError, match=r"a node named 'pc1' is enrolled already .*pass --force"):
        issue_node(tmp_path / "fleet", "pc1", out=out)  # names are unique unless the admin insists
    assert first.fingerprint == old and [e.name for e in enrolled_nodes(tmp_path / "fleet")] == ["pc1"]
    second = issue_node(tmp_path / "fleet", "pc1", out=out, force=True)
    assert second.fingerprint != old  # re-issuing replaces the identity (renewal)
    assert sorted(p.name for p in out.iterdir()) == ["ca.pem", "cert.pem", "key.pem"]


def test_a_revoked_name_is_free_again(tmp_path: Path) -> None:
    init_fleet(tmp_path, "acme")
    old = issue_node(tmp_path, "pc1").node_id
    revoke_node(tmp_path, "pc1")
    new = issue_node(tmp_path, "pc1").node_id  # the PC replaced: no --force needed
    assert [e.node_id for e in enrolled_nodes(tmp_path)] == [old, new]
    with pytest.raises(FleetError, match="enrolled already"):
        issue_node(tmp_path, "pc1")


@posix_only
def test_key_file_modes(tmp_path: Path) -> None:
    init_fleet(tmp_path, "acme")
    identity = issue_node(tmp_path, "pc1")
    assert mode(tmp_path / "ca.key") == 0o600
    assert mode(identity.key) == 0o600
    assert mode(tmp_path / "ca.pem") == 0o644
    assert mode(identity.cert) == 0o644


@pytest.mark.parametrize("node", ["", "a b", "x" * 64, "..", ".hidden", "-flag", "a/b", "ü", "pc1\n"])
def test_bad_node_names_are_refused(tmp_path: Path, node: str) -> None:
    init_fleet(tmp_path, "acme")
    with pytest.raises(FleetError, match="invalid node name"):
        issue_node(tmp_path, node)
    assert not (tmp_path / "nodes").exists()


@pytest.mark.parametrize("node", ["a", "PC-07", "lab_3", "host.example", "x" * 63])
def test_good_node_names(tmp_path: Path, node: str) -> None:
    init_fleet(tmp_path, "acme")
    assert issue_node(tmp_path, node).name == node


def test_bad_ip_and_days(tmp_path: Path) -> None:
    init_fleet(tmp_path, "acme")
    with pytest.raises(FleetError, match="invalid IP address"):
        issue_node(tmp_path, "pc1", ips=["10.0.0.300"])
    with pytest.raises(FleetError, match="days"):
        issue_node(tmp_path, "pc1", days=0)


def test_missing_ca_tells_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="shoal fleet init"):
        issue_node(tmp_path, "pc1")


def test_missing_ca_key_is_explained(tmp_path: Path) -> None:
    init_fleet(tmp_path, "acme")
    (tmp_path / "ca.key").unlink()
    with pytest.raises(FleetError, match=r"ca\.key is missing"):
        issue_node(tmp_path, "pc1")


def test_mismatched_ca_key_is_refused(tmp_path: Path) -> None:
    init_fleet(tmp_path / "a", "a")
    init_fleet(tmp_path / "b", "b")
    os.replace(tmp_path / "b" / "ca.key", tmp_path / "a" / "ca.key")
    with pytest.raises(FleetError, match="does not belong"):
        issue_node(tmp_path / "a", "pc1")


def test_load_incomplete_identity_tells_what_to_run(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match=r"shoal fleet issue NODE") as info:
        NodeIdentity.load(tmp_path / "nothing")
    assert "cert.pem, key.pem, ca.pem" in str(info.value)
    init_fleet(tmp_path / "fleet", "acme")
    identity = issue_node(tmp_path / "fleet", "pc1")
    identity.key.unlink()
    with pytest.raises(FleetError, match=r"missing key\.pem\).*shoal fleet issue NODE"):
        NodeIdentity.load(identity.cert.parent)


def test_corrupt_certificate_is_a_fleet_error(tmp_path: Path) -> None:
    init_fleet(tmp_path, "acme")
    identity = issue_node(tmp_path, "pc1")
    identity.cert.write_text("not a certificate")
    with pytest.raises(FleetError, match="cannot read certificate"):
        _ = identity.name


def test_cli_init_and_issue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SHOAL_DATA_DIR", str(tmp_path / "data"))
    fleet = tmp_path / "data" / "fleet"

    assert main(["fleet", "init", "--name", "office"]) == 0
    out = capsys.readouterr().out
    ca_fp = cert_fingerprint(read_certificate(fleet / "ca.pem"))
    assert str(fleet / "ca.pem") in out and str(fleet / "ca.key") in out
    assert ca_fp in out

    assert main(["fleet", "init"]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith("shoal: error: ") and "--force" in captured.err

    assert main(["fleet", "issue", "pc-1", "--ip", "10.1.2.3", "--days", "10"]) == 0
    out = capsys.readouterr().out
    identity = NodeIdentity.load(fleet / "nodes" / "pc-1")
    assert str(identity.cert) in out and str(identity.key) in out
    assert identity.fingerprint in out
    san = identity.certificate().extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("10.1.2.3") in san.get_values_for_type(x509.IPAddress)

    other = tmp_path / "other"
    assert main(["fleet", "issue", "pc-2", "--dir", str(fleet), "--out", str(other)]) == 0
    assert NodeIdentity.load(other).name == "pc-2"
    capsys.readouterr()

    assert main(["fleet", "issue", "pc-2", "--dir", str(fleet)]) == 1  # a second pc-2 only if the admin insists
    assert "a node named 'pc-2' is enrolled already" in capsys.readouterr().err
    assert main(["fleet", "issue", "pc-2", "--dir", str(fleet), "--force"]) == 0
    assert [e.name for e in enrolled_nodes(fleet)] == ["pc-1", "pc-2", "pc-2"]
    capsys.readouterr()

    assert main(["fleet", "issue", "bad name"]) == 1
    assert "invalid node name" in capsys.readouterr().err
    assert main(["fleet", "issue", "pc-3", "--dir", str(tmp_path / "empty")]) == 1
    assert "shoal fleet init" in capsys.readouterr().err
