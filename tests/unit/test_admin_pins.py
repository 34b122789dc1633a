"""The admin's checks on pins and revocations (``discovery.admin``), shared by ``shoal pin``/``shoal fleet revoke``
and the TUI's admin screen: a pin names one enrolled node that is not revoked, and a revocation says which pins
it voids and drops them when asked (issue 41 §3)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from agent.cli.main import main
from agent.errors import FleetError
from agent.fleet import init_fleet, issue_node, revoke_node
from agent.fleet.authority import EnrolledNode, enrolled_nodes
from discovery.admin import current_fleet_document, edit_fleet_document, pin_node, pin_problem, revoke
from discovery.fleet_document import Pin, with_pin

NOW = dt.datetime(2030, 5, 1, 12, 0, tzinfo=dt.UTC)


def entry(name: str, n: int) -> EnrolledNode:
    return EnrolledNode(name, f"{n:012x}", f"sha256:{n:064x}", NOW, "issued")


ENROLLED = (entry("pc1", 1), entry("pc2", 2), entry("vm", 3), entry("vm", 4), entry("desk", 5), entry("desk", 6))
REVOKED = {f"sha256:{n:064x}" for n in (2, 5)}  # pc2, and the first desk (the PC was replaced)


def revoked(fingerprint: str) -> bool:
    return fingerprint in REVOKED


@pytest.mark.parametrize(
    ("node", "why"),
    [
        ("pc1", None),
        (f"{1:012x}", None),
        ("desk", None),  # the one not revoked
        (f"{3:012x}", None),  # one of the two vm, by node id
        ("pc2", "pc2 is revoked: pin a node that is not (`shoal fleet list` shows them)"),
        (f"{2:012x}", f"{2:012x} is revoked: pin a node that is not (`shoal fleet list` shows them)"),
        (f"{5:012x}", f"{5:012x} is revoked: pin a node that is not (`shoal fleet list` shows them)"),
        ("vm", f"2 enrolled nodes are named 'vm' (node ids {3:012x}, {4:012x}): pin one by node id"),
        ("ghost", "no node 'ghost' is enrolled in this fleet (enrolled: desk, pc1, vm): pin one by name or node id"),
    ],
)
def test_a_pin_names_one_enrolled_node_that_is_not_revoked(node: str, why: str | None) -> None:
    assert pin_problem(node, ENROLLED, revoked) == why


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """A fleet folder with pc1, pc2 and two PCs named vm (the second issued with --force)."""
    folder = tmp_path / "fleet"
    init_fleet(folder, "office")
    for name in ("pc1", "pc2", "vm"):
        issue_node(folder, name)
    issue_node(folder, "vm", out=tmp_path / "vm-2", force=True)
    return folder


def test_pin_node_refuses_a_revoked_unknown_or_ambiguous_node_and_writes_nothing(fleet: Path) -> None:
    revoke_node(fleet, "pc2")
    refused = [("pc2", "pc2 is revoked"), ("pc9", "no node 'pc9' is enrolled"), ("vm", "2 enrolled nodes are named")]
    for node, why in refused:
        with pytest.raises(FleetError, match=f"^cannot pin stage 1 to {node}: {why}"):
            pin_node(fleet, Pin(node, 1, required=True))
    assert current_fleet_document(fleet).version == 0  # nothing written

    vm = enrolled_nodes(fleet)[-1].node_id
    document, _ = pin_node(fleet, Pin(vm, 1, required=True))  # by node id: one PC
    assert document.version == 1 and document.pins == (Pin(vm, 1, True),)
    document, _ = pin_node(fleet, Pin("pc1", 0))
    assert current_fleet_document(fleet) == document and document.pins == (Pin("pc1", 0), Pin(vm, 1, True))


def test_revoke_names_the_pins_it_voids_and_drops_them_when_asked(fleet: Path) -> None:
    pin_node(fleet, Pin("pc1", 0, required=True))
    pin_node(fleet, Pin("pc2", 1))
    kept = revoke(fleet, "pc1")
    assert [r.name for r in kept.added] == ["pc1"] and kept.revocations.version == 1
    assert kept.voided == (Pin("pc1", 0, True),) and kept.document is None
    assert current_fleet_document(fleet).pins == (Pin("pc1", 0, True), Pin("pc2", 1))  # kept: the plan ignores it
    assert [type(m).__name__ for m in kept.messages] == ["Revocations"]

    dropped = revoke(fleet, "pc2", drop_pins=True)
    assert dropped.voided == (Pin("pc2", 1),) and dropped.document is not None
    document, _ = dropped.document
    assert document.version == 3 and document.pins == (Pin("pc1", 0, True),)
    assert current_fleet_document(fleet) == document
    assert [type(m).__name__ for m in dropped.messages] == ["Revocations", "FleetDocumentOffer"]


def test_revoking_one_of_two_namesakes_voids_no_pin_of_the_name(fleet: Path) -> None:
    # written past the check, as a document from before names were checked could hold it
    edit_fleet_document(fleet, lambda doc, now: with_pin(doc, Pin("vm", 2, required=True), now))
    first = enrolled_nodes(fleet)[2].node_id
    done = revoke(fleet, first, drop_pins=True)
    assert [r.node_id for r in done.added] == [first]
    assert done.voided == () and done.document is None  # "vm" still names a PC that is not revoked
    assert current_fleet_document(fleet).pins == (Pin("vm", 2, True),)


def test_cli_pin_refuses_a_revoked_node_in_one_line(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SHOAL_DATA_DIR", str(tmp_path / "data"))
    assert main(["fleet", "revoke", "pc2", "--dir", str(fleet)]) == 0
    capsys.readouterr()
    assert main(["pin", "pc2", "1", "--dir", str(fleet)]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "shoal: error: cannot pin stage 1 to pc2: pc2 is revoked: pin a node that is not "
        "(`shoal fleet list` shows them)\n"
    )
    assert main(["pin", "vm", "1", "--dir", str(fleet)]) == 1
    assert "2 enrolled nodes are named 'vm'" in capsys.readouterr().err
    assert current_fleet_document(fleet).version == 0


def test_cli_revoke_says_which_pins_it_voids_and_drops_them_with_drop_pins(
    fleet: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SHOAL_DATA_DIR", str(tmp_path / "data"))
    pin_node(fleet, Pin("pc1", 0, required=True))
    pin_node(fleet, Pin("pc2", 1, required=True))
    assert main(["fleet", "revoke", "pc1", "--dir", str(fleet)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (
        "the required pin of pc1 on stage 0 is void: the plan places stage 0 automatically "
        "(`--drop-pins` or `shoal unpin pc1` removes the pin)"
    )
    assert main(["fleet", "revoke", "pc2", "--dir", str(fleet), "--drop-pins"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "dropped the required pin of pc2 on stage 1: fleet document version 3"
    assert current_fleet_document(fleet).pins == (Pin("pc1", 0, True),)
