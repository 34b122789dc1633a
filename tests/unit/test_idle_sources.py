"""The idle sources with the OS call injected (issue 43, acceptance 2 for Windows and macOS), the pick of a source,
and the host readings (battery, other programs' load, free memory) with psutil faked."""

from __future__ import annotations

import ctypes
import datetime as dt
from collections import namedtuple
from types import SimpleNamespace
from typing import Any

import pytest

from agent.donor.idle import MutterSource, X11Source, describe_problems, pick_source, platform_candidates
from agent.donor.idle.base import PolledSource
from agent.donor.idle.macos import ANY_INPUT_EVENT, COMBINED_SESSION_STATE, MacSource
from agent.donor.idle.screensaver import ScreenSaverSource
from agent.donor.idle.windows import BOOL, DWORD, LASTINPUTINFO, WindowsSource, bind, ticks_since
from agent.donor.sensing import DonorSensors, HostSampler
from agent.errors import IdleSourceError


def test_lastinputinfo_has_windows_layout() -> None:
    # winuser.h: typedef struct tagLASTINPUTINFO { UINT cbSize; DWORD dwTime; } — two 32-bit fields, 8 bytes
    assert ctypes.sizeof(LASTINPUTINFO) == 8
    assert (LASTINPUTINFO.cbSize.offset, LASTINPUTINFO.cbSize.size) == (0, 4)
    assert (LASTINPUTINFO.dwTime.offset, LASTINPUTINFO.dwTime.size) == (4, 4)
    assert ctypes.sizeof(DWORD) == 4 and ctypes.sizeof(BOOL) == 4
    assert DWORD(-1).value == 0xFFFFFFFF  # unsigned


def test_bind_declares_the_prototypes() -> None:
    user32, kernel32 = _libraries(last_input=0, tick=0)
    bind(user32, kernel32)
    assert user32.GetLastInputInfo.argtypes == [ctypes.POINTER(LASTINPUTINFO)]
    assert user32.GetLastInputInfo.restype is BOOL
    assert kernel32.GetTickCount.argtypes == [] and kernel32.GetTickCount.restype is DWORD


@pytest.mark.parametrize(
    ("last", "now", "idle"),
    [
        (1_000, 5_500, 4.5),
        (0xFFFF_FC18, 2_000, 3.0),  # 1 s before GetTickCount wraps at 49.7 days, read 2 s after it
        (7, 7, 0.0),
    ],
)
def test_windows_idle_from_ticks_through_ctypes_prototypes(last: int, now: int, idle: float) -> None:
    user32, kernel32 = _libraries(last_input=last, tick=now)
    bind(user32, kernel32)  # what the source does with the real DLLs
    source = WindowsSource(user32, kernel32)
    assert source.seconds_since_input() == pytest.approx(idle)
    assert source.problem() is None
    assert user32.sizes == [ctypes.sizeof(LASTINPUTINFO)] * 2  # cbSize set before each call, as Windows requires


def test_ticks_wrap() -> None:
    assert ticks_since(0xFFFFFFFF, 0) == 1
    assert ticks_since(10, 4) == 2**32 - 6


def test_windows_call_that_fails_is_a_problem() -> None:
    user32, kernel32 = _libraries(last_input=0, tick=0, ok=False)
    bind(user32, kernel32)
    source = WindowsSource(user32, kernel32)
    assert source.seconds_since_input() is None
    assert (source.problem() or "").startswith("GetLastInputInfo failed")


def test_windows_source_elsewhere_says_so() -> None:
    if hasattr(ctypes, "WinDLL"):
        pytest.skip("on Windows the real DLLs load")
    assert WindowsSource().problem() == "not Windows"


def _libraries(last_input: int, tick: int, ok: bool = True) -> tuple[Any, Any]:
    """user32 and kernel32 stand-ins whose functions are real ctypes function pointers (so that argtypes and
    restype convert the arguments as they would on Windows) calling Python."""
    sizes: list[int] = []

    @ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.POINTER(LASTINPUTINFO))
    def get_last_input_info(info: Any) -> int:
        sizes.append(info.contents.cbSize)
        info.contents.dwTime = last_input
        return int(ok)

    @ctypes.CFUNCTYPE(ctypes.c_uint32)
    def get_tick_count() -> int:
        return tick

    user32 = SimpleNamespace(GetLastInputInfo=get_last_input_info, sizes=sizes)
    kernel32 = SimpleNamespace(
        GetTickCount=get_tick_count,
        ProcessIdToSessionId=ctypes.CFUNCTYPE(ctypes.c_int32)(lambda: 1),
        GetCurrentProcessId=ctypes.CFUNCTYPE(ctypes.c_uint32)(lambda: 1),
    )
    return user32, kernel32


def test_macos_asks_coregraphics_with_apples_constants() -> None:
    # CGEventSource.h: kCGEventSourceStateCombinedSessionState = 0; CGEventTypes.h: kCGAnyInputEventType = ~0
    # as a CGEventType (uint32_t)
    assert COMBINED_SESSION_STATE == 0
    assert ctypes.c_uint32(~0).value == ANY_INPUT_EVENT == 4294967295
    calls: list[tuple[object, ...]] = []

    def seconds_since(*args: object) -> float:
        calls.append(args)
        return 12.5

    source = MacSource(SimpleNamespace(CGEventSourceSecondsSinceLastEventType=seconds_since))
    assert source.seconds_since_input() == 12.5
    assert calls == [(0, 4294967295)]


def test_macos_problems() -> None:
    assert MacSource(SimpleNamespace()).problem() == "this Quartz has no CGEventSourceSecondsSinceLastEventType"
    nan = MacSource(SimpleNamespace(CGEventSourceSecondsSinceLastEventType=lambda state, kind: float("nan")))
    assert (nan.problem() or "").endswith("answered nan")
    try:
        import Quartz  # type: ignore[import-not-found,unused-ignore]  # noqa: F401
    except ImportError:
        assert MacSource().problem() == "pyobjc-framework-Quartz is not installed: pip install 'shoal[macos]'"


class Fake(PolledSource):
    def __init__(self, name: str, problem: str | None, seconds: float = 42.0) -> None:
        super().__init__()
        self.name, self.why, self.seconds = name, problem, seconds

    def _read(self) -> float:
        if self.why:
            raise IdleSourceError(self.why)
        return self.seconds


def test_pick_source_takes_the_first_that_works_in_order() -> None:
    tried: list[Any] = []
    made = [
        lambda env: Fake("gnome", "no org.gnome.Mutter.IdleMonitor on the session D-Bus"),
        lambda env: Fake("x11", None if env.get("DISPLAY") else "DISPLAY is not set"),
        lambda env: Fake("logind", None),
    ]
    picked = pick_source({"DISPLAY": ":5"}, made, tried)
    assert picked is not None and picked.name == "x11"
    assert [s.name for s in tried] == ["gnome", "x11"]  # logind is never asked
    tried.clear()
    assert pick_source({}, made[:2], tried) is None
    assert describe_problems(tried) == (
        "gnome: no org.gnome.Mutter.IdleMonitor on the session D-Bus; x11: DISPLAY is not set"
    )


def test_platform_candidates_in_order_of_trust() -> None:
    env = {"DISPLAY": ":0", "DBUS_SESSION_BUS_ADDRESS": "unix:path=/nonexistent"}
    assert [make(env).name for make in platform_candidates("linux")] == ["gnome", "screensaver", "x11", "logind"]
    assert [make(env).name for make in platform_candidates("win32")] == ["windows"]
    assert [make(env).name for make in platform_candidates("darwin")] == ["macos"]


def test_sources_say_what_is_missing_in_their_environment() -> None:
    assert MutterSource.from_env({}).problem() == "no session D-Bus here (DBUS_SESSION_BUS_ADDRESS is not set)"
    assert X11Source.from_env({}).problem() == "DISPLAY is not set (no X11 session here)"
    wayland = X11Source.from_env({"DISPLAY": ":0", "WAYLAND_DISPLAY": "wayland-0"}).problem()
    assert (wayland or "").startswith("a Wayland session")
    assert ScreenSaverSource.from_env({"XDG_CURRENT_DESKTOP": "KDE"}).milliseconds
    assert not ScreenSaverSource.from_env({"XDG_CURRENT_DESKTOP": "LXQt"}).milliseconds


def test_a_source_that_recovers_works_again() -> None:
    source = Fake("x11", "the X display :5 stopped answering")
    assert source.seconds_since_input() is None
    source.why = None
    assert source.seconds_since_input() == 42.0 and source.problem() is None


Times = namedtuple("Times", "user nice system idle iowait irq softirq steal guest guest_nice")
Own = namedtuple("Own", "user system children_user children_system")


class FakePsutil:
    def __init__(self) -> None:
        self.times = Times(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        self.own = Own(0.0, 0.0, 0.0, 0.0)
        self.battery: Any = None

    def Process(self) -> Any:
        return SimpleNamespace(cpu_times=lambda: self.own)

    def cpu_times(self) -> Times:
        return self.times

    def sensors_battery(self) -> Any:
        return self.battery

    def virtual_memory(self) -> Any:
        return SimpleNamespace(available=3 * 1024**3 + 5)


def test_other_programs_load_is_the_total_less_this_process() -> None:
    system = FakePsutil()
    host = HostSampler(system)
    assert host.other_load() is None  # nothing to compare with yet
    # 2 CPUs for 10 s: 20 CPU-seconds, 14 busy (1 of them guest time, already inside user), 9 of them ours
    system.times = Times(12.0, 0.0, 2.0, 5.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0)
    system.own = Own(8.0, 1.0, 0.0, 0.0)
    assert host.other_load() == pytest.approx(5 / 20)


def test_battery_and_memory_readings() -> None:
    system = FakePsutil()
    host = HostSampler(system)
    assert host.on_battery() is None  # a desktop
    system.battery = SimpleNamespace(power_plugged=False)
    assert host.on_battery() is True
    system.battery = SimpleNamespace(power_plugged=None)
    assert host.on_battery() is None
    assert host.free_memory_mb() == 3072


def test_sensors_read_everything_with_the_clocks_given() -> None:
    wall = dt.datetime(2026, 12, 5, 12, 0)
    source = Fake("x11", "the X display :5 stopped answering")
    sensors = DonorSensors(source, host=HostSampler(FakePsutil()), clock=lambda: 7.0, wall=lambda: wall)
    readings = sensors.read(drained=True, own_mb=900)
    assert (readings.now, readings.local_time, readings.idle_seconds) == (7.0, wall, None)
    assert readings.idle_problem == "x11: the X display :5 stopped answering"
    assert (readings.drained, readings.own_mb, readings.free_memory_mb) == (True, 900, 3072)
    none = DonorSensors(None, "gnome: no session D-Bus here", host=HostSampler(FakePsutil())).read()
    assert none.idle_problem == "gnome: no session D-Bus here" and none.idle_seconds is None


@pytest.mark.parametrize(("session", "refused"), [(0, True), (1, False)])
def test_windows_session_zero_sees_no_input(session: int, refused: bool) -> None:
    @ctypes.CFUNCTYPE(ctypes.c_int32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32))
    def process_session(pid: int, out: Any) -> int:
        out.contents.value = session
        return 1

    kernel32 = SimpleNamespace(ProcessIdToSessionId=process_session, GetCurrentProcessId=lambda: 4242)
    if refused:
        with pytest.raises(IdleSourceError, match="runs in session 0"):
            WindowsSource._check_session(None, kernel32)
    else:
        WindowsSource._check_session(None, kernel32)
