"""Fleet membership between real agents in one process: real mutual TLS on 127.0.0.1, seeds and gossip.

Agents here are built by ``Daemon.build`` from a config with nothing but an identity, as ``shoal agent``
builds them; on loopback they announce nothing over mDNS (the lab tests, in network namespaces, do).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.cli.status_link import StatusLink
from agent.daemon import Daemon
from agent.errors import FleetError, PeerUnavailableError
from agent.fleet import NodeIdentity, init_fleet, issue_node
from agent.fleet.revocation import revoke_node
from agent.node.config import AgentConfig
from discovery.admin import push_revocations
from discovery.announcement import Announcement
from discovery.service import MembershipService

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def identities(tmp_path_factory: pytest.TempPathFactory) -> dict[str, NodeIdentity]:
    ours, theirs = tmp_path_factory.mktemp("fleet"), tmp_path_factory.mktemp("other-fleet")
    init_fleet(ours, "ours")
    init_fleet(theirs, "theirs")
    found = {name: issue_node(ours, name) for name in ("alpha", "beta", "gamma")}
    found["mallory"] = issue_node(theirs, "mallory")
    return found


def folder(identity: NodeIdentity) -> Path:
    return identity.cert.parent


@asynccontextmanager
async def agent(
    identity: NodeIdentity,
    *seeds: Daemon,
    before_start: Callable[[MembershipService], None] | None = None,
    **changes: Any,
) -> AsyncIterator[Daemon]:
    peers = tuple(d.addresses.ring for d in seeds if d.addresses is not None)
    config = AgentConfig(export_dir=None, stages=(), identity_dir=folder(identity), peers=peers, **changes)
    daemon = await Daemon.build(config)
    if before_start is not None:
        before_start(members(daemon))
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop()


def members(daemon: Daemon) -> MembershipService:
    part = daemon.parts[0]
    assert isinstance(part, MembershipService)
    return part


def states(daemon: Daemon) -> dict[str, str]:
    return {m["name"]: m["state"] for m in members(daemon).status()["members"]}


async def until(check: Callable[[], bool], timeout: float = 5.0) -> float:
    start = time.monotonic()
    while not check():
        if time.monotonic() - start > timeout:
            raise AssertionError("not within the time")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


def test_one_seed_is_enough_every_agent_lists_every_other_and_a_clean_stop_is_gone_at_once(
    identities: dict[str, NodeIdentity],
) -> None:
    async def main() -> None:
        async with agent(identities["alpha"]) as a, agent(identities["beta"], a) as b:
            async with agent(identities["gamma"], a) as c:
                took = await until(
                    lambda: (
                        states(a) == {"beta": "member", "gamma": "member"}
                        and states(b) == {"alpha": "member", "gamma": "member"}
                        and states(c) == {"alpha": "member", "beta": "member"}
                    )
                )
                assert took < 3.0
                # beta learnt of gamma through alpha's gossip, and reached it itself
                gamma_at_b = next(m for m in members(b).status()["members"] if m["name"] == "gamma")
                assert "gossip" in gamma_at_b["found"] and gamma_at_b["last_heard"] is not None
                assert gamma_at_b["announces"]["devices"]  # OpenVINO's devices, measured at start
                assert abs(gamma_at_b["clock_skew"]) < 1.0
            await until(lambda: states(a)["gamma"] == "gone" and states(b)["gamma"] == "gone", timeout=1.0)

    asyncio.run(main())


def test_an_agent_with_a_copied_identity_is_refused_and_stops_with_what_to_do(
    identities: dict[str, NodeIdentity], caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with agent(identities["alpha"]) as a:
            await asyncio.sleep(1.1)  # the copy starts later (announcements count whole seconds)
            async with agent(identities["alpha"], a) as copy:
                await asyncio.wait_for(copy.stopped.wait(), 5.0)
                assert copy.failure is not None
                assert "another agent already runs with this PC's identity" in copy.failure
                assert "shoal join" in copy.failure
                assert not a.stopped.is_set() and states(a) == {}

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    assert any("refused a second agent with this node's identity" in r.getMessage() for r in caplog.records)


def started_later(copy: MembershipService, original: MembershipService) -> None:
    """The copy starts after the original, and its announced start says so."""
    copy.state = replace(copy.state, me=replace(copy.me, started=original.me.started + 1))


def started_the_same_second(copy: MembershipService, original: MembershipService) -> None:
    """One announced start second for both; the copy's instance sorts first (the tie-break that was)."""
    copy.state = replace(copy.state, me=replace(copy.me, started=original.me.started, instance="0" * 16))


def clock_two_minutes_behind(copy: MembershipService, original: MembershipService) -> None:
    """The copy's PC has its wall clock two minutes behind: it announces a start two minutes earlier."""
    copy.state = replace(copy.state, me=replace(copy.me, started=original.me.started - 120))
    copy._wall = lambda: time.time() - 120


@pytest.mark.parametrize(
    ("when", "seeds"),
    [
        (started_later, "beta"),  # it learns where the original is from beta's refusal
        (started_later, "beta and alpha"),  # as mDNS finds both: it meets beta and the original at once
        (started_the_same_second, "beta and alpha"),
        (clock_two_minutes_behind, "beta and alpha"),
    ],
)
def test_a_copy_that_joins_a_fleet_stops_and_the_original_stays_a_member_everywhere(
    identities: dict[str, NodeIdentity],
    caplog: pytest.LogCaptureFixture,
    when: Callable[[MembershipService, MembershipService], None],
    seeds: str,
) -> None:
    async def main() -> None:
        async with agent(identities["alpha"]) as a, agent(identities["beta"], a) as b:
            await until(lambda: states(a) == {"beta": "member"} and states(b) == {"alpha": "member"})
            original = members(a).me
            through = (b, a) if seeds == "beta and alpha" else (b,)
            async with agent(identities["alpha"], *through, before_start=lambda c: when(c, members(a))) as copy:
                await asyncio.wait_for(copy.stopped.wait(), 10.0)
                assert copy.failure is not None and "shoal join" in copy.failure
            for _ in range(20):  # the copy is gone: beta still has the original, at its own address
                assert not a.stopped.is_set()
                assert states(b) == {"alpha": "member"} and states(a) == {"beta": "member"}
                alpha_at_b = members(b).state.members[original.node].announcement
                assert (alpha_at_b.instance, alpha_at_b.port) == (original.instance, original.port)
                await asyncio.sleep(0.1)

    with caplog.at_level(logging.INFO, logger="discovery.service"):
        asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records]
    assert not any("(alpha): member -> gone" in line or "(alpha): member -> lost" in line for line in lines)
    assert any("refused a second agent with this node's identity" in line for line in lines)


def test_a_copy_a_member_took_elsewhere_yields_without_a_goodbye_when_the_two_halves_meet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    init_fleet(tmp_path / "fleet", "ours")
    ids = {name: issue_node(tmp_path / "fleet", name) for name in ("alpha", "beta", "gamma", "delta")}

    def holds(daemon: Daemon, original: Announcement) -> bool:
        member = members(daemon).state.get(original.node)
        return (
            member is not None and str(member.state) == "member" and member.announcement.instance == original.instance
        )

    async def main() -> None:
        async with agent(ids["alpha"]) as a, agent(ids["beta"], a) as b, agent(ids["gamma"]) as c:
            await until(lambda: states(b) == {"alpha": "member"})
            original = members(a).me
            async with AsyncExitStack() as stack:
                # the copy joins gamma, which knows nothing of the original yet: there the copy is alpha
                copy = await stack.enter_async_context(agent(ids["alpha"], c))
                await until(lambda: states(c) == {"alpha": "member"} and states(copy) == {"gamma": "member"})
                # delta links the two halves: the original and the copy meet, and the copy (a member later) stops
                d = await stack.enter_async_context(agent(ids["delta"], b, c))
                await asyncio.wait_for(copy.stopped.wait(), 20.0)
                assert copy.failure is not None and "shoal join" in copy.failure
                await copy.stop()  # as `shoal agent` does once told
                await until(lambda: all(holds(x, original) for x in (b, c, d)), timeout=20.0)
                assert not a.stopped.is_set()

    with caplog.at_level(logging.INFO, logger="discovery.service"):
        asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records]
    assert not any("(alpha): member -> gone" in line for line in lines)  # nobody took the copy's word for it
    assert any("refused a second agent with this node's identity" in line for line in lines)


def test_an_agent_of_another_fleet_is_refused_at_the_handshake(
    identities: dict[str, NodeIdentity], caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with agent(identities["alpha"]) as a, agent(identities["mallory"], a) as m:
            await asyncio.sleep(1.5)
            assert states(a) == {} and states(m) == {}

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    assert any("TLS handshake failed" in r.getMessage() for r in caplog.records)


def test_a_member_whose_link_is_cut_without_a_goodbye_is_lost_and_then_a_member_again(
    identities: dict[str, NodeIdentity], caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with agent(identities["alpha"]) as a, agent(identities["beta"], a) as b:
            await until(lambda: states(a) == {"beta": "member"} and states(b) == {"alpha": "member"})
            for link in members(a)._links:  # as a cut cable does: no goodbye, no leave
                link.connection.abort()
            await until(lambda: any("member -> lost: link broke" in r.getMessage() for r in caplog.records))
            await until(lambda: states(a) == {"beta": "member"} and states(b) == {"alpha": "member"})

    with caplog.at_level(logging.INFO, logger="discovery.service"):
        asyncio.run(main())
    lines = [r.getMessage() for r in caplog.records if " member " in r.getMessage()]
    broke = next(i for i, line in enumerate(lines) if "member -> lost: link broke without a goodbye" in line)
    peer = lines[broke].split(":")[0]  # "node=X member Y (name)"
    assert any(line.startswith(peer + ": lost -> member") for line in lines[broke:])  # redialled, no restart


def test_a_revoked_node_is_dropped_everywhere_and_can_no_longer_connect(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    init_fleet(tmp_path / "fleet", "ours")
    ids = {name: issue_node(tmp_path / "fleet", name) for name in ("alpha", "beta", "gamma")}
    revoke_node(tmp_path / "fleet", "gamma")
    document = (tmp_path / "fleet" / "revocations.json").read_bytes()
    forged = document.replace(b'"version\\":1', b'"version\\":7')

    async def main() -> None:
        async with agent(ids["alpha"]) as a, agent(ids["beta"], a) as b, agent(ids["gamma"], a) as c:
            await until(lambda: states(a) == {"beta": "member", "gamma": "member"} and len(states(b)) == 2)
            assert a.addresses is not None and c.addresses is not None
            with pytest.raises(FleetError, match="refused the revocation list"):
                await push_revocations(a.addresses.ring, ids["beta"], forged)
            assert await push_revocations(a.addresses.ring, ids["beta"], document) == "version 1 taken"
            # beta hears of it from alpha; both drop gamma's links
            await until(lambda: states(a)["gamma"] == "revoked" and states(b)["gamma"] == "revoked")
            assert await push_revocations(a.addresses.ring, ids["beta"], document) == "not newer than version 1"
            with pytest.raises(PeerUnavailableError):  # its next handshake, on the ring's port too
                await StatusLink.open(a.addresses.ring, ids["gamma"], timeout=2)
            await asyncio.sleep(0.5)
            assert states(a)["gamma"] == "revoked"
        # the list outlives a restart
        async with agent(ids["alpha"]) as a:
            assert a.addresses is not None
            with pytest.raises(PeerUnavailableError):
                await StatusLink.open(a.addresses.ring, ids["gamma"], timeout=2)

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    messages = [r.getMessage() for r in caplog.records]
    assert any("refused the revocation list from admin beta (peer 127.0.0.1" in m for m in messages)
    assert any("its certificate is on the fleet's revocation list" in m for m in messages)
    assert any("dropped" in m and "its certificate is revoked" in m for m in messages)  # open links closed
