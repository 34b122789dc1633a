"""Clocks set days wrong between real agents in one process (real mutual TLS on 127.0.0.1), issue 41 §4.

The system clock is never changed here. A PC whose clock is 2 days behind its fleet is played the other way
round: its peer lives 2 days ahead, with a certificate the CA issued by that peer's clock (so this machine's
real clock finds it not yet valid, as the behind PC's would) and an injected wall clock 2 days ahead.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

import discovery.service
from agent.cli.status_cmd import status_lines
from agent.cli.status_link import fetch_status
from agent.daemon import Daemon
from agent.files import write_atomic
from agent.fleet import NodeIdentity, init_fleet, issue_node
from agent.fleet.authority import load_ca, node_certificate
from discovery.service import MembershipService
from tests.unit.test_fleet_members import agent, members, until

pytestmark = pytest.mark.timeout(60)
DAYS_2 = 2 * 86400.0
BEHIND = "pc3's clock is 2 days behind this PC's (pc1): pc1's certificate is not yet valid by it; set pc3's clock (NTP)"
"""What pc1 (whose clock is right) says of pc3."""
BEHIND_HERE = (
    "pc3's clock (this PC) is 2 days behind pc1's: pc1's certificate is not yet valid by it; set pc3's clock (NTP)"
)
"""What pc3 says of itself."""


def dated(fleet: Path, identity: NodeIdentity, at: dt.datetime) -> NodeIdentity:
    """``identity`` with its certificate issued again (same key, same node id) by a CA whose clock read ``at``."""
    ca_key, ca_cert = load_ca(fleet)
    cert = node_certificate(ca_key, ca_cert, identity.certificate().public_key(), identity.name, now=at)
    write_atomic(identity.cert, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return identity


def ahead(seconds: float) -> Callable[[MembershipService], None]:
    def set_wall(service: MembershipService) -> None:
        service._wall = lambda: time.time() + seconds

    return set_wall


def member(daemon: Daemon, name: str) -> dict[str, object]:
    """What ``daemon``'s status says of its peer ``name`` (empty: nothing yet)."""
    return next((m for m in members(daemon).status()["members"] if m["name"] == name), {})


def test_a_pc_two_days_behind_is_told_on_both_sides_once_and_in_the_status(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(discovery.service, "RETRY_MAX", 0.3)  # probes come every 0.3 s: the log must not repeat
    init_fleet(tmp_path / "fleet", "ours")
    pc1 = dated(tmp_path / "fleet", issue_node(tmp_path / "fleet", "pc1"), dt.datetime.now(dt.UTC) + dt.timedelta(2))
    pc3 = issue_node(tmp_path / "fleet", "pc3")

    async def main() -> None:
        async with agent(pc1, before_start=ahead(DAYS_2)) as one, agent(pc3, one) as three:
            await until(lambda: member(three, "pc1").get("clock") == BEHIND_HERE)
            await until(lambda: member(one, "pc3").get("clock") == BEHIND)
            for daemon, peer, sentence, skew in ((one, "pc3", BEHIND, -DAYS_2), (three, "pc1", BEHIND_HERE, DAYS_2)):
                seen = member(daemon, peer)
                assert seen["state"] == "unverified" and seen["why"] == sentence
                assert seen["clock_skew"] == pytest.approx(skew, abs=5)
            await asyncio.sleep(1.5)  # several probes more: each side told its log once
            assert member(three, "pc1")["state"] == member(one, "pc3")["state"] == "unverified"
            # `shoal status` on each side says it in a line of its own (pc3 asked over the wire: pc1's certificate
            # is not yet valid by this machine's clock, so pc1 is read in process)
            assert three.addresses is not None
            by_pc3 = await fetch_status(three.addresses.ring, pc3)
            by_pc1 = {"members": members(one).status()}
            for status, sentence in ((by_pc1, BEHIND), (by_pc3, BEHIND_HERE)):
                assert f"  pc{3 if sentence == BEHIND else 1} is unverified: {sentence}" in status_lines("here", status)

    with caplog.at_level(logging.DEBUG, logger="discovery.service"), caplog.at_level(logging.DEBUG):
        asyncio.run(main())
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert sum(BEHIND in line for line in warned) == 1
    assert sum(BEHIND_HERE in line for line in warned) == 1
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any(BEHIND in line for line in debug) and any(BEHIND_HERE in line for line in debug)
    # the handshakes that fail on the dates: pc3 says what it means, once, and neither side repeats at warning
    handshakes = [line for line in warned if "TLS handshake failed" in line]
    assert len(handshakes) == len(set(h.split(": TLS handshake failed")[0].split(":")[0] for h in handshakes))
    assert any("not yet valid by this PC's clock: this PC's clock is probably behind" in h for h in handshakes)


def test_a_pc_two_days_ahead_links_and_its_skew_is_known(tmp_path: Path) -> None:
    init_fleet(tmp_path / "fleet", "ours")
    pc1, pc2 = issue_node(tmp_path / "fleet", "pc1"), issue_node(tmp_path / "fleet", "pc2")

    async def main() -> None:
        async with agent(pc1) as one, agent(pc2, one, before_start=ahead(DAYS_2)) as two:
            await until(lambda: member(one, "pc2").get("state") == member(two, "pc1").get("state") == "member")
            assert member(one, "pc2")["clock_skew"] == pytest.approx(DAYS_2, abs=5)
            assert member(two, "pc1")["clock_skew"] == pytest.approx(-DAYS_2, abs=5)
            assert member(one, "pc2")["clock"] is None and member(two, "pc1")["clock"] is None

    asyncio.run(main())
