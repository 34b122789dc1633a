"""X11's MIT-SCREEN-SAVER extension (``XScreenSaverQueryInfo``): the server's own count of milliseconds since the
last input on that display, through python-xlib (pure Python, no libXss needed)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from agent.donor.idle.base import PolledSource
from agent.errors import IdleSourceError

EXTENSION = "MIT-SCREEN-SAVER"


class X11Source(PolledSource):
    """Idle time of the X display ``display`` (``DISPLAY``, e.g. ``:0``)."""

    name = "x11"

    def __init__(self, display: str | None, wayland: bool = False) -> None:
        super().__init__()
        self.display = display
        self.wayland = wayland
        self._connection: Any = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> X11Source:
        """The display that ``DISPLAY`` names; refused in a Wayland session (``WAYLAND_DISPLAY`` set)."""
        return cls(env.get("DISPLAY") or None, bool(env.get("WAYLAND_DISPLAY")))

    def _read(self) -> float:
        if self.wayland:
            # Xwayland counts only the input that X programs get: typing into a Wayland window would look idle
            raise IdleSourceError(
                "a Wayland session: X11 sees only the input of X programs (Mutter's idle monitor does)"
            )
        if not self.display:
            raise IdleSourceError("DISPLAY is not set (no X11 session here)")
        if self._connection is None:
            self._connection = self._open(self.display)
        from Xlib import error

        try:
            reply = self._connection.screen().root.screensaver_query_info()
        except (error.ConnectionClosedError, error.XError, OSError) as exc:
            raise IdleSourceError(f"the X display {self.display} stopped answering: {exc}") from exc
        return float(reply.idle) / 1000.0

    @staticmethod
    def _open(name: str) -> Any:
        try:
            from Xlib import display, error
        except ImportError as exc:
            raise IdleSourceError("python-xlib is not installed (pip install python-xlib)") from exc
        try:
            connection = display.Display(name)
        except (error.DisplayError, error.ConnectionClosedError, error.XauthError, OSError) as exc:
            raise IdleSourceError(f"cannot open the X display {name}: {exc}") from exc
        if not connection.has_extension(EXTENSION):
            connection.close()
            raise IdleSourceError(f"the X server of {name} lacks the {EXTENSION} extension")
        return connection

    def _close(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            from Xlib import error

            with contextlib.suppress(error.ConnectionClosedError, OSError):  # already broken: nothing to release
                connection.close()
