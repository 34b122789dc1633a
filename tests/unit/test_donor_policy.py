"""The donor policy (issue 43, acceptance 1): hysteresis, each reason to step aside, settings validation, with a
fake clock and fake readings."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from agent.donor.policy import Cause, Decision, DonorSettings, DonorState, Held, Readings, decide, span
from agent.donor.schedule import Window, inside, parse_schedule
from agent.errors import ConfigError

SATURDAY_NOON = dt.datetime(2026, 12, 5, 12, 0)
IDLE = 600.0


def read(now: float, idle: float | None = IDLE, **changes: object) -> Readings:
    base = Readings(
        now=now, idle_seconds=idle, on_battery=False, other_load=0.05, free_memory_mb=8000, local_time=SATURDAY_NOON
    )
    return replace(base, **changes)  # type: ignore[arg-type]


class Run:
    """Feeds readings one after the other, as the daemon's poll does, keeping the previous decision."""

    def __init__(self, settings: DonorSettings | None = None) -> None:
        self.settings = settings or DonorSettings()
        self.decision: Decision | None = None

    def __call__(self, readings: Readings) -> Decision:
        self.decision = decide(readings, self.settings, self.decision)
        return self.decision


def test_an_idle_pc_serves_from_the_start() -> None:
    decision = decide(read(100.0), DonorSettings(), None)
    assert decision.state is DonorState.SERVING
    assert decision.since == 100.0
    assert decision.cause is None
    assert decision.reason == "no keyboard or mouse input for 10 min"


def test_first_input_drains_then_away_and_serving_comes_back_only_after_idle_minutes() -> None:
    run = Run()
    assert run(read(0.0)).state is DonorState.SERVING
    stepping = run(read(1.0, idle=0.4))  # the first key press
    assert stepping.state is DonorState.DRAINING
    assert (stepping.cause, stepping.reason, stepping.since) == (Cause.INPUT, "keyboard or mouse used 0 s ago", 1.0)
    assert run(read(2.0, idle=1.4)).state is DonorState.DRAINING
    away = run(read(3.0, idle=0.1, drained=True))
    assert (away.state, away.since) == (DonorState.AWAY, 3.0)
    # the user leaves at 3.0: still away until 3 minutes without input, whatever happens in between
    assert run(read(150.0, idle=147.0)).state is DonorState.AWAY
    still = run(read(182.9, idle=179.9))
    assert (still.state, still.since, still.reason) == (DonorState.AWAY, 3.0, "keyboard or mouse used 3 min ago")
    back = run(read(183.0, idle=180.0))
    assert (back.state, back.since, back.cause) == (DonorState.SERVING, 183.0, None)
    assert back.reason == "no keyboard or mouse input for 3 min"


def test_draining_ends_after_drain_seconds_even_when_not_drained() -> None:
    run = Run(DonorSettings(drain_seconds=5.0))
    run(read(0.0))
    assert run(read(10.0, idle=0.0)).since == 10.0
    assert run(read(14.9, idle=4.9)).state is DonorState.DRAINING
    assert run(read(15.0, idle=5.0)).state is DonorState.AWAY


def test_a_reason_that_goes_away_while_draining_ends_in_serving_after_the_drain() -> None:
    run = Run(DonorSettings(drain_seconds=5.0))
    run(read(0.0))
    unplugged = run(read(1.0, on_battery=True))
    plugged = run(read(2.0, on_battery=False))
    assert (plugged.state, plugged.cause, plugged.since) == (DonorState.DRAINING, Cause.BATTERY, 1.0)
    assert plugged.reason == unplugged.reason == "on battery (allow_on_battery is off)"
    assert run(read(3.0, drained=True)).state is DonorState.SERVING


def test_input_reported_while_draining_for_another_reason_names_the_current_one() -> None:
    run = Run()
    run(read(0.0))
    run(read(1.0, on_battery=True))
    assert run(read(2.0, on_battery=False, idle=0.5)).reason == "keyboard or mouse used 0 s ago"


def test_on_battery_steps_aside_unless_allowed() -> None:
    decision = decide(read(0.0, on_battery=True), DonorSettings(), None)
    assert (decision.state, decision.cause) == (DonorState.OFF, Cause.BATTERY)
    assert decision.reason == "on battery (allow_on_battery is off)"
    assert decide(read(0.0, on_battery=True), DonorSettings(allow_on_battery=True), None).state is DonorState.SERVING
    assert decide(read(0.0, on_battery=None), DonorSettings(), None).state is DonorState.SERVING  # a desktop


def test_battery_comes_first_then_input() -> None:
    decision = decide(read(0.0, on_battery=True, idle=2.0), DonorSettings(), None)
    assert decision.cause is Cause.BATTERY
    assert decide(read(0.0, idle=2.0), DonorSettings(), None).state is DonorState.AWAY


def test_other_programs_load_must_hold_for_load_seconds_both_ways() -> None:
    run = Run(DonorSettings(max_other_load=0.25, load_seconds=20.0))
    run(read(0.0))
    assert run(read(5.0, other_load=0.63)).state is DonorState.SERVING
    assert run(read(15.0, other_load=0.10)).state is DonorState.SERVING  # a spike that ended: the count restarts
    assert run(read(16.0, other_load=0.63)).state is DonorState.SERVING
    assert run(read(35.9, other_load=0.63)).state is DonorState.SERVING
    stepping = run(read(36.0, other_load=0.63))
    assert (stepping.state, stepping.cause) == (DonorState.DRAINING, Cause.LOAD)
    assert stepping.reason == "other programs use 63 % of the CPUs (over 25 % for 20 s)"
    assert run(read(37.0, other_load=0.63, drained=True)).state is DonorState.OFF
    assert run(read(40.0, other_load=0.05)).state is DonorState.OFF  # under it since 40 s: not yet 20 s
    quiet = run(read(59.9, other_load=0.05))
    assert (quiet.state, quiet.reason) == (DonorState.OFF, "other programs use 5 % of the CPUs (over 25 % for 20 s)")
    assert run(read(60.0, other_load=0.05)).state is DonorState.SERVING


def test_an_unknown_load_never_stops_serving() -> None:
    run = Run(DonorSettings(load_seconds=0.0))
    assert run(read(0.0, other_load=None)).state is DonorState.SERVING
    assert run(read(1.0, other_load=0.9)).state is DonorState.DRAINING


def test_memory_floor_stops_at_once_and_comes_back_only_where_the_stage_fits() -> None:
    run = Run(DonorSettings(keep_free_mb=2000, load_seconds=10.0))
    assert run(read(0.0, free_memory_mb=3000, own_mb=1500)).state is DonorState.SERVING
    stepping = run(read(1.0, free_memory_mb=1800, own_mb=1500))
    assert (stepping.state, stepping.cause) == (DonorState.DRAINING, Cause.MEMORY)
    assert stepping.reason == "1800 MiB free, 2000 MiB kept for the user"
    # the stage's 1500 MiB are released: 3300 free, but loading it again would leave 1800
    off = run(read(2.0, free_memory_mb=3300, own_mb=0, drained=True))
    assert (off.state, off.stage_mb) == (DonorState.OFF, 1500)
    assert off.reason == "3300 MiB free; the stage needs 1500 MiB of it, 2000 MiB kept for the user"
    assert run(read(30.0, free_memory_mb=3300)).state is DonorState.OFF
    # the user closed a program: the stage fits above the floor again, for load_seconds
    assert run(read(31.0, free_memory_mb=3600)).state is DonorState.OFF
    assert run(read(41.0, free_memory_mb=3600)).state is DonorState.SERVING


def test_no_memory_floor_by_default() -> None:
    assert decide(read(0.0, free_memory_mb=10), DonorSettings(), None).state is DonorState.SERVING


def test_outside_the_schedule_is_off_and_inside_serves() -> None:
    settings = DonorSettings(schedule=parse_schedule("schedule", ["mon-fri 18:00-08:00", "sat-sun"]))
    tuesday_afternoon = dt.datetime(2026, 12, 1, 15, 30)
    decision = decide(read(0.0, local_time=tuesday_afternoon), settings, None)
    assert (decision.state, decision.cause) == (DonorState.OFF, Cause.SCHEDULE)
    assert decision.reason == "outside the schedule (mon-fri 18:00-08:00, sat-sun)"
    assert decide(read(0.0, local_time=dt.datetime(2026, 12, 1, 19, 0)), settings, None).state is DonorState.SERVING
    assert decide(read(0.0), settings, None).state is DonorState.SERVING  # Saturday noon
    unknown = decide(read(0.0, local_time=None), settings, None)
    assert unknown.state is DonorState.OFF and "the local time is unknown" in unknown.reason


def test_the_schedule_does_not_override_the_user() -> None:
    settings = DonorSettings(schedule=parse_schedule("schedule", ["sat-sun"]))
    assert decide(read(0.0, idle=3.0), settings, None).state is DonorState.AWAY


def test_no_idle_source_never_donates_by_default() -> None:
    decision = decide(read(0.0, idle=None, idle_problem="x11: DISPLAY is not set"), DonorSettings(), None)
    assert (decision.state, decision.cause) == (DonorState.OFF, Cause.NO_SOURCE)
    assert decision.reason == "no idle source works here (x11: DISPLAY is not set): donating never, as set"


def test_no_idle_source_donates_on_the_schedule_when_so_set() -> None:
    settings = DonorSettings(no_source="schedule", schedule=parse_schedule("schedule", "sat-sun"))
    serving = decide(read(0.0, idle=None, idle_problem="none"), settings, None)
    assert serving.state is DonorState.SERVING
    assert serving.reason == "no idle source works here (none): donating on the schedule only, as set (sat-sun)"
    weekday = decide(read(0.0, idle=None, local_time=dt.datetime(2026, 12, 1, 12, 0)), settings, None)
    assert (weekday.state, weekday.cause) == (DonorState.OFF, Cause.SCHEDULE)


def test_an_idle_source_that_stops_working_while_serving_drains() -> None:
    run = Run()
    run(read(0.0))
    assert run(read(1.0, idle=None)).cause is Cause.NO_SOURCE


def test_held_turns_on_and_off_after_its_own_delays() -> None:
    held = Held()
    held = held.step(True, 0.0, on_after=5.0, off_after=2.0)
    assert held == Held(False, 0.0)
    held = held.step(True, 5.0, 5.0, 2.0)
    assert held == Held(True)
    held = held.step(False, 6.0, 5.0, 2.0).step(False, 7.9, 5.0, 2.0)
    assert held.on
    assert not held.step(False, 8.0, 5.0, 2.0).on
    assert held.step(None, 8.0, 5.0, 2.0) == Held()


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"idle_minutes": 0}, "'idle_minutes' must be a number of minutes above 0, not 0"),
        ({"idle_minutes": "3"}, "'idle_minutes' must be a number of minutes above 0, not '3'"),
        ({"allow_on_battery": "yes"}, "'allow_on_battery' must be true or false"),
        ({"max_other_load": 25}, "'max_other_load' must be a share of the CPUs above 0, at most 1"),
        ({"max_other_load": True}, "'max_other_load' must be a share"),
        ({"load_seconds": -1}, "'load_seconds' must be a number of seconds, 0 or more"),
        ({"keep_free_mb": 1.5}, "'keep_free_mb' must be a whole number of MiB"),
        ({"no_source": "always"}, "'no_source' must be one of never, schedule, not 'always'"),
        ({"no_source": "schedule"}, "'no_source' is 'schedule' but no schedule is set"),
        ({"drain_seconds": 0}, "'drain_seconds' must be a number of seconds above 0"),
        ({"schedule": ["mon-fri 8-17"]}, "donor setting 'schedule': 'mon-fri 8-17' is not a window"),
        ({"schedule": ["moon"]}, "'moon' is not a day or a range of days"),
        ({"schedule": ["mon 08:00-08:00"]}, "starts and ends at the same time"),
        ({"schedule": ["mon 25:00-26:00"]}, "25:00 is not a time of day"),
        ({"schedule": 7}, "donor setting 'schedule' must be a list of windows"),
        ({"idle": 3}, "unknown donor settings: idle"),
    ],
)
def test_settings_are_checked_where_read(table: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        DonorSettings.from_mapping(table)
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)  # one line


def test_settings_from_the_donor_table() -> None:
    settings = DonorSettings.from_mapping(
        {"idle_minutes": 5, "max_other_load": 0.5, "schedule": ["fri-mon 20:00-07:00"], "keep_free_mb": 4096}
    )
    assert settings.idle_minutes == 5
    assert settings.schedule == (Window(frozenset({4, 5, 6, 0}), 20 * 60, 7 * 60),)
    assert DonorSettings.from_mapping({}) == DonorSettings()


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("mon-fri 18:00-08:00", "mon-fri 18:00-08:00"),
        ("sat,sun", "sat-sun"),
        ("22:00-06:00", "22:00-06:00"),
        ("fri-mon", "fri-mon"),
        ("mon,wed,fri 12:00-24:00", "mon,wed,fri 12:00-24:00"),
        ("Tue 09:00-00:00", "tue 09:00-24:00"),
    ],
)
def test_windows_read_and_print_back(text: str, shown: str) -> None:
    assert str(Window.parse(text)) == shown


def test_a_window_past_midnight_belongs_to_the_day_it_starts_on() -> None:
    weeknights = (Window.parse("mon-fri 18:00-08:00"),)
    friday, saturday, sunday, monday = (
        dt.datetime(2026, 12, day, hour, 0) for day, hour in ((4, 23), (5, 7), (6, 23), (7, 7))
    )
    assert inside(weeknights, friday) and inside(weeknights, saturday)
    assert not inside(weeknights, dt.datetime(2026, 12, 5, 8, 0))  # Saturday 08:00: the end is excluded
    assert not inside(weeknights, sunday)  # Sunday evening is not a weeknight
    assert not inside(weeknights, monday)  # nor Monday morning, after Sunday
    assert inside((), monday)  # no schedule: any time


def test_spans_for_people() -> None:
    assert [span(s) for s in (4.4, 89, 180, 3 * 3600 + 300)] == ["4 s", "89 s", "3 min", "3 h 5 min"]
