"""``shoal doctor``'s judgement of clocks (``discovery.doctor``), and its time bound (``agent.cli.doctor_cmd``)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

import agent.cli.doctor_cmd as doctor_cmd
from agent.fleet import init_fleet, issue_node
from agent.transport.tls import server_context
from discovery.doctor import check_members
from tests.support.stream_server import serving

DAYS_2 = 2 * 86400.0
BEHIND = "pc3's clock is 2 days behind this PC's (pc1): pc1's certificate is not yet valid by it; set pc3's clock (NTP)"


def peer(name: str, state: str, skew: float | None, clock: str | None = None) -> dict[str, Any]:
    return {
        "node": name,
        "name": name,
        "state": state,
        "address": f"10.0.0.{name[-1]}:7100",
        "why": clock or "",
        "clock_skew": skew,
        "clock": clock,
        "announces": {"version": "0.1.0"},
    }


def clock_findings(*members: dict[str, Any]) -> list[tuple[bool, str]]:
    found = check_members({"members": list(members)}, "0.1.0", {})
    return [(f.ok, f.message) for f in found if f.check == "clock"]


def test_a_pc_two_days_ahead_works_and_doctor_says_so_on_both_sides() -> None:
    # issue 41 §4: it said "certificates are refused beyond 5 minutes" of a link that was up
    here = clock_findings(peer("pc2", "member", DAYS_2))
    there = clock_findings(peer("pc1", "member", -DAYS_2))
    assert here == [
        (
            True,
            "pc2's clock is 2 days ahead of this PC's: links work; pc2 refuses a certificate only in its last 2 days "
            "before it expires. Set the wrong clock right (NTP)",
        )
    ]
    assert there == [
        (
            True,
            "pc1's clock is 2 days behind this PC's: links work with certificates older than 2 days; pc1 refuses one "
            "issued since as not yet valid. Set the wrong clock right (NTP)",
        )
    ]
    assert clock_findings(peer("pc2", "member", 20.0)) == []  # a drift of seconds is nothing


def test_a_pc_two_days_behind_that_cannot_link_is_a_problem_in_the_agents_own_words() -> None:
    assert clock_findings(peer("pc3", "unverified", -DAYS_2, BEHIND)) == [(False, BEHIND)]


def test_doctor_moves_on_from_an_agent_that_completes_its_handshake_and_never_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(doctor_cmd, "PEER_TIMEOUT", 0.3)
    monkeypatch.setattr(doctor_cmd, "ASK_TIMEOUT", 1.0)
    init_fleet(tmp_path / "fleet", "ours")
    me = issue_node(tmp_path / "fleet", "pc1")

    async def main() -> tuple[float, list[Any]]:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await asyncio.sleep(30)

        async with serving(silent, ssl=server_context(me)) as port:
            start = time.monotonic()
            findings = await doctor_cmd.diagnose(me, f"127.0.0.1:{port}", 0.1)
            took = time.monotonic() - start
        return took, findings

    took, findings = asyncio.run(main())
    agent = next(f for f in findings if f.check == "agent")
    assert not agent.ok and "does not answer" in agent.message
    assert took < 1.5
