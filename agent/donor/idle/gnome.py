"""GNOME's idle monitor (``org.gnome.Mutter.IdleMonitor.GetIdletime``): Mutter's milliseconds since the last input
of the whole session, X11 or Wayland alike. The most trusted source on Linux."""

from __future__ import annotations

from collections.abc import Mapping

from agent.donor.idle.bus import BusSource, session_bus
from agent.errors import IdleSourceError

SERVICE = "org.gnome.Mutter.IdleMonitor"
PATH = "/org/gnome/Mutter/IdleMonitor/Core"


class MutterSource(BusSource):
    """Mutter's idle monitor on the session bus at ``address``."""

    name = "gnome"
    service = SERVICE

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MutterSource:
        return cls(session_bus(env))

    def _read(self) -> float:
        (milliseconds,) = self.call(PATH, SERVICE, "GetIdletime")
        if not isinstance(milliseconds, int):
            raise IdleSourceError(f"{SERVICE}.GetIdletime answered {milliseconds!r}, not a number of milliseconds")
        return milliseconds / 1000.0
