"""The donor policy as a pure function: ``decide(readings, settings, previous) -> Decision`` over immutable values.

The daemon reads the PC (``agent.donor.sensing``: the idle source, battery, load, memory) and applies what this
module decides; nothing here does I/O or reads a clock: every reading carries its time. The model is BOINC's
``check_suspend_processing`` (``client/cs_prefs.cpp``): every reason to stop is one named condition
(:class:`Cause`) with its own hysteresis, checked in a fixed order, and the first that holds is the reason
reported.

States::

    serving --a reason to stop--> draining --drained, or drain_seconds--> away (the user is here)
       ^                                                            \\--> off  (not allowed now)
       +------------------ no reason to stop any more ------------------+

The hysteresis is asymmetric, as BOINC's: the first keyboard or mouse input stops serving (the idle time drops
to 0), and serving comes back only once the idle time reaches ``idle_minutes`` again, so a PC whose user comes
and goes is not re-planned every minute. The other programs' CPU load stops serving only after staying above
``max_other_load`` for ``load_seconds``, and lets it come back after as long below. Too little free memory stops
at once and lets serving come back once the stage would fit above the floor again for ``load_seconds``. Battery
and schedule take effect at once both ways: they change rarely and on purpose.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal

from agent.donor.schedule import Window, describe, inside, parse_schedule
from agent.errors import ConfigError

NO_SOURCE_CHOICES = ("never", "schedule")


class DonorState(StrEnum):
    """What a donor PC does now (announced to the fleet by the daemon)."""

    SERVING = "serving"
    """Idle and allowed: it serves its stage or stands by."""
    DRAINING = "draining"
    """Stepping aside: it takes no new sessions and hands its stage over."""
    AWAY = "away"
    """Stepped aside because the user is here (keyboard or mouse input)."""
    OFF = "off"
    """Stepped aside because serving is not allowed now: battery, schedule, no idle source, load, memory."""


class Cause(StrEnum):
    """The named conditions that stop serving, in the order they are checked (the first that holds is reported)."""

    BATTERY = "battery"
    INPUT = "input"
    SCHEDULE = "schedule"
    NO_SOURCE = "no_source"
    MEMORY = "memory"
    LOAD = "load"


@dataclass(frozen=True)
class Readings:
    """What the daemon read of the PC at one moment (None: that reading does not work here)."""

    now: float
    """Monotonic seconds."""
    idle_seconds: float | None
    """Seconds since the last keyboard or mouse input; None: no idle source works here."""
    on_battery: bool | None
    """None: no battery, or unknown (a desktop PC)."""
    other_load: float | None
    """Share of all the CPUs that other processes than this agent use, 0 to 1."""
    free_memory_mb: int | None
    """MiB that programs can still take (with what this agent's stages hold counted as taken)."""
    local_time: dt.datetime | None
    """The PC's local wall-clock time, naive, for the schedule."""
    drained: bool = False
    """The daemon has handed over everything it held (no session left, no stage held): draining may end."""
    idle_problem: str | None = None
    """Why no idle source works here, for the reason reported when ``idle_seconds`` is None."""
    own_mb: int = 0
    """MiB this agent's stages hold now; remembered on stepping aside, so that it comes back only where they fit."""


@dataclass(frozen=True)
class DonorSettings:
    """The ``[donor]`` table of the agent's config file; each value is checked when built (``ConfigError``)."""

    idle_minutes: float = 3.0
    """Serve again after this long without keyboard or mouse input."""
    allow_on_battery: bool = False
    """Serve on a laptop running on its battery."""
    max_other_load: float = 0.25
    """Step aside when other programs use more than this share of the CPUs (0 to 1) ..."""
    load_seconds: float = 20.0
    """... for this long (as BOINC); come back after as long below. Also how long free memory must stay above
    the floor before serving again."""
    keep_free_mb: int = 0
    """MiB of memory kept free for the user's programs: step aside below it (0: no floor)."""
    schedule: tuple[Window, ...] = ()
    """Windows when serving is allowed (``agent.donor.schedule``, e.g. ``["mon-fri 18:00-08:00", "sat-sun"]``);
    empty: any time."""
    no_source: Literal["never", "schedule"] = "never"
    """Where no idle source works: ``never`` donate, or donate on the ``schedule`` only (which must then be set)."""
    drain_seconds: float = 5.0
    """Draining lasts at most this long before the PC counts as away or off."""

    def __post_init__(self) -> None:
        _number("idle_minutes", self.idle_minutes, "a number of minutes above 0", low=0.0, low_included=False)
        _flag("allow_on_battery", self.allow_on_battery)
        _number(
            "max_other_load",
            self.max_other_load,
            "a share of the CPUs above 0, at most 1 (0.25 is 25 %)",
            low=0.0,
            low_included=False,
            high=1.0,
        )
        _number("load_seconds", self.load_seconds, "a number of seconds, 0 or more", low=0.0)
        if isinstance(self.keep_free_mb, bool) or not isinstance(self.keep_free_mb, int) or self.keep_free_mb < 0:
            raise ConfigError(
                f"donor setting 'keep_free_mb' must be a whole number of MiB, 0 or more, not {self.keep_free_mb!r}"
            )
        if not isinstance(self.schedule, tuple) or not all(isinstance(w, Window) for w in self.schedule):
            raise ConfigError(f"donor setting 'schedule' must be windows (agent.donor.schedule), not {self.schedule!r}")
        if self.no_source not in NO_SOURCE_CHOICES:
            raise ConfigError(
                f"donor setting 'no_source' must be one of {', '.join(NO_SOURCE_CHOICES)}, not {self.no_source!r}"
            )
        if self.no_source == "schedule" and not self.schedule:
            raise ConfigError(
                "donor setting 'no_source' is 'schedule' but no schedule is set: give 'schedule' "
                '(e.g. ["mon-fri 18:00-08:00", "sat-sun"]) or set no_source = \'never\''
            )
        _number("drain_seconds", self.drain_seconds, "a number of seconds above 0", low=0.0, low_included=False)

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any]) -> DonorSettings:
        """The ``[donor]`` table of agent.toml -> settings; unknown keys and bad values raise ``ConfigError``
        naming the setting. Keys: the fields of this class; ``schedule`` is a list of window strings."""
        unknown = set(table) - set(cls.__dataclass_fields__)
        if unknown:
            raise ConfigError(
                f"unknown donor settings: {', '.join(sorted(unknown))} (known: {', '.join(cls.__dataclass_fields__)})"
            )
        values = dict(table)
        if "schedule" in values:
            values["schedule"] = parse_schedule("schedule", values["schedule"])
        return cls(**values)


def _number(
    name: str, value: object, what: str, *, low: float, low_included: bool = True, high: float | None = None
) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or value < low
        or (value == low and not low_included)
        or (high is not None and value > high)
    ):
        raise ConfigError(f"donor setting {name!r} must be {what}, not {value!r}")


def _flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"donor setting {name!r} must be true or false, not {value!r}")


@dataclass(frozen=True)
class Held:
    """A condition that takes effect only once observed for a while, and ends only once unobserved for a while."""

    on: bool = False
    turning_since: float | None = None
    """Since when the observations disagree with ``on`` without a break (None: they agree)."""

    def step(self, observed: bool | None, now: float, on_after: float, off_after: float) -> Held:
        """The condition after one more observation at ``now`` (None: unknown, which ends it at once)."""
        if observed is None:
            return Held()
        if observed == self.on:
            return Held(self.on)
        since = now if self.turning_since is None else self.turning_since
        if now - since >= (on_after if observed else off_after):
            return Held(observed)
        return Held(self.on, since)


@dataclass(frozen=True)
class Decision:
    """What the donor does now, why, and what the next decision must remember."""

    state: DonorState
    reason: str
    """For people: "keyboard or mouse used 4 s ago", "on battery", ..."""
    since: float
    """When this state began (monotonic seconds)."""
    cause: Cause | None = None
    """The condition behind a stop (None while serving)."""
    load: Held = field(default_factory=Held)
    """The other programs' load condition, with its hysteresis."""
    memory: Held = field(default_factory=Held)
    """The free-memory condition, with its hysteresis."""
    stage_mb: int = 0
    """MiB the stages held when last held: serving comes back only where they fit above ``keep_free_mb``."""


@dataclass(frozen=True)
class _Stop:
    cause: Cause
    state: DonorState
    reason: str


def decide(readings: Readings, settings: DonorSettings, previous: Decision | None) -> Decision:
    """The donor's state after ``readings``, given the ``previous`` decision (None at start: nothing to drain)."""
    r, s = readings, settings
    load = (previous.load if previous else Held()).step(
        None if r.other_load is None else r.other_load > s.max_other_load, r.now, s.load_seconds, s.load_seconds
    )
    stage_mb = r.own_mb if r.own_mb > 0 else (previous.stage_mb if previous else 0)
    # the free memory once the stage is loaded again: what is free now less what the stage would take back
    free_then = None if r.free_memory_mb is None else r.free_memory_mb - (stage_mb - r.own_mb)
    memory = (previous.memory if previous else Held()).step(
        None if free_then is None or s.keep_free_mb == 0 else free_then < s.keep_free_mb, r.now, 0.0, s.load_seconds
    )
    stop = _first_stop(r, s, load, memory, stage_mb)
    target = DonorState.SERVING if stop is None else stop.state
    was = previous.state if previous else None
    if was is DonorState.SERVING and target is not DonorState.SERVING:
        state = DonorState.DRAINING
    elif was is DonorState.DRAINING and previous is not None:
        drained = r.drained or r.now - previous.since >= s.drain_seconds
        state = target if drained else DonorState.DRAINING
    else:
        state = target
    since = previous.since if previous is not None and previous.state is state else r.now
    cause: Cause | None
    if stop is not None:
        cause, reason = stop.cause, stop.reason
    elif state is DonorState.DRAINING and previous is not None:  # the reason went away while draining: say why it began
        cause, reason = previous.cause, previous.reason
    else:
        cause, reason = None, _serving_reason(r, s)
    return Decision(state, reason, since, cause, load, memory, stage_mb)


def _first_stop(r: Readings, s: DonorSettings, load: Held, memory: Held, stage_mb: int) -> _Stop | None:
    if r.on_battery and not s.allow_on_battery:
        return _Stop(Cause.BATTERY, DonorState.OFF, "on battery (allow_on_battery is off)")
    if r.idle_seconds is not None and r.idle_seconds < s.idle_minutes * 60:
        return _Stop(Cause.INPUT, DonorState.AWAY, f"keyboard or mouse used {span(r.idle_seconds)} ago")
    if s.schedule and (r.local_time is None or not inside(s.schedule, r.local_time)):
        unknown = "; the local time is unknown" if r.local_time is None else ""
        return _Stop(Cause.SCHEDULE, DonorState.OFF, f"outside the schedule ({describe(s.schedule)}{unknown})")
    if r.idle_seconds is None and s.no_source == "never":
        return _Stop(Cause.NO_SOURCE, DonorState.OFF, f"{_no_source(r)}: donating never, as set")
    if memory.on:
        needs = f"; the stage needs {stage_mb} MiB of it" if stage_mb > r.own_mb else ""
        return _Stop(
            Cause.MEMORY, DonorState.OFF, f"{r.free_memory_mb} MiB free{needs}, {s.keep_free_mb} MiB kept for the user"
        )
    if load.on:
        limit = f"over {s.max_other_load * 100:.0f} % for {span(s.load_seconds)}"
        share = "an unknown share" if r.other_load is None else f"{r.other_load * 100:.0f} %"
        return _Stop(Cause.LOAD, DonorState.OFF, f"other programs use {share} of the CPUs ({limit})")
    return None


def _serving_reason(r: Readings, s: DonorSettings) -> str:
    if r.idle_seconds is None:
        return f"{_no_source(r)}: donating on the schedule only, as set ({describe(s.schedule)})"
    return f"no keyboard or mouse input for {span(r.idle_seconds)}"


def _no_source(r: Readings) -> str:
    return f"no idle source works here ({r.idle_problem or 'none found'})"


def span(seconds: float) -> str:
    """A duration for people: ``4 s``, ``3 min``, ``2 h 5 min``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 90 else f"{minutes // 60} h {minutes % 60} min"
