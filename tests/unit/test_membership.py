"""Fleet membership as a pure function (``discovery.membership.apply``), tested with plain values."""

from __future__ import annotations

import json
import time
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.errors import RemoteProtocolError
from agent.wire import Frame, FrameType
from discovery import control
from discovery.announcement import MAX_ENTRY, Announcement, HeldStage, problem_text
from discovery.membership import (
    Duplicate,
    Event,
    Heartbeat,
    Left,
    LinkBroken,
    Membership,
    MemberState,
    Revoked,
    Seen,
    Seniority,
    Source,
    Tick,
    Unlinkable,
    Verified,
    apply,
    changes,
    outranks,
)

FLEET = "f" * 16


def announce(n: int, **changes: object) -> Announcement:
    base = Announcement(
        node=f"{n:012x}",
        name=f"pc{n}",
        fleet=FLEET,
        fingerprint="sha256:" + f"{n:064x}",
        version="0.1.0",
        protocol=4,
        port=7100,
        instance=f"{n:08x}",
        started=1000 + n,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


ME = announce(0)


def run(*events: Event, lost_after: float = 10.0) -> Membership:
    state = Membership(ME, lost_after)
    for event in events:
        state = apply(event, state)
    return state


def state_of(state: Membership, n: int) -> MemberState | None:
    member = state.get(f"{n:012x}")
    return None if member is None else member.state


def test_a_claim_is_unverified_until_its_handshake_and_then_a_member() -> None:
    state = run(Seen(announce(1), "10.0.0.1", Source.MDNS, 0.0))
    assert state_of(state, 1) is MemberState.UNVERIFIED
    state = apply(Verified(announce(1), "10.0.0.1", Source.MDNS, 1.0), state)
    member = state.get(announce(1).node)
    assert member is not None and member.state is MemberState.MEMBER and member.last_heard == 1.0
    assert member.found == {Source.MDNS}


def test_heartbeats_of_an_unverified_peer_prove_nothing() -> None:
    state = run(Seen(announce(1), "h", Source.GOSSIP, 0.0), Heartbeat(announce(1).node, 1.0))
    assert state_of(state, 1) is MemberState.UNVERIFIED


def test_a_member_unheard_for_lost_after_is_lost_and_comes_back_when_heard() -> None:
    state = run(Verified(announce(1), "h", Source.SEED, 0.0), Heartbeat(announce(1).node, 5.0), Tick(14.9))
    assert state_of(state, 1) is MemberState.MEMBER
    state = apply(Tick(15.1), state)
    assert state_of(state, 1) is MemberState.LOST
    assert "unheard for 10.1 s" in state.members[announce(1).node].why
    state = apply(Heartbeat(announce(1).node, 16.0), state)
    assert state_of(state, 1) is MemberState.MEMBER


def test_the_lost_after_setting_decides() -> None:
    state = run(Verified(announce(1), "h", Source.SEED, 0.0), Tick(3.5), lost_after=3.0)
    assert state_of(state, 1) is MemberState.LOST


def test_a_broken_link_loses_a_member_at_once_and_a_goodbye_makes_it_gone() -> None:
    node = announce(1).node
    state = run(Verified(announce(1), "h", Source.SEED, 0.0), LinkBroken(node, 1.0, "reset", announce(1).instance))
    assert state_of(state, 1) is MemberState.LOST
    state = run(Verified(announce(1), "h", Source.SEED, 0.0), Left(node, 1.0, announce(1).instance))
    assert state_of(state, 1) is MemberState.GONE
    assert apply(Tick(100.0), state) is state  # gone is not lost later


def test_a_peer_that_cannot_link_until_people_act_says_why_until_its_link_comes_up() -> None:
    node, clock = announce(1).node, "pc1's clock is 2 days behind this PC's (pc0): ...; set pc1's clock (NTP)"
    state = run(Seen(announce(1), "h", Source.MDNS, 0.0), Unlinkable(node, clock, 1.0))
    assert state_of(state, 1) is MemberState.UNVERIFIED and state.members[node].why == clock
    assert apply(Unlinkable(node, clock, 2.0), state) is state
    later = apply(Seen(replace(announce(1), sequence=3), "h", Source.MDNS, 3.0), state)
    assert later.members[node].why == clock  # a newer claim is no news about its clock
    linked = apply(Verified(announce(1), "h", Source.MDNS, 4.0), state)  # its clock was set right
    assert state_of(linked, 1) is MemberState.MEMBER and linked.members[node].why == ""
    assert apply(Unlinkable(node, clock, 5.0), linked) is linked  # a member's link is up: nothing to say
    lost = run(Verified(announce(1), "h", Source.SEED, 0.0), LinkBroken(node, 1.0, "reset", announce(1).instance))
    assert apply(Unlinkable(node, clock, 2.0), lost).members[node].why == clock
    assert apply(Unlinkable(announce(2).node, clock, 2.0), lost) is lost  # an unknown peer: nothing to say of it


def test_a_peer_that_said_goodbye_and_is_announced_by_a_new_process_is_checked_again() -> None:
    node = announce(1).node
    state = run(Verified(announce(1), "h", Source.MDNS, 0.0), Left(node, 1.0, announce(1).instance))
    state = apply(Seen(announce(1), "h", Source.MDNS, 2.0), state)
    assert state_of(state, 1) is MemberState.GONE  # the same process's old record
    state = apply(Seen(announce(1, instance="abcdef01"), "h", Source.MDNS, 3.0), state)
    assert state_of(state, 1) is MemberState.UNVERIFIED


@pytest.mark.parametrize(
    ("peer", "why"),
    [
        (announce(1, fleet="a" * 16), "of fleet aaaaaaaaaaaaaaaa"),
        (announce(1, protocol=3), "speaks protocol 3"),
        (announce(1, schema=2), "schema 2"),
    ],
)
def test_a_peer_of_another_fleet_or_protocol_is_foreign_and_stays_so(peer: Announcement, why: str) -> None:
    state = run(Seen(peer, "h", Source.MDNS, 0.0))
    member = state.get(peer.node)
    assert member is not None and member.state is MemberState.FOREIGN and why in member.why
    assert state_of(apply(Heartbeat(peer.node, 1.0), state), 1) is MemberState.FOREIGN


def test_revocation_is_for_good() -> None:
    node = announce(1).node
    state = run(Verified(announce(1), "h", Source.SEED, 0.0), Revoked(frozenset({node}), 1.0))
    assert state_of(state, 1) is MemberState.REVOKED
    for event in (Heartbeat(node, 2.0), Verified(announce(1), "h", Source.SEED, 3.0), Tick(50.0)):
        state = apply(event, state)
        assert state_of(state, 1) is MemberState.REVOKED
    # one revoked before it was ever seen is revoked on arrival
    state = run(Revoked(frozenset({announce(2).node}), 0.0), Verified(announce(2), "h", Source.MDNS, 1.0))
    assert state_of(state, 2) is MemberState.REVOKED


def test_our_own_announcement_is_not_a_member_and_a_copy_of_our_identity_is_a_duplicate() -> None:
    copy = replace(ME, instance="12345678")
    assert run(Verified(ME, "h", Source.SEED, 0.0)).members == {}
    assert run(Seen(copy, "h", Source.MDNS, 0.0)).duplicate is None  # a claim only
    assert run(Verified(copy, "h", Source.SEED, 0.0)).members == {}
    mine, theirs = Seniority(ME.instance, 30.0, 40.0), Seniority(copy.instance, None, 2.0)
    state = run(Duplicate(copy, mine, theirs, 0.0))
    assert state.duplicate == copy and not state.yields_to_duplicate
    state = run(Duplicate(copy, theirs, mine, 0.0))
    assert state.duplicate == copy and state.yields_to_duplicate
    # once lost, lost: a third process that this one outranks does not undo it
    third = replace(ME, instance="9abcdef0")
    state = apply(Duplicate(third, theirs, Seniority(third.instance, None, 1.0), 1.0), state)
    assert state.duplicate == third and state.yields_to_duplicate
    assert run(Duplicate(ME, mine, mine, 0.0)).duplicate is None  # this very process


@pytest.mark.parametrize(
    ("senior", "junior"),
    [
        # accepted by a member first, whatever the running times
        (Seniority("ffffffff", 0.5, 1.0), Seniority("00000000", None, 3600.0)),
        (Seniority("ffffffff", 60.0, 61.0), Seniority("00000000", 59.9, 7200.0)),
        # no member accepted either yet (an agent alone in its fleet, a copy dialling it): the longer running
        (Seniority("ffffffff", None, 1.2), Seniority("00000000", None, 1.1)),
        # the very same moment: the nonce, not a clock
        (Seniority("00000000", 5.0, 9.0), Seniority("ffffffff", 5.0, 9.0)),
        (Seniority("00000000", None, 9.0), Seniority("ffffffff", None, 9.0)),
    ],
)
def test_of_two_processes_with_one_identity_the_one_a_member_accepted_first_keeps_it(
    senior: Seniority, junior: Seniority
) -> None:
    assert outranks(senior, junior) and not outranks(junior, senior)


seniorities = st.builds(
    Seniority,
    st.sampled_from(["00000000", "12345678", "ffffffff"]),
    st.one_of(st.none(), st.sampled_from([0.0, 1.0, 2.5])),
    st.sampled_from([0.0, 1.0, 2.5, 100.0]),
)


@given(seniorities, seniorities, seniorities)
def test_exactly_one_of_two_processes_keeps_the_identity_and_the_order_is_total(
    a: Seniority, b: Seniority, c: Seniority
) -> None:
    if a.instance != b.instance:
        assert outranks(a, b) != outranks(b, a)  # both ends of a link decide alike: one yields
    if outranks(a, b) and outranks(b, c):
        assert outranks(a, c)  # three copies at once: the most senior is the one left


def test_a_hello_tells_its_seniority_and_a_refusal_where_the_process_held_is() -> None:
    for hello in (control.Hello(ME, 5.0, 1, 2, 12.5, 30.25), control.Hello(ME, 5.0, 1, 2, None, 0.5)):
        assert control.from_frame(control.to_frame(hello)) == hello
    refused = control.Refused("a copy", control.GossipEntry("10.0.0.1", announce(1)))
    assert control.from_frame(control.to_frame(refused)) == refused
    older = b'{"kind":"hello","announcement":%s,"time":5,"revocations":0}' % json.dumps(ME.to_properties()).encode()
    assert control.from_frame(Frame.message(FrameType.MEMBERS, older)) == control.Hello(ME, 5.0)  # an older peer
    for bad in (b"Infinity", b"NaN", b"-1", b'"long"'):
        body = older.replace(b'"time":5', b'"time":5,"up":' + bad)
        with pytest.raises(RemoteProtocolError, match="'up'"):
            control.from_frame(Frame.message(FrameType.MEMBERS, body))


def test_a_goodbye_or_a_broken_link_of_another_process_with_the_node_id_changes_nothing() -> None:
    node, copy = announce(1).node, "c0c0c0c0"
    state = run(Verified(announce(1), "h", Source.SEED, 0.0))
    for event in (Left(node, 1.0, copy), LinkBroken(node, 1.0, "reset", copy)):
        assert apply(event, state) is state
    assert state_of(apply(Left(node, 1.0, announce(1).instance), state), 1) is MemberState.GONE


def test_a_claim_about_another_process_with_a_members_node_id_does_not_replace_the_linked_one() -> None:
    linked = announce(1)
    copy = announce(1, instance="c0c0c0c0", port=7200).changed(donor="away").changed(donor="off")
    state = run(Verified(linked, "10.0.0.1", Source.SEED, 0.0), Seen(copy, "10.0.0.9", Source.GOSSIP, 1.0))
    member = state.members[linked.node]
    assert (member.state, member.announcement, member.address) == (MemberState.MEMBER, linked, ("10.0.0.1", 7100))
    # once the linked one is lost, a claim of another process is news again (a restart elsewhere)
    lost = run(
        Verified(linked, "10.0.0.1", Source.SEED, 0.0),
        LinkBroken(linked.node, 1.0, "reset", linked.instance),
        Seen(copy, "10.0.0.9", Source.GOSSIP, 2.0),
    )
    assert lost.members[linked.node].announcement == copy


def test_a_newer_announcement_replaces_an_older_one_but_not_the_reverse() -> None:
    newer = announce(1).changed(donor="away")
    state = run(Verified(newer, "h", Source.SEED, 0.0), Seen(announce(1), "h", Source.MDNS, 1.0))
    assert state.members[newer.node].announcement.donor == "away"


def test_an_older_mdns_record_of_a_linked_member_still_says_it_was_found_over_mdns() -> None:
    # mDNS lags the control link: the member's announcement is the link's newer one, but mDNS found it too
    newer = announce(1).changed(donor="away")
    state = run(Verified(newer, "h", Source.INBOUND, 0.0), Seen(announce(1), "h", Source.MDNS, 1.0))
    member = state.members[newer.node]
    assert member.announcement == newer and member.found == {Source.INBOUND, Source.MDNS}
    assert run(Verified(newer, "h", Source.INBOUND, 0.0), Seen(announce(1), "h", Source.MDNS, 1.0)) == state


def test_changes_name_every_move_once() -> None:
    node = announce(1).node
    a = run(Seen(announce(1), "h", Source.MDNS, 0.0))
    b = apply(Verified(announce(1), "h", Source.MDNS, 1.0), a)
    assert [(c.before, c.after) for c in changes(a, b)] == [(MemberState.UNVERIFIED, MemberState.MEMBER)]
    assert changes(b, apply(Heartbeat(node, 2.0), b)) == []


def test_apply_is_pure() -> None:
    state = run(Verified(announce(1), "h", Source.SEED, 0.0))
    frozen = dict(state.members)
    apply(LinkBroken(announce(1).node, 1.0, "x", announce(1).instance), state)
    assert dict(state.members) == frozen
    with pytest.raises(TypeError):
        state.members["x"] = state.members[announce(1).node]  # type: ignore[index]


events = st.one_of(
    st.builds(lambda n, t: Verified(announce(n), "h", Source.SEED, t), st.integers(1, 5), st.floats(0, 100)),
    st.builds(lambda n, t: Seen(announce(n), "h", Source.MDNS, t), st.integers(1, 5), st.floats(0, 100)),
    st.builds(lambda n, t: Heartbeat(announce(n).node, t), st.integers(1, 5), st.floats(0, 100)),
    st.builds(
        lambda n, t: LinkBroken(announce(n).node, t, "x", announce(n).instance), st.integers(1, 5), st.floats(0, 100)
    ),
    st.builds(lambda n, t: Left(announce(n).node, t, announce(n).instance), st.integers(1, 5), st.floats(0, 100)),
    st.builds(Tick, st.floats(0, 100)),
    st.builds(lambda n, t: Unlinkable(announce(n).node, "a clock", t), st.integers(1, 5), st.floats(0, 100)),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(events, max_size=30))
def test_only_a_handshake_or_a_link_makes_a_member_and_nothing_undoes_a_revocation(history: list[Event]) -> None:
    state = run(Revoked(frozenset({announce(5).node}), 0.0))
    for event in history:
        before = state
        state = apply(event, state)
        for change in changes(before, state):
            if change.after is MemberState.MEMBER:
                assert isinstance(event, Verified | Heartbeat)
        assert state_of(state, 5) in (None, MemberState.REVOKED)


def test_a_thousand_members_and_ten_thousand_events_stay_well_under_a_millisecond_each() -> None:
    state = Membership(ME)
    for n in range(1, 1001):
        state = apply(Verified(announce(n), "h", Source.MDNS, 0.0), state)
    history: list[Event] = [Heartbeat(announce(1 + i % 1000).node, i / 1000) for i in range(9000)]
    history += [Tick(i / 100) for i in range(1000)]
    start = time.perf_counter()
    for event in history:
        state = apply(event, state)
    per_event = (time.perf_counter() - start) / len(history)
    print(f"membership: {per_event * 1e6:.1f} us per event over 1,000 members")
    assert per_event < 1e-3


def test_an_announcement_round_trips_through_txt_and_each_entry_fits() -> None:
    rich = announce(3, devices=("CPU", "GPU.0"), memory_mb=12000, speed=55.5, donor="draining").changed(
        stages=(HeldStage(0, "ready"), HeldStage(1, "downloading", 42), HeldStage(2, "downloading"))
    )
    properties = rich.to_properties()
    assert all(len(k) + 1 + len(v.encode()) <= MAX_ENTRY for k, v in properties.items())
    wire = {k.encode(): v.encode() for k, v in properties.items()}
    assert Announcement.from_properties(wire) == rich


def test_a_stage_that_is_stuck_says_why_in_one_txt_entry_and_only_then() -> None:
    # the reason a stage waits (the last failed fetch) rides the announcement to every head, cut to one entry
    failure = "office/smol@089676c25fba: cannot download stage-0/openvino_model.bin (Connection refused)\n" * 9
    stuck = announce(1).changed(stages=(HeldStage(0, "downloading", 50),), problem=problem_text(failure + "é€"))
    properties = stuck.to_properties()
    assert len(properties["w"].encode()) <= MAX_ENTRY - 2 and properties["w"].endswith("…")
    assert properties["w"].startswith("office/smol@089676c25fba: cannot download") and "\n" not in properties["w"]
    assert Announcement.from_properties({k.encode(): v.encode() for k, v in properties.items()}) == stuck
    assert "w" not in announce(1).to_properties()  # nothing failed: nothing said
    assert problem_text("a\tb\x00c") == "a b?c"
    with pytest.raises(RemoteProtocolError):
        Announcement.from_properties({**{k: v for k, v in properties.items()}, "w": "x" * 300})


@pytest.mark.parametrize(
    "damage",
    [
        {"id": b"not-hex"},
        {"port": b"99999"},
        {"fp": b"md5:00"},
        {"st": b"0:exploded"},
        {"st": b"0:ready@50"},
        {"st": b"0:downloading@101"},
        {"st": b"0:downloading@half"},
        {"n": b"\xff\xfe"},
        {"t": b"yesterday"},
        {"s": b""},
    ],
)
def test_a_malformed_announcement_is_one_protocol_error(damage: dict[str, bytes]) -> None:
    wire: dict[bytes, bytes | None] = {k.encode(): v.encode() for k, v in announce(1).to_properties().items()}
    wire.update({k.encode(): v for k, v in damage.items()})
    with pytest.raises(RemoteProtocolError):
        Announcement.from_properties(wire)


def test_a_link_the_same_process_opens_after_its_goodbye_proves_nothing() -> None:
    node = announce(1).node
    state = run(
        Verified(announce(1), "h", Source.SEED, 0.0),
        Left(node, 1.0, announce(1).instance),
        Verified(announce(1), "h", Source.INBOUND, 1.1),
    )
    assert state_of(state, 1) is MemberState.GONE
    restarted = apply(Verified(announce(1, instance="abcdef01"), "h", Source.INBOUND, 5.0), state)
    assert state_of(restarted, 1) is MemberState.MEMBER
