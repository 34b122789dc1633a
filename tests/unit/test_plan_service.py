"""The fleet plan's pure parts: who coordinates, the plan on the wire, what a plan asks of an agent."""

from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import cast

import pytest

from agent.errors import RemoteProtocolError
from agent.fleet import RevocationList, RevokedNode, fleet_id_of, init_fleet, read_certificate
from agent.fleet.signed import Kept
from agent.node.ring_former import RETRY_MAX, Duty, duty_of, retry_delay
from discovery import control
from discovery.announcement import Announcement
from discovery.fleet_document import FleetDocument, ModelSource, Pin
from discovery.kept import FleetDocumentKeeper, RevocationKeeper
from discovery.membership import Member, Membership, MemberState, Source
from discovery.placement import Assignment, Candidate, PinOutcome, Plan, stage_needs
from discovery.plan_codec import PlanRecord
from discovery.plan_service import (
    FORGIVE_MAX,
    REPEAT,
    SETTLE,
    FleetPlanService,
    coordinator_of,
    forgive_after,
    planned_with_quorum,
    refuses,
    sees_quorum,
    supersedes,
)
from discovery.service import MembershipService, MembershipSettings
from shards.manifest import Manifest
from tests.support.memory_network import MemoryNetwork
from tests.unit.test_placement import manifest

FLEET = "0123456789abcdef"
NOW = dt.datetime(2030, 5, 1, 12, 0, tzinfo=dt.UTC)


def node(n: int) -> str:
    return f"{n:012x}"


def announce(n: int, started: int) -> Announcement:
    return Announcement(node(n), f"pc{n}", FLEET, "sha256:" + f"{n:064x}", "0.1.0", 5, 7100, f"{n:08x}", started)


def fleet(me: Announcement, *others: tuple[Announcement, MemberState]) -> Membership:
    members = {a.node: Member(a, state, "10.0.0.1", frozenset({Source.SEED}), 1.0) for a, state in others}
    return Membership(me, members=MappingProxyType(members))


def test_the_longest_running_member_coordinates_and_a_newcomer_never_takes_over() -> None:
    old, newer, newest = announce(9, 100), announce(1, 200), announce(0, 300)
    # the same coordinator, whichever agent looks
    assert coordinator_of(fleet(newest, (old, MemberState.MEMBER), (newer, MemberState.MEMBER))) == old.node
    assert coordinator_of(fleet(old, (newer, MemberState.MEMBER), (newest, MemberState.MEMBER))) == old.node
    # a lost coordinator is replaced by the next oldest; a tie in start time goes to the smaller node id
    assert coordinator_of(fleet(newest, (old, MemberState.LOST), (newer, MemberState.MEMBER))) == newer.node
    twin = replace(newer, node=node(2), fingerprint="sha256:" + "2" * 64)
    assert coordinator_of(fleet(twin, (newer, MemberState.MEMBER))) == newer.node
    # members not verified, gone, foreign or revoked never coordinate
    for state in (MemberState.UNVERIFIED, MemberState.GONE, MemberState.FOREIGN, MemberState.REVOKED):
        assert coordinator_of(fleet(newest, (old, state))) == newest.node


def plan_of_three() -> Plan:
    return Plan(
        (
            Assignment(0, node(1), (node(4),), "given to pc1"),
            Assignment(1, node(2), (), "kept on pc2"),
            Assignment(2, None, (), "no member can hold it"),
        ),
        (PinOutcome(Pin("pc2", 1, True), True, "stage 1 on pc2 (required)"),),
        epoch=3,
        bottleneck=0.5,
        probation=frozenset({node(7)}),
    )


def test_a_plan_travels_whole_and_is_checked_by_its_hash() -> None:
    record = PlanRecord(plan_of_three(), node(1), 4, "78a29e567c0daa0c")
    frame = control.to_frame(control.PlanOffer(record.to_json()))
    message = control.from_frame(frame)
    assert isinstance(message, control.PlanOffer)
    again = PlanRecord.from_json(message.plan)
    assert again == record and again.plan.hash == record.plan.hash
    tampered = record.to_json()
    tampered["assignments"][1]["node"] = node(3)
    with pytest.raises(RemoteProtocolError, match="hash"):
        PlanRecord.from_json(tampered)
    for broken in ({**record.to_json(), "schema": 2}, {**record.to_json(), "epoch": "3"}, {"schema": 1}):
        with pytest.raises(RemoteProtocolError, match="malformed plan"):
            PlanRecord.from_json(broken)


def test_signed_documents_travel_as_base64_and_hello_tells_both_versions() -> None:
    for message in (control.FleetDocumentOffer(b"\x00signed"), control.Revocations(b"list")):
        assert control.from_frame(control.to_frame(message)) == message
    hello = control.Hello(announce(1, 100), 5.0, revocations=2, fleet=7)
    assert control.from_frame(control.to_frame(hello)) == hello


def test_what_a_plan_asks_of_an_agent() -> None:
    plan = plan_of_three()
    assert duty_of(plan, node(1)) == Duty(0, serve=True)
    assert duty_of(plan, node(4)) == Duty(0, serve=False)
    assert duty_of(plan, node(9)) is None


def test_a_pass_that_keeps_failing_is_tried_again_ever_later_up_to_a_cap() -> None:
    # issue 41 §5: a file failing its check was fetched again about once a second without limit
    delays = [retry_delay(n) for n in range(1, 12)]
    assert delays[:5] == [2.0, 4.0, 8.0, 16.0, 32.0]
    assert delays[5:] == [RETRY_MAX] * 6 and sum(delays) > 5 * 60  # 11 tries take over five minutes
    assert retry_delay(10_000) == RETRY_MAX


def test_a_coordinator_that_never_knew_a_revoked_node_voids_a_required_pin_on_it(tmp_path: Path) -> None:
    # issue 41 §3: the coordinator restarted after pc2 was revoked: pc2 is in the revocation list only, never a
    # member here. Its required pin is void, and the stage is placed automatically, with why
    init_fleet(tmp_path / "fleet", "ours")
    ca = read_certificate(tmp_path / "fleet" / "ca.pem")
    gone = RevokedNode(node(2), "sha256:" + "2" * 64, "pc2", NOW)
    revocations: RevocationKeeper = Kept(tmp_path / "revocations.json", ca, RevocationList.verify)
    revocations.current = RevocationList(fleet_id_of(ca), 1, NOW, (gone,))
    fleet_doc: FleetDocumentKeeper = Kept(tmp_path / "fleet.json", ca, FleetDocument.verify)
    fleet_doc.current = FleetDocument(
        fleet_id_of(ca), 1, NOW, ModelSource(export_dir="/exports/m"), pins=(Pin("pc2", 1, required=True),)
    )
    me = replace(announce(1, 100), fleet=fleet_id_of(ca), memory_mb=64_000, speed=10.0)
    members = MembershipService(
        me, MemoryNetwork(), MembershipSettings(mdns=False), revocations=revocations, fleet=fleet_doc
    )
    members.state = fleet(me, (replace(announce(3, 200), fleet=me.fleet, memory_mb=64_000), MemberState.MEMBER))

    async def load(model: ModelSource) -> Manifest:
        return manifest(stages=2, layers=8)

    async def main() -> Plan:
        service = FleetPlanService(members, load)
        await service.start(("127.0.0.1", 7100))
        try:
            async with asyncio.timeout(5.0):
                while service.plan is None:
                    await asyncio.sleep(0.01)
            return service.plan
        finally:
            await service.stop()

    planned = asyncio.run(main())
    assert planned.complete and {planned.node_of(0), planned.node_of(1)} == {node(1), node(3)}
    assert planned.pins[0].reason == "pc2 is revoked; the pin is void, the stage is placed automatically"
    assert planned.assignments[1].reason.endswith("the required pin on pc2 is void: pc2 is revoked")


def test_a_member_put_on_probation_again_and_again_waits_longer_each_time() -> None:
    # issue 43: a PC whose user comes and goes holds standbys rather than stages; each probation doubles the wait
    assert [forgive_after(n) for n in (1, 2, 3, 7, 100)] == [60.0, 120.0, 240.0, FORGIVE_MAX, FORGIVE_MAX]
    now = [0.0]

    async def no_manifest(model: object) -> object:
        raise AssertionError("not asked")

    service = FleetPlanService(cast(MembershipService, None), no_manifest, clock=lambda: now[0])  # type: ignore[arg-type]
    steady = (Candidate(node(1), "pc1", 8000, 10.0),)
    flaky = Plan((Assignment(0, node(2)),), probation=frozenset({node(1)}))

    def forgiven_after_seconds() -> float:
        start = now[0]
        while node(1) in service._forgiven(flaky, steady).probation:
            now[0] += 1.0
        return now[0] - start

    assert forgiven_after_seconds() == 60.0
    service._forgiven(Plan((Assignment(0, node(2)),)), steady)  # off probation for a while, then on it again
    assert forgiven_after_seconds() == 120.0
    service._forgiven(Plan((Assignment(0, node(2)),)), steady)
    assert forgiven_after_seconds() == 240.0


def test_a_plan_supersedes_another_only_for_the_same_document_and_export_with_a_higher_epoch() -> None:
    eight = PlanRecord(replace(plan_of_three(), epoch=8), node(2), 4, "export-a")
    nine = PlanRecord(replace(plan_of_three(), epoch=9), node(3), 4, "export-a")
    assert supersedes(nine, eight) and not supersedes(eight, nine)
    assert not supersedes(nine, nine) and not supersedes(nine, None)
    assert not supersedes(replace(nine, document=5), eight)  # another document: its plans start their own count
    assert not supersedes(replace(nine, export="export-b"), eight)


def test_a_coordinator_back_from_a_freeze_adopts_the_newer_plan_instead_of_imposing_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # issue 46 §3: pc2 (the coordinator) was SIGSTOPped; pc3 planned epoch 9 without it; on SIGCONT pc2 offered
    # its epoch 8 again and the fleet went back to it. Now pc3 refuses the older plan and sends its own back,
    # pc2 adopts it and plans on from epoch 9, and pc3 follows that
    init_fleet(tmp_path / "fleet", "ours")
    ca = read_certificate(tmp_path / "fleet" / "ca.pem")
    fleet_doc: FleetDocumentKeeper = Kept(tmp_path / "fleet.json", ca, FleetDocument.verify)
    fleet_doc.current = FleetDocument(fleet_id_of(ca), 1, NOW, ModelSource(export_dir="/exports/m"))
    shards = manifest(stages=2, layers=8)
    pc2, pc3 = (replace(announce(n, 100 * n), fleet=fleet_id_of(ca), memory_mb=64_000, speed=10.0) for n in (2, 3))

    async def no_manifest(model: ModelSource) -> Manifest:
        raise AssertionError("not asked")

    def agent(me: Announcement, other: Announcement) -> tuple[FleetPlanService, list[control.ControlMessage]]:
        members = MembershipService(me, MemoryNetwork(), MembershipSettings(mdns=False), fleet=fleet_doc)
        members.state = fleet(me, (other, MemberState.MEMBER))
        sent: list[control.ControlMessage] = []
        monkeypatch.setattr(members, "broadcast", sent.append)
        service = FleetPlanService(members, no_manifest)
        service.model, service.manifest, service.needs = fleet_doc.current.model, shards, stage_needs(shards)
        return service, sent

    def sent_back(sent: list[control.ControlMessage]) -> PlanRecord:
        offer = sent[-1]
        assert isinstance(offer, control.PlanOffer)
        return PlanRecord.from_json(offer.plan)

    before = Plan((Assignment(0, pc2.node), Assignment(1, pc3.node)), epoch=8)
    without_pc2 = Plan((Assignment(0, pc3.node), Assignment(1, None)), epoch=9)
    stale = PlanRecord(before, pc2.node, 1, shards.export_id)
    newer = PlanRecord(without_pc2, pc3.node, 1, shards.export_id)

    follower, follower_sent = agent(pc3, pc2)
    follower.record = newer
    follower._offered(pc2.node, stale.to_json())
    follower._plan_step()
    assert follower.record == newer  # not back to epoch 8
    assert sent_back(follower_sent) == newer

    coordinator, coordinator_sent = agent(pc2, pc3)
    coordinator.record = stale
    coordinator._offered(pc3.node, newer.to_json())  # pc3's own plan, as it coordinated: not adopted
    coordinator._plan_step()
    assert coordinator.record is not None and coordinator.record.plan.epoch == 8  # still its own lineage
    offer = sent_back(follower_sent)
    assert isinstance(follower_sent[-1], control.PlanOffer) and follower_sent[-1].sent_back
    coordinator._offered(pc3.node, offer.to_json(), sent_back=True)
    coordinator._plan_step()
    assert coordinator.record is not None and coordinator.record.coordinator == pc2.node
    assert coordinator.record.plan.epoch >= 9  # planned on from the newest epoch, not from its own 8

    follower._offered(pc2.node, sent_back(coordinator_sent).to_json())
    follower._plan_step()
    assert follower.record == coordinator.record  # one plan again, the coordinator's, at least as new

    # back from the freeze, a coordinator may first plan once from its view of the moment (its members seemed
    # lost), reaching the fleet's epoch with a plan of its own: at the same epoch, the fleet's plan wins
    woken, _ = agent(pc2, pc3)
    woken.record = PlanRecord(Plan((Assignment(0, pc2.node), Assignment(1, None)), epoch=9), pc2.node, 1, newer.export)
    woken._offered(pc3.node, newer.to_json(), sent_back=True)
    woken._plan_step()
    assert woken.record is not None and woken.record.coordinator == pc2.node and woken.record.plan.epoch >= 9
    assert woken.record.plan.node_of(0) == pc3.node  # stage 0 kept where the fleet's plan had it


def test_a_plan_sent_back_says_so_on_the_wire_and_a_plain_offer_reads_as_before() -> None:
    record = PlanRecord(plan_of_three(), node(1), 4, "78a29e567c0daa0c").to_json()
    back = control.to_frame(control.PlanOffer(record, sent_back=True))
    assert control.from_frame(back) == control.PlanOffer(record, sent_back=True)
    plain = control.to_frame(control.PlanOffer(record))
    assert b'"back"' not in plain.payload and control.from_frame(plain) == control.PlanOffer(record)


# -- issue 46 §3: a host cut off the network must not make the fleet follow the plan it made alone --------------
class Agent:
    """One agent's plan service over a membership this test sets, its control messages captured, a fake clock."""

    def __init__(self, me: Announcement, fleet_doc: FleetDocumentKeeper, shards: Manifest, clock: list[float]) -> None:
        self.me = me
        self.members = MembershipService(me, MemoryNetwork(), MembershipSettings(mdns=False), fleet=fleet_doc)
        self.sent: list[control.ControlMessage] = []
        self.members.broadcast = self.sent.append  # type: ignore[method-assign]

        async def no_manifest(model: ModelSource) -> Manifest:
            raise AssertionError("not asked")

        self.service = FleetPlanService(self.members, no_manifest, clock=lambda: clock[0])
        assert fleet_doc.current is not None
        self.service.model, self.service.manifest = fleet_doc.current.model, shards
        self.service.needs = stage_needs(shards)

    def sees(self, others: dict[Announcement, MemberState]) -> None:
        self.members.state = fleet(self.me, *others.items())

    def step(self) -> PlanRecord:
        self.service._plan_step()
        assert self.service.record is not None
        return self.service.record

    def last_sent(self) -> control.PlanOffer:
        offer = self.sent[-1]
        assert isinstance(offer, control.PlanOffer)
        return offer

    def hears(self, other: Agent, sent_back: bool = False) -> None:
        """Receives the last plan ``other`` sent."""
        self.service._offered(other.me.node, other.last_sent().plan, sent_back)


def office(tmp_path: Path, clock: list[float]) -> list[Agent]:
    """Six agents, pc1 the longest-running (the coordinator); every one can hold any one stage of three."""
    init_fleet(tmp_path / "fleet", "ours")
    ca = read_certificate(tmp_path / "fleet" / "ca.pem")
    fleet_doc: FleetDocumentKeeper = Kept(tmp_path / "fleet.json", ca, FleetDocument.verify)
    fleet_doc.current = FleetDocument(fleet_id_of(ca), 1, NOW, ModelSource(export_dir="/exports/m"))
    shards = manifest(stages=3, layers=9)
    pcs = [replace(announce(n, 100 * n), fleet=fleet_id_of(ca), memory_mb=64_000, speed=10.0) for n in range(1, 7)]
    return [Agent(pc, fleet_doc, shards, clock) for pc in pcs]


def all_see_each_other(agents: list[Agent], lost: frozenset[str] = frozenset()) -> None:
    """Every agent not in ``lost`` sees the others not in ``lost`` as members and those in ``lost`` as lost; an
    agent in ``lost`` sees every other as lost (it is cut off alone)."""
    for a in agents:
        alone = a.me.node in lost
        a.sees(
            {b.me: MemberState.LOST if alone or b.me.node in lost else MemberState.MEMBER for b in agents if b is not a}
        )


def formed(agents: list[Agent]) -> PlanRecord:
    """The fleet's plan once every agent follows the coordinator's (pc1's)."""
    all_see_each_other(agents)
    coordinator = agents[0]
    planned = coordinator.step()
    for follower in agents[1:]:
        follower.hears(coordinator)
        assert follower.step() == planned
    assert planned.quorum and planned.plan.complete
    return planned


def test_a_quorum_is_a_majority_of_the_members_seen_and_lost_and_outranks_any_epoch() -> None:
    me, others = announce(1, 100), [announce(n, 100 * n) for n in range(2, 7)]
    assert sees_quorum(fleet(me, *((a, MemberState.MEMBER) for a in others)))
    assert not sees_quorum(fleet(me, *((a, MemberState.LOST) for a in others)))  # cut off alone: 1 of 6
    three_of_six = [(a, MemberState.MEMBER if i < 2 else MemberState.LOST) for i, a in enumerate(others)]
    assert not sees_quorum(fleet(me, *three_of_six))  # a tie is no majority
    four_of_six = [(a, MemberState.MEMBER if i < 3 else MemberState.LOST) for i, a in enumerate(others)]
    assert sees_quorum(fleet(me, *four_of_six))
    left = [(a, MemberState.MEMBER if i < 1 else MemberState.GONE) for i, a in enumerate(others)]
    assert sees_quorum(fleet(me, *left))  # members that said goodbye do not count against it

    fleet_plan = PlanRecord(replace(plan_of_three(), epoch=2), node(1), 4, "export-a")
    alone = PlanRecord(replace(plan_of_three(), epoch=3), node(2), 4, "export-a", quorum=False)
    assert supersedes(fleet_plan, alone) and not supersedes(alone, fleet_plan)
    assert supersedes(replace(alone, plan=replace(alone.plan, epoch=4)), alone)  # among plans without one: epoch
    assert not refuses(alone, fleet_plan, sees=True)  # the cut-off follower follows the fleet's plan
    assert refuses(fleet_plan, alone, sees=True)  # the fleet refuses the plan a returning coordinator made alone
    # ... unless its own side has no quorum either: then the higher epoch is followed, not refused in a loop
    assert not refuses(fleet_plan, alone, sees=False)

    assert planned_with_quorum(True, None, 0.0) and planned_with_quorum(True, fleet_plan, 0.0)
    assert not planned_with_quorum(False, fleet_plan, 100.0)
    assert not planned_with_quorum(True, alone, SETTLE - 0.1) and planned_with_quorum(True, alone, SETTLE)


def test_a_plan_says_whether_it_had_a_quorum_on_the_wire_and_one_from_before_reads_as_having_one() -> None:
    record = PlanRecord(plan_of_three(), node(1), 4, "78a29e567c0daa0c", quorum=False)
    assert PlanRecord.from_json(record.to_json()) == record
    older = {k: v for k, v in record.to_json().items() if k != "quorum"}
    assert PlanRecord.from_json(older).quorum
    with pytest.raises(RemoteProtocolError, match="malformed plan"):
        PlanRecord.from_json({**record.to_json(), "quorum": "yes"})


def test_a_follower_cut_off_alone_plans_for_itself_but_the_fleet_keeps_its_plan_when_it_returns(
    tmp_path: Path,
) -> None:
    # the lab soak: pc2 was cut off, planned epoch 3 alone with stage 0 uncovered and sent it back on its return;
    # the coordinator pc1 adopted it, dropped its own stage 0 and re-planned pc4 onto it: 12 requests refused
    clock = [100.0]
    agents = office(tmp_path, clock)
    pc1 = agents[0]
    before = formed(agents)
    holder = before.plan.node_of(0)
    pc2 = next(a for a in agents[1:] if a.me.node in {x.node for x in before.plan.assignments} - {holder})

    all_see_each_other(agents, lost=frozenset({pc2.me.node}))
    alone = pc2.step()  # pc2 coordinates itself, its members lost
    assert alone.coordinator == pc2.me.node and alone.plan.epoch > before.plan.epoch and not alone.quorum
    assert alone.plan.node_of(0) != holder  # what made the coordinator drop its stage 0

    all_see_each_other(agents)  # the cut is over
    clock[0] += REPEAT
    pc2.hears(pc1)  # pc1 offers its plan, as every REPEAT seconds
    assert pc2.step() == before  # pc2 follows the fleet's plan again, though its own epoch is higher
    assert not any(isinstance(m, control.PlanOffer) and m.sent_back for m in pc2.sent)  # and sends nothing back
    pc1.service._offered(pc2.me.node, alone.to_json(), sent_back=True)  # even if it did (an agent from before)
    kept = pc1.step()
    assert (kept.plan.hash, kept.plan.epoch) == (before.plan.hash, before.plan.epoch)  # stage 0 stays where it is


def test_a_coordinator_cut_off_alone_takes_the_fleets_plan_back_instead_of_its_own(tmp_path: Path) -> None:
    # the lab soak: pc1 (the coordinator) was cut off; on its return its own epoch 4 won and moved stage 2 to pc4,
    # which still had to compile it: 3 answers in flight failed, 11 refused
    clock = [100.0]
    agents = office(tmp_path, clock)
    pc1, pc2, followers = agents[0], agents[1], agents[1:]
    before = formed(agents)

    all_see_each_other(agents, lost=frozenset({pc1.me.node}))
    alone = pc1.step()
    assert not alone.quorum and alone.plan.epoch == before.plan.epoch + 1
    fleet_plan = pc2.step()  # the next-oldest coordinates the rest: pc1's stage goes to its standby
    assert fleet_plan.quorum and fleet_plan.coordinator == pc2.me.node and fleet_plan.plan.complete
    assert fleet_plan.plan.node_of(0) != pc1.me.node
    for follower in followers[1:]:
        follower.hears(pc2)
        assert follower.step() == fleet_plan

    # back, pc1 sees its members come back one by one, planning each time, its epochs past the fleet's
    for returned in range(1, len(followers) + 1):
        back = frozenset(f.me.node for f in followers[:returned])
        pc1.sees({f.me: MemberState.MEMBER if f.me.node in back else MemberState.LOST for f in followers})
        clock[0] += 0.25
        mine = pc1.step()
    assert mine.plan.epoch > fleet_plan.plan.epoch and not mine.quorum  # seeing a quorum, but on from its own
    all_see_each_other(agents)
    for follower in followers:
        follower.hears(pc1)
        assert follower.step() == fleet_plan  # refused: the fleet's plan, made with a quorum, outranks it
        pc1.hears(follower, sent_back=True)
    again = pc1.step()
    assert again.coordinator == pc1.me.node and again.quorum
    assert [a.node for a in again.plan.assignments] == [a.node for a in fleet_plan.plan.assignments]  # no move
    for follower in followers:
        follower.hears(pc1)
        assert follower.step() == again  # one plan again, the coordinator's


def test_a_coordinator_cut_off_for_less_than_the_fleet_noticed_takes_its_own_earlier_plan_back(
    tmp_path: Path,
) -> None:
    # a 3.3 s cut: pc1's links broke, so it planned alone; the others never counted it lost and kept its plan
    clock = [100.0]
    agents = office(tmp_path, clock)
    pc1, followers = agents[0], agents[1:]
    before = formed(agents)
    all_see_each_other(agents, lost=frozenset({pc1.me.node}))
    pc1.step()
    all_see_each_other(agents)
    clock[0] += 0.25
    assert not pc1.step().quorum
    for follower in followers:
        follower.hears(pc1)
        assert follower.step() == before
        pc1.hears(follower, sent_back=True)
    again = pc1.step()
    assert again.quorum and [a.node for a in again.plan.assignments] == [a.node for a in before.plan.assignments]


def test_a_coordinator_that_hears_no_better_plan_has_a_quorum_again_after_settling(tmp_path: Path) -> None:
    clock = [100.0]
    agents = office(tmp_path, clock)
    pc1 = agents[0]
    formed(agents)
    all_see_each_other(agents, lost=frozenset({pc1.me.node}))
    pc1.step()
    all_see_each_other(agents)
    assert not pc1.step().quorum
    clock[0] += SETTLE - 0.5
    assert not pc1.step().quorum
    clock[0] += 0.5
    settled = pc1.step()
    assert settled.quorum  # re-stamped: the next cut-off node's plan will not outrank it
    clock[0] += REPEAT
    pc1.step()  # offered again
    follower = agents[1]
    follower.hears(pc1)
    assert follower.step() == settled
