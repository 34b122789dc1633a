"""A real ``shoal agent --donor`` reading a real X server (issue 43, acceptance 2).

The agent is a process of its own whose ``DISPLAY`` is a fresh Xvfb, with no session bus, so the X11 source is
the one that works. With no input it serves once its idle time passed; a key press sent with xdotool (a real
XTEST input event) makes it step aside at once, and its status says why and which source told it.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import pytest

from agent.cli.status_link import StatusLink
from agent.fleet import init_fleet, issue_node
from agent.node.launcher import launch_agent
from tests.desktop.test_x11_idle import press_key

pytestmark = [pytest.mark.desktop, pytest.mark.processes, pytest.mark.timeout(120)]

IDLE_SECONDS = 3.0


def test_an_agent_serves_while_its_x_display_is_idle_and_steps_aside_at_a_key_press(
    x_display: str, tmp_path: Path
) -> None:
    init_fleet(tmp_path / "fleet", "desk")
    pc = issue_node(tmp_path / "fleet", "pc1")
    reader = issue_node(tmp_path / "fleet", "admin")
    config = tmp_path / "agent.toml"
    # no other program's load may send it off meanwhile (this machine runs the suite beside it)
    config.write_text(f"[donor]\nidle_minutes = {IDLE_SECONDS / 60}\nmax_other_load = 1.0\n")
    env = {"DISPLAY": x_display, "DBUS_SESSION_BUS_ADDRESS": "", "XDG_CURRENT_DESKTOP": ""}
    press_key(x_display)  # the clock of idleness starts now
    agent = launch_agent(
        None,
        None,
        pc.cert.parent,
        tmp_path / "cache",
        extra_args=["--donor", "--config", str(config), "--no-mdns"],
        env={k: v for k, v in {**os.environ, **env}.items() if v},
        log_path=tmp_path / "agent.log",
        timeout=60,
    )

    async def watch() -> list[tuple[float, dict[str, Any]]]:
        link = await StatusLink.open(agent.address, reader)
        seen: list[tuple[float, dict[str, Any]]] = []
        pressed = 0.0
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                donor = (await link.get()).get("donor") or {}
                seen.append((time.monotonic(), donor))
                if donor.get("state") == "serving" and not pressed:
                    press_key(x_display)
                    pressed = time.monotonic()
                if pressed and donor.get("state") == "away":
                    return seen
                await asyncio.sleep(0.1)
        finally:
            await link.close()
        raise AssertionError(f"no serving, key, away within 60 s: {[d.get('state') for _, d in seen]}")

    try:
        seen = asyncio.run(watch())
    finally:
        agent.stop()
    states = [donor.get("state") for _, donor in seen]
    assert "serving" in states and states[-1] == "away"
    assert all(donor.get("idle_source") == "x11" for _, donor in seen)
    # it served only once the display had been idle for the idle time (on a loaded machine the agent may start
    # after that, and serve from its first reading)
    serving_from, serving = next((t, donor) for t, donor in seen if donor.get("state") == "serving")
    assert serving["idle_seconds"] >= IDLE_SECONDS
    assert all((donor.get("idle_seconds") or 0) < IDLE_SECONDS for _, donor in seen[: states.index("serving")])
    last = seen[-1][1]
    assert "keyboard or mouse" in last["reason"] and last["idle_seconds"] < IDLE_SECONDS
    stepped_aside = [t for t, donor in seen if donor.get("state") in ("draining", "away")]
    assert stepped_aside[-1] - serving_from < 5.0  # the key press was seen within a poll or two
    assert "a donor's agent: nice 19" in agent.log_text()
