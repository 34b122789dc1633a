"""macOS' ``CGEventSourceSecondsSinceLastEventType(kCGEventSourceStateCombinedSessionState, kCGAnyInputEventType)``
(CoreGraphics) through pyobjc-framework-Quartz (``pip install 'shoal[macos]'``): seconds since the last input of
the login session, keyboard, mouse or trackpad."""

from __future__ import annotations

from typing import Any

from agent.donor.idle.base import PolledSource
from agent.errors import IdleSourceError

COMBINED_SESSION_STATE = 0
"""``kCGEventSourceStateCombinedSessionState`` (CGEventSource.h's CGEventSourceStateID, an int32_t)."""
ANY_INPUT_EVENT = 0xFFFFFFFF
"""``kCGAnyInputEventType = ((CGEventType)(~0))`` (CGEventTypes.h; CGEventType is a uint32_t)."""
FUNCTION = "CGEventSourceSecondsSinceLastEventType"


class MacSource(PolledSource):
    """CoreGraphics' idle time; ``quartz``: the pyobjc ``Quartz`` module (None: imported when first read)."""

    name = "macos"

    def __init__(self, quartz: Any = None) -> None:
        super().__init__()
        self._quartz = quartz

    def _read(self) -> float:
        if self._quartz is None:
            try:
                import Quartz  # type: ignore[import-not-found,unused-ignore]
            except ImportError as exc:
                raise IdleSourceError("pyobjc-framework-Quartz is not installed: pip install 'shoal[macos]'") from exc
            self._quartz = Quartz
        function = getattr(self._quartz, FUNCTION, None)
        if function is None:
            raise IdleSourceError(f"this Quartz has no {FUNCTION}")
        seconds = function(COMBINED_SESSION_STATE, ANY_INPUT_EVENT)
        if not isinstance(seconds, (int, float)) or seconds != seconds:  # NaN, or not a number at all
            raise IdleSourceError(f"{FUNCTION} answered {seconds!r}")
        return float(seconds)
