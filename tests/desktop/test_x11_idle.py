"""The X11 idle source against a real X server (issue 43, acceptance 2): Xvfb has the MIT-SCREEN-SAVER
extension, and xdotool makes real input events (XTEST) that reset its idle count."""

from __future__ import annotations

import time

import pytest

from agent.donor.idle import X11Source, pick_source, platform_candidates
from agent.donor.policy import Decision, DonorSettings, DonorState, decide
from agent.donor.sensing import DonorSensors
from tests.desktop.conftest import need
from tests.support.xvfb import press_key as press

pytestmark = pytest.mark.desktop


def press_key(display: str) -> None:
    need("xdotool", "xdotool")
    press(display)


def test_idle_time_grows_and_a_key_press_resets_it(x_display: str) -> None:
    source = X11Source(x_display)
    assert source.problem() is None
    time.sleep(1.2)
    before = source.seconds_since_input()
    assert before is not None and before >= 1.0
    press_key(x_display)
    after = source.seconds_since_input()
    assert after is not None and after < 0.5
    source.close()


def test_the_policy_serves_once_idle_and_drains_at_the_key_press(x_display: str) -> None:
    source = X11Source(x_display)
    sensors = DonorSensors(source)
    settings = DonorSettings(idle_minutes=1 / 60, max_other_load=1.0)  # back after 1 s without input
    press_key(x_display)
    decision: Decision | None = decide(sensors.read(), settings, None)
    assert decision is not None and decision.state is DonorState.AWAY
    deadline = time.monotonic() + 10
    while decision.state is not DonorState.SERVING and time.monotonic() < deadline:
        time.sleep(0.1)
        decision = decide(sensors.read(), settings, decision)
    assert decision.state is DonorState.SERVING, decision.reason
    press_key(x_display)
    decision = decide(sensors.read(), settings, decision)
    assert (decision.state, decision.cause) == (DonorState.DRAINING, "input")
    assert decision.reason.startswith("keyboard or mouse used 0 s ago")
    source.close()


def test_pick_source_finds_x11_where_only_a_display_is_given(x_display: str) -> None:
    tried: list[object] = []
    picked = pick_source({"DISPLAY": x_display}, platform_candidates("linux"), tried)  # type: ignore[arg-type]
    assert picked is not None and picked.name == "x11"
    assert [s.name for s in tried] == ["gnome", "screensaver", "x11"]  # type: ignore[attr-defined]
    assert isinstance(picked, X11Source)
    picked.close()


def test_a_display_without_a_server_is_a_problem(x_display: str) -> None:
    absent = f":{int(x_display[1:]) + 1000}"
    problem = X11Source(absent).problem() or ""
    assert problem.startswith(f"cannot open the X display {absent}: Can't connect to display"), problem


def test_doctor_names_the_source_it_would_use(x_display: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.cli.doctor_cmd import _idle_source

    monkeypatch.setenv("DISPLAY", x_display)
    for name in ("WAYLAND_DISPLAY", "DBUS_SESSION_BUS_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DBUS_SYSTEM_BUS_ADDRESS", "unix:path=/nonexistent/bus")
    name, seconds, problems = _idle_source()
    assert name == "x11" and seconds is not None and seconds >= 0
    assert problems == (
        "gnome: no session D-Bus here (DBUS_SESSION_BUS_ADDRESS is not set); "
        "screensaver: no session D-Bus here (DBUS_SESSION_BUS_ADDRESS is not set)"
    )
    monkeypatch.delenv("DISPLAY")
    name, seconds, problems = _idle_source()
    assert name is None and seconds is None
    assert "x11: DISPLAY is not set (no X11 session here); logind: cannot reach the system D-Bus" in problems
