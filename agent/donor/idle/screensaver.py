"""``org.freedesktop.ScreenSaver.GetSessionIdleTime`` on the session bus: KDE Plasma, LXQt, Xfce and others (GNOME
answers that it is not supported). The interface was never standardised and its unit differs: KDE answers in
milliseconds (KIdleTime), the others in seconds."""

from __future__ import annotations

from collections.abc import Mapping

from agent.donor.idle.bus import BusSource, session_bus
from agent.errors import IdleSourceError

SERVICE = "org.freedesktop.ScreenSaver"
PATH = "/org/freedesktop/ScreenSaver"


class ScreenSaverSource(BusSource):
    """The screen saver service on the session bus at ``address``; ``milliseconds``: its answers are in ms."""

    name = "screensaver"
    service = SERVICE

    def __init__(self, address: str | None, milliseconds: bool = False) -> None:
        super().__init__(address)
        self.milliseconds = milliseconds

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ScreenSaverSource:
        """The session bus of ``env``; milliseconds under KDE (``XDG_CURRENT_DESKTOP`` names it)."""
        desktops = env.get("XDG_CURRENT_DESKTOP", "").upper().split(":")
        return cls(session_bus(env), milliseconds="KDE" in desktops)

    def _read(self) -> float:
        (idle,) = self.call(PATH, SERVICE, "GetSessionIdleTime")
        if not isinstance(idle, int):
            raise IdleSourceError(f"{SERVICE}.GetSessionIdleTime answered {idle!r}, not a number")
        return idle / 1000.0 if self.milliseconds else float(idle)
