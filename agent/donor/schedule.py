"""When a donor allows serving: weekly windows written as short strings, e.g. ``"mon-fri 18:00-08:00"``.

A window is ``DAYS``, ``HH:MM-HH:MM`` or ``DAYS HH:MM-HH:MM``:

- ``DAYS``: days of the week (``mon tue wed thu fri sat sun``), ranges of them (``mon-fri``, ``fri-mon`` wraps
  past Sunday) and lists of both (``mon,wed,fri-sun``); no days: every day.
- ``HH:MM-HH:MM``: from the first time (included) to the second (excluded); ``24:00`` ends at midnight. A range
  whose end comes before its start runs past midnight and belongs to the day it starts on: ``mon-fri
  18:00-08:00`` covers Friday 18:00 to Saturday 08:00 but not Sunday night. No times: the whole day.

A schedule is a list of windows; a time is inside it when it is inside any of them. Times are the PC's local
wall-clock time, naive (no time zone).
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

from agent.errors import ConfigError

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
"""Day names in ``datetime.weekday()`` order (Monday is 0)."""
MINUTES_A_DAY = 24 * 60
_TIMES = re.compile(r"^(\d{1,2}):(\d{2})-(\d{1,2}):(\d{2})$")
EXAMPLE = "'mon-fri 18:00-08:00', 'sat-sun' or '22:00-06:00'"


@dataclass(frozen=True)
class Window:
    """One weekly window: on ``days``, from minute ``start`` to minute ``end`` of the day (wrapping past
    midnight when ``end <= start``; 0 and 1440 for the whole day)."""

    days: frozenset[int]
    start: int = 0
    end: int = MINUTES_A_DAY

    def __post_init__(self) -> None:
        if not self.days or not self.days <= set(range(7)):
            raise ConfigError(f"a schedule window needs days from 0 (Monday) to 6, not {sorted(self.days)}")
        if not 0 <= self.start < MINUTES_A_DAY or not 0 < self.end <= MINUTES_A_DAY or self.start == self.end:
            raise ConfigError(f"a schedule window's minutes {self.start}-{self.end} are not a span of a day")

    @classmethod
    def parse(cls, text: str) -> Window:
        """``"mon-fri 18:00-08:00"`` -> the window (``ConfigError`` naming the text where it is not one)."""
        words = text.lower().split()
        times = _TIMES.match(words[-1]) if words else None
        if times is not None:
            words.pop()
        if len(words) > 1:
            raise _bad(text, "give the days as one word, e.g. 'mon-fri' or 'sat,sun'")
        days = _days(words[0], text) if words else frozenset(range(7))
        if times is None:
            if not words:
                raise _bad(text, "it names neither days nor times")
            return cls(days)
        start, end = _minute(times[1], times[2], text), _minute(times[3], times[4], text)
        if start == MINUTES_A_DAY:
            raise _bad(text, "a window starts before 24:00")
        end = end or MINUTES_A_DAY  # an end at 00:00 is midnight
        if start == end:
            raise _bad(text, "it starts and ends at the same time (leave the times out for a whole day)")
        return cls(days, start, end)

    def contains(self, when: dt.datetime) -> bool:
        """Whether the local time ``when`` falls inside this window."""
        minute, day = when.hour * 60 + when.minute, when.weekday()
        if self.start < self.end:
            return day in self.days and self.start <= minute < self.end
        # past midnight: the evening of a listed day, or the morning after one
        return (day in self.days and minute >= self.start) or ((day - 1) % 7 in self.days and minute < self.end)

    def __str__(self) -> str:
        days = "" if len(self.days) == 7 else _day_text(self.days)
        if (self.start, self.end) == (0, MINUTES_A_DAY):
            return days or "every day"
        times = f"{_clock(self.start)}-{_clock(self.end)}"
        return f"{days} {times}" if days else times


def parse_schedule(name: str, value: object) -> tuple[Window, ...]:
    """A setting's list of window strings (or one string) -> windows; ``ConfigError`` names the setting."""
    texts = [value] if isinstance(value, str) else value
    if not isinstance(texts, (list, tuple)) or not all(isinstance(t, str) for t in texts):
        raise ConfigError(f"donor setting {name!r} must be a list of windows such as {EXAMPLE}, not {value!r}")
    try:
        return tuple(Window.parse(text) for text in texts)
    except ConfigError as exc:
        raise ConfigError(f"donor setting {name!r}: {exc}") from exc


def inside(schedule: tuple[Window, ...], when: dt.datetime) -> bool:
    """Whether ``when`` falls in any window of ``schedule`` (an empty schedule allows any time)."""
    return not schedule or any(window.contains(when) for window in schedule)


def describe(schedule: tuple[Window, ...]) -> str:
    """The schedule for people, e.g. ``mon-fri 18:00-08:00, sat-sun``."""
    return ", ".join(str(window) for window in schedule) or "any time"


def _days(word: str, text: str) -> frozenset[int]:
    days: set[int] = set()
    for part in word.split(","):
        first, dash, last = part.partition("-")
        if first not in DAYS or (dash and last not in DAYS):
            raise _bad(text, f"{part!r} is not a day or a range of days ({', '.join(DAYS)})")
        begin, stop = DAYS.index(first), DAYS.index(last if dash else first)
        days.update((begin + i) % 7 for i in range((stop - begin) % 7 + 1))
    return frozenset(days)


def _minute(hours: str, minutes: str, text: str) -> int:
    value = int(hours) * 60 + int(minutes)
    if int(minutes) >= 60 or value > MINUTES_A_DAY:
        raise _bad(text, f"{hours}:{minutes} is not a time of day")
    return value


def _bad(text: str, why: str) -> ConfigError:
    return ConfigError(f"{text!r} is not a window like {EXAMPLE}: {why}")


def _clock(minute: int) -> str:
    return f"{minute // 60:02d}:{minute % 60:02d}"


def _day_text(days: frozenset[int]) -> str:
    """Runs of consecutive days as ranges, Monday first: ``mon-fri``, ``sat,sun`` as ``sat-sun``."""
    runs: list[list[int]] = []
    for day in sorted(days):
        if runs and runs[-1][-1] == day - 1:
            runs[-1].append(day)
        else:
            runs.append([day])
    if len(runs) > 1 and runs[0][0] == 0 and runs[-1][-1] == 6:  # a run through Sunday into Monday
        runs[0] = runs.pop() + runs[0]
    return ",".join(DAYS[r[0]] if len(r) == 1 else f"{DAYS[r[0]]}-{DAYS[r[-1]]}" for r in runs)
