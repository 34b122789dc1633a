"""The donor watch applies the policy: it announces each state the policy reaches, once, with the drain's end
taken from whether the agent still holds a stage; and an agent's config turns it on (``--donor``, ``[donor]``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest

from agent.donor.policy import DonorSettings, Readings
from agent.errors import ConfigError
from agent.node.config import load_agent_config
from agent.node.donor_watch import DonorWatch
from discovery.service import MembershipService


class Me:
    name = "pc1"
    donor = "serving"


class FakeMembership:
    """What the watch uses of ``MembershipService``: this agent's announcement, and announce()."""

    def __init__(self) -> None:
        self.me = Me()
        self.announced: list[str] = []

    async def announce(self, **changes: Any) -> None:
        self.announced.append(changes["donor"])
        self.me.donor = changes["donor"]


class PC:
    """The readings of a PC whose clock and last input the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.last_input = 0.0

    def read(self) -> Readings:
        return Readings(self.now, self.now - self.last_input, None, 0.0, 8000, None)


def test_the_watch_announces_each_state_once_and_the_drain_ends_when_the_stage_is_gone() -> None:
    pc, membership, holding = PC(), FakeMembership(), [True]
    watch = DonorWatch(
        DonorSettings(idle_minutes=1.0),
        pc.read,
        cast(MembershipService, membership),
        lambda: holding[0],
        source=lambda: "x11",
    )

    async def at(seconds: float) -> str:
        pc.now += seconds
        return str((await watch.step()).state)

    async def main() -> list[str]:
        states = [await at(0), await at(1)]  # idle for 1000 s: serving, said once
        pc.last_input = pc.now + 0.5  # the owner is back
        states += [await at(1), await at(1)]  # draining while the stage is still held
        holding[0] = False  # the plan moved the stage away, the ring former let it go
        states += [await at(1)]
        states += [await at(30)]  # 32.5 s without input: still away (the owner may be reading)
        states += [await at(31)]  # 63.5 s without input (over a minute): serving again
        return states

    states = asyncio.run(main())
    assert states == ["serving", "serving", "draining", "draining", "away", "away", "serving"]
    assert membership.announced == ["serving", "draining", "away", "serving"]
    status = watch.status()
    assert status["state"] == "serving" and status["idle_source"] == "x11" and status["idle_seconds"] == 63.5


def test_a_drain_that_takes_too_long_ends_anyway() -> None:
    pc, membership = PC(), FakeMembership()
    watch = DonorWatch(DonorSettings(drain_seconds=5.0), pc.read, cast(MembershipService, membership), lambda: True)

    async def main() -> list[str]:
        await watch.step()
        pc.last_input = pc.now
        states = []
        for _ in range(7):
            pc.now += 1
            states.append(str((await watch.step()).state))
        return states

    assert asyncio.run(main()) == ["draining"] * 5 + ["away"] * 2


def test_an_agent_is_a_donor_by_flag_or_table_and_its_settings_are_checked(tmp_path: Path) -> None:
    identity = {"identity_dir": tmp_path}
    assert load_agent_config(None, identity).donor is None
    assert load_agent_config(None, {**identity, "donor": True}).donor == DonorSettings()
    toml = tmp_path / "agent.toml"
    toml.write_text('[donor]\nidle_minutes = 10\nschedule = ["mon-fri 18:00-08:00"]\n')
    settings = load_agent_config(toml, {**identity, "donor": True}).donor  # --donor keeps the table's settings
    assert settings is not None and settings.idle_minutes == 10 and len(settings.schedule) == 1
    toml.write_text("[donor]\nidle_minuts = 10\n")
    with pytest.raises(ConfigError, match="unknown donor settings: idle_minuts"):
        load_agent_config(toml, identity)
    toml.write_text('donor = "yes"\n')
    with pytest.raises(ConfigError, match="'donor' must be true, false or a table"):
        load_agent_config(toml, identity)
