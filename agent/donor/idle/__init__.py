"""Idle sources: seconds since the last keyboard or mouse input, each desktop its own way, behind one protocol.

Never CPU load: a user reading a page uses no CPU and is here all the same (what BOINC and Folding@home learned).
The agent picks the first source that works here, in order of trust:

- Linux: GNOME's Mutter idle monitor and ``org.freedesktop.ScreenSaver`` on the session D-Bus (X11 or Wayland),
  then X11's MIT-SCREEN-SAVER extension (``DISPLAY``; not in a Wayland session, where it sees only X programs),
  then systemd-logind's idle hint (most desktops never set it);
- Windows: ``GetLastInputInfo`` (in the user's session only);
- macOS: CoreGraphics' ``CGEventSourceSecondsSinceLastEventType``.

Where none works, the donor settings' ``no_source`` decides (never donate, or on the schedule only).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from agent.donor.idle.gnome import MutterSource
from agent.donor.idle.logind import LogindSource
from agent.donor.idle.macos import MacSource
from agent.donor.idle.screensaver import ScreenSaverSource
from agent.donor.idle.windows import WindowsSource
from agent.donor.idle.x11 import X11Source

__all__ = [
    "IdleSource",
    "LogindSource",
    "MacSource",
    "MutterSource",
    "ScreenSaverSource",
    "WindowsSource",
    "X11Source",
    "describe_problems",
    "pick_source",
    "platform_candidates",
]

log = logging.getLogger(__name__)


class IdleSource(Protocol):
    """Where the seconds since the last keyboard or mouse input come from."""

    name: str

    def seconds_since_input(self) -> float | None:
        """Seconds since the last input; None when the source does not work (now)."""
        ...

    def problem(self) -> str | None:
        """Why the source does not work here, for people; None when it works."""
        ...


Candidate = Callable[[Mapping[str, str]], IdleSource]
"""Builds a source from the environment (``DISPLAY``, ``DBUS_SESSION_BUS_ADDRESS``, ...)."""


def platform_candidates(platform: str = sys.platform) -> tuple[Candidate, ...]:
    """The sources for ``platform`` (``sys.platform``), most trusted first."""
    if platform == "win32":
        return (lambda env: WindowsSource(),)
    if platform == "darwin":
        return (lambda env: MacSource(),)
    return (MutterSource.from_env, ScreenSaverSource.from_env, X11Source.from_env, LogindSource.from_env)


def pick_source(
    env: Mapping[str, str], candidates: Sequence[Candidate] | None = None, tried: list[IdleSource] | None = None
) -> IdleSource | None:
    """The first of ``candidates`` (default: this platform's) that works with ``env``, or None; every source
    tried is appended to ``tried``, for saying why none works (:func:`describe_problems`)."""
    for make in platform_candidates() if candidates is None else candidates:
        source = make(env)
        if tried is not None:
            tried.append(source)
        if source.problem() is None:
            log.info("idle source: %s", source.name)
            return source
    return None


def describe_problems(sources: Sequence[IdleSource]) -> str:
    """Why each source does not work, on one line: ``gnome: no org.gnome.Mutter.IdleMonitor ...; x11: ...``."""
    return "; ".join(f"{source.name}: {source.problem()}" for source in sources) or "no source for this system"
