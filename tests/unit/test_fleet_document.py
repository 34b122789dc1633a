"""The fleet document: validation, the next versions, and its CA signature (``discovery.fleet_document``)."""

from __future__ import annotations

import base64
import datetime as dt
import json
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from agent.errors import FleetError
from agent.fleet import RevocationList, fleet_id_of, init_fleet
from agent.fleet.authority import load_ca
from agent.fleet.signed import sign_document, verify_document
from discovery.fleet_document import (
    FleetDocument,
    ModelSource,
    Pin,
    StandbyPolicy,
    serving,
    with_pin,
    with_standby,
    without_pin,
)

NOW = dt.datetime(2030, 5, 1, 12, 0, tzinfo=dt.UTC)
LATER = NOW + dt.timedelta(minutes=5)
COMMIT = "0123456789abcdef0123456789abcdef01234567"
FLEET = "0123456789abcdef"

CA = tuple[ec.EllipticCurvePrivateKey, x509.Certificate]


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> CA:
    folder = tmp_path_factory.mktemp("fleet")
    init_fleet(folder, "ours")
    return load_ca(folder)


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> CA:
    folder = tmp_path_factory.mktemp("other")
    init_fleet(folder, "theirs")
    return load_ca(folder)


def sample(ca: CA, version: int = 3) -> FleetDocument:
    return FleetDocument(
        fleet_id_of(ca[1]),
        version,
        NOW,
        ModelSource("HuggingFaceTB/SmolLM2-135M-Instruct", COMMIT),
        (Pin("pc-7", 2, required=True), Pin("0123456789ab", 0)),
        StandbyPolicy(2),
    )


def test_signature_round_trip_and_canonical_body(ca: CA) -> None:
    key, cert = ca
    document = sample(ca)
    data = document.sign(key)
    assert FleetDocument.verify(data, cert) == document
    outer = json.loads(data)
    assert set(outer) == {"schema", "body", "signature"} and outer["schema"] == 1
    body = outer["body"]
    assert body.encode() == document.body()
    assert body == json.dumps(json.loads(body), sort_keys=True, separators=(",", ":"))  # canonical
    assert [p["stage"] for p in json.loads(body)["pins"]] == [0, 2]  # kept sorted by stage


def test_a_local_export_and_no_model_round_trip(ca: CA) -> None:
    key, cert = ca
    for model in (ModelSource(export_dir="/srv/shoal/smollm2-3"), None):
        document = FleetDocument(fleet_id_of(cert), 1, NOW, model)
        assert FleetDocument.verify(document.sign(key), cert) == document


def test_equal_documents_sign_the_same_body() -> None:
    a = FleetDocument(FLEET, 1, NOW, pins=(Pin("a", 1), Pin("b", 0)))
    b = FleetDocument(FLEET, 1, NOW.replace(microsecond=123), pins=(Pin("b", 0), Pin("a", 1)))
    assert a == b and a.body() == b.body()


def test_a_tampered_body_is_refused(ca: CA) -> None:
    key, cert = ca
    doc = json.loads(sample(ca).sign(key))
    for change in (
        lambda b: b.replace('"version":3', '"version":9'),
        lambda b: b.replace('"required":true', '"required":false'),
        lambda b: b.replace("pc-7", "pc-8"),
    ):
        forged = dict(doc, body=change(doc["body"]))
        assert forged["body"] != doc["body"]
        with pytest.raises(FleetError, match="not the fleet CA's"):
            FleetDocument.verify(json.dumps(forged).encode(), cert)


def test_another_fleets_ca_is_refused(ca: CA, other_ca: CA) -> None:
    _, cert = ca
    other_key, other_cert = other_ca
    theirs = sample(other_ca).sign(other_key)
    with pytest.raises(FleetError, match="not the fleet CA's"):
        FleetDocument.verify(theirs, cert)
    # signed by our CA, but naming another fleet: refused too
    key, _ = ca
    misnamed = FleetDocument(fleet_id_of(other_cert), 1, NOW).sign(key)
    with pytest.raises(FleetError, match=f"for fleet {fleet_id_of(other_cert)}, not this fleet"):
        FleetDocument.verify(misnamed, cert)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("signature"), "no body or no signature"),
        (lambda d: d.update(signature=""), "no body or no signature"),
        (lambda d: d.update(body=None), "no body or no signature"),
        (lambda d: d.update(signature="***"), "not base64"),
        (lambda d: d.update(signature=base64.b64encode(b"junk").decode()), "not the fleet CA's"),
        (lambda d: d.update(schema=2), "schema 2; this shoal reads schema 1"),
        (lambda d: d.pop("schema"), "schema None"),
    ],
)
def test_an_unsigned_or_malformed_envelope_is_refused(ca: CA, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    key, cert = ca
    doc = json.loads(sample(ca).sign(key))
    edit(doc)
    with pytest.raises(FleetError, match=message):
        FleetDocument.verify(json.dumps(doc).encode(), cert)


@pytest.mark.parametrize(
    ("data", "message"), [(b"{nope", "not JSON"), (b"[1]", "not a JSON object"), (b"\xff", "JSON")]
)
def test_not_a_document_is_refused(ca: CA, data: bytes, message: str) -> None:
    with pytest.raises(FleetError, match=message):
        FleetDocument.verify(data, ca[1])


@pytest.mark.parametrize(
    "body",
    [
        {"fleet_id": "x"},
        {"extra": 1},
        {"pins": "pc-1"},
        {"pins": [{"node": "pc-1", "stage": 0}]},
        {"pins": [{"node": "pc-1", "stage": "0", "required": False}]},
        {"standby": {"per_stage": -1}},
        {"model": {"repo_id": "a/b", "revision": "main", "export_dir": None}},
        {"issued_at": "yesterday"},
        {"version": 1.5},
    ],
)
def test_a_signed_but_malformed_body_is_refused(ca: CA, body: dict[str, object]) -> None:
    key, cert = ca
    doc = json.loads(sample(ca).body())
    doc.update(body)
    data = sign_document(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode(), key)
    with pytest.raises(FleetError, match="the fleet document is malformed"):
        FleetDocument.verify(data, cert)


def test_the_envelope_serves_any_body_and_names_it(ca: CA, other_ca: CA) -> None:
    key, cert = ca
    data = sign_document(b'{"anything":1}', key)
    assert verify_document(data, cert) == b'{"anything":1}'
    with pytest.raises(FleetError, match=r"^the revocation list's signature is not the fleet CA's"):
        verify_document(data, other_ca[1], "the revocation list")


def test_the_envelope_is_the_revocation_lists_own(ca: CA) -> None:
    # one envelope for every CA-signed document: agent.fleet.revocation can sign and verify through it
    key, cert = ca
    revocations = RevocationList(fleet_id_of(cert), 2, NOW)
    assert verify_document(revocations.sign(key), cert, "the revocation list") == revocations.body()
    assert RevocationList.verify(sign_document(revocations.body(), key), cert) == revocations


def test_newer_versions_of_the_same_fleet() -> None:
    doc = FleetDocument(FLEET, 4, NOW)
    assert doc.is_newer_than(None)
    assert doc.is_newer_than(FleetDocument(FLEET, 3, LATER))
    assert not doc.is_newer_than(FleetDocument(FLEET, 4, NOW))
    assert not doc.is_newer_than(FleetDocument(FLEET, 5, NOW))
    with pytest.raises(FleetError, match="cannot compare"):
        doc.is_newer_than(FleetDocument("fedcba9876543210", 1, NOW))


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: FleetDocument(FLEET, 1, NOW, pins=(Pin("pc-1", 0), Pin("pc-1", 1))), "pc-1 is pinned twice"),
        (lambda: FleetDocument(FLEET, 1, NOW, pins=(Pin("pc-1", 0), Pin("pc-2", 0))), "stage 0 is pinned twice"),
        (lambda: Pin("pc-1", -1), "stage index"),
        (lambda: Pin("pc-1", True), "stage index"),  # type: ignore[arg-type]
        (lambda: Pin("../etc", 0), "node id or node name"),
        (lambda: Pin("pc-1", 0, "yes"), "required or not"),  # type: ignore[arg-type]
        (lambda: StandbyPolicy(-1), "0 or more"),
        (lambda: ModelSource("a/b", COMMIT, "/srv/export"), "not both"),
        (lambda: ModelSource(), "needs a Hub repository"),
        (lambda: ModelSource("a/b", "main"), "pinned to a commit"),
        (lambda: ModelSource("a/b", COMMIT.upper()), "pinned to a commit"),
        (lambda: ModelSource("a b/c", COMMIT), "invalid Hub repository id"),
        (lambda: ModelSource(export_dir=""), "invalid export folder"),
        (lambda: FleetDocument("nope", 1, NOW), "invalid fleet id"),
        (lambda: FleetDocument(FLEET, -1, NOW), "version"),
        (lambda: FleetDocument(FLEET, True, NOW), "version"),
        (lambda: FleetDocument(FLEET, 1, dt.datetime(2030, 5, 1)), "UTC"),
    ],
)
def test_invalid_documents_are_refused_with_a_reason(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(FleetError, match=message):
        make()


def test_the_issue_time_is_kept_in_utc_to_the_second() -> None:
    paris = dt.timezone(dt.timedelta(hours=2))
    doc = FleetDocument(FLEET, 1, dt.datetime(2030, 5, 1, 14, 0, 0, 999, tzinfo=paris))
    assert doc.issued_at == NOW and doc.issued_at.tzinfo == dt.UTC


def test_the_next_versions() -> None:
    doc = FleetDocument.empty(FLEET, NOW)
    assert (doc.version, doc.model, doc.pins, doc.standby) == (0, None, (), StandbyPolicy(1))
    one = with_pin(doc, Pin("pc-1", 0), LATER)
    assert (one.version, one.issued_at, one.pins) == (1, LATER, (Pin("pc-1", 0),))
    two = with_pin(one, Pin("pc-2", 1, required=True), LATER)
    # a new pin of the same node, or of the same stage, replaces the old one
    assert with_pin(two, Pin("pc-1", 3), LATER).pins == (Pin("pc-2", 1, True), Pin("pc-1", 3))
    assert with_pin(two, Pin("pc-3", 1), LATER).pins == (Pin("pc-1", 0), Pin("pc-3", 1))
    three = without_pin(two, "pc-1", LATER)
    assert (three.version, three.pins) == (3, (Pin("pc-2", 1, True),))
    with pytest.raises(FleetError, match=r"pc-9 has no pin .* \(pinned: pc-2 \(stage 1\)\)"):
        without_pin(three, "pc-9", LATER)
    model = ModelSource(export_dir="/srv/export")
    four = serving(three, model, LATER)
    assert (four.version, four.model, str(four.model)) == (4, model, "/srv/export")
    assert str(ModelSource("a/b", COMMIT)) == f"a/b@{COMMIT}"
    five = with_standby(four, StandbyPolicy(0), LATER)
    assert (five.version, five.standby) == (5, StandbyPolicy(0))
    assert five.is_newer_than(four) and not four.is_newer_than(five)


def test_a_document_survives_the_disk(ca: CA, tmp_path: Path) -> None:
    key, cert = ca
    (tmp_path / "fleet.json").write_bytes(sample(ca).sign(key))
    assert FleetDocument.verify((tmp_path / "fleet.json").read_bytes(), cert) == sample(ca)
