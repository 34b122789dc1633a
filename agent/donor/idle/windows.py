"""Windows' ``GetLastInputInfo`` (user32) through ctypes: the tick count of the last input of the session this
process runs in. A service in session 0 sees no user's input: the agent must run in the user's session (started
at logon), which ``problem()`` says where it is not."""

from __future__ import annotations

import ctypes
from typing import Any

from agent.donor.idle.base import PolledSource
from agent.errors import IdleSourceError

# Windows' own widths (LLP64), not ctypes.wintypes': there DWORD is c_ulong, 8 bytes on 64-bit Linux and macOS,
# which would give the struct another layout wherever these lines are tested
UINT = ctypes.c_uint32
DWORD = ctypes.c_uint32
BOOL = ctypes.c_int32
TICK_WRAP = 1 << 32
"""GetTickCount counts milliseconds in a DWORD: it wraps to 0 after 49.7 days of uptime."""


class LASTINPUTINFO(ctypes.Structure):
    """``LASTINPUTINFO`` (winuser.h): ``cbSize`` must be the struct's size, ``dwTime`` is a GetTickCount value."""

    _fields_ = (("cbSize", UINT), ("dwTime", DWORD))


def bind(user32: Any, kernel32: Any) -> None:
    """Declare the prototypes of the three calls on the loaded libraries (ctypes guesses wrong otherwise)."""
    user32.GetLastInputInfo.argtypes = [ctypes.POINTER(LASTINPUTINFO)]
    user32.GetLastInputInfo.restype = BOOL
    kernel32.GetTickCount.argtypes = []
    kernel32.GetTickCount.restype = DWORD
    kernel32.ProcessIdToSessionId.argtypes = [DWORD, ctypes.POINTER(DWORD)]
    kernel32.ProcessIdToSessionId.restype = BOOL
    kernel32.GetCurrentProcessId.argtypes = []
    kernel32.GetCurrentProcessId.restype = DWORD


def ticks_since(last: int, now: int) -> int:
    """Milliseconds from tick ``last`` to tick ``now``, across GetTickCount's wrap at 2**32."""
    return (now - last) % TICK_WRAP


class WindowsSource(PolledSource):
    """``GetLastInputInfo`` of ``user32`` and ``GetTickCount`` of ``kernel32`` (None: the system's, loaded when
    first read; tests pass their own)."""

    name = "windows"

    def __init__(self, user32: Any = None, kernel32: Any = None) -> None:
        super().__init__()
        self._libraries = None if user32 is None else (user32, kernel32)

    def _load(self) -> tuple[Any, Any]:
        if self._libraries is None:
            loader = getattr(ctypes, "WinDLL", None)
            if loader is None:
                raise IdleSourceError("not Windows")
            try:
                libraries = loader("user32", use_last_error=True), loader("kernel32", use_last_error=True)
            except OSError as exc:
                raise IdleSourceError(f"cannot load user32 or kernel32: {exc}") from exc
            bind(*libraries)
            self._libraries = libraries
            self._check_session(*libraries)
        return self._libraries

    @staticmethod
    def _check_session(user32: Any, kernel32: Any) -> None:
        session = DWORD(0)
        if kernel32.ProcessIdToSessionId(kernel32.GetCurrentProcessId(), ctypes.pointer(session)) and not session.value:
            raise IdleSourceError(
                "the agent runs in session 0 (a service), which sees no user's input: start it in the user's "
                "session, at logon"
            )

    def _read(self) -> float:
        user32, kernel32 = self._load()
        info = LASTINPUTINFO(ctypes.sizeof(LASTINPUTINFO), 0)
        if not user32.GetLastInputInfo(ctypes.pointer(info)):
            error = getattr(ctypes, "get_last_error", lambda: 0)()  # Windows only
            raise IdleSourceError(f"GetLastInputInfo failed (error {error})")
        return ticks_since(info.dwTime, kernel32.GetTickCount()) / 1000.0
