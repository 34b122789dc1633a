"""systemd-logind's ``IdleHint`` and ``IdleSinceHintMonotonic`` of this user's session, on the system bus. Trusted
last: most desktops never set the hint (systemd #1295, #34844), and a session whose hint was never set is
reported as not working rather than as a user forever at the keyboard."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from agent.donor.idle.bus import BusSource, system_bus
from agent.errors import IdleSourceError

SERVICE = "org.freedesktop.login1"
SESSION = "/org/freedesktop/login1/session/auto"
"""logind's name for the caller's session, or the user's display session where the caller has none."""
INTERFACE = "org.freedesktop.login1.Session"
PROPERTIES = "org.freedesktop.DBus.Properties"


class LogindSource(BusSource):
    """logind on the system bus at ``address``; ``clock``: CLOCK_MONOTONIC in seconds (``time.monotonic`` on
    Linux), the clock of ``IdleSinceHintMonotonic``."""

    name = "logind"
    bus_name = "system"
    service = SERVICE

    def __init__(self, address: str | None, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(address)
        self.clock = clock

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LogindSource:
        return cls(system_bus(env))

    def _read(self) -> float:
        (properties,) = self.call(SESSION, PROPERTIES, "GetAll", "s", (INTERFACE,))
        try:
            idle = properties["IdleHint"][1]
            since_us = properties["IdleSinceHintMonotonic"][1]
        except (KeyError, IndexError, TypeError) as exc:
            raise IdleSourceError(f"logind's session has no idle hint: {properties!r}") from exc
        if not idle and since_us == 0:
            raise IdleSourceError("the desktop never set logind's IdleHint for this session")
        if not idle:
            return 0.0  # the session is in use now
        return self.clock() - since_us / 1e6
