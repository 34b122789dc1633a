"""Reads the PC for the donor policy: the idle source, the battery, the other programs' CPU load and the free
memory, into one :class:`~agent.donor.policy.Readings` at a time. The daemon calls :meth:`DonorSensors.read` on
its poll (from a worker thread: a D-Bus or X11 call blocks for up to a second when a service hangs)."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psutil

from agent.donor.idle import IdleSource
from agent.donor.policy import Readings


@dataclass(frozen=True)
class CpuSample:
    """Cumulative CPU seconds: of all CPUs together, the busy part of them, and this process's own."""

    total: float
    busy: float
    own: float


class HostSampler:
    """Battery, other programs' load and free memory through psutil (``system``: the psutil module, or a fake)."""

    def __init__(self, system: Any = psutil, process: Any = None) -> None:
        self.system = system
        self.process = process if process is not None else system.Process()
        self._last: CpuSample | None = None

    def on_battery(self) -> bool | None:
        """True on battery, False on mains; None without a battery (or where psutil cannot tell)."""
        sensor = getattr(self.system, "sensors_battery", None)
        try:
            battery = sensor() if sensor is not None else None
        except (OSError, RuntimeError):  # psutil reads /sys or an OS call that can fail
            return None
        if battery is None or battery.power_plugged is None:
            return None
        return not battery.power_plugged

    def other_load(self) -> float | None:
        """Share of all CPUs (0-1) that other processes used since the last call; None on the first call."""
        sample = self.sample()
        last, self._last = self._last, sample
        if last is None or sample.total <= last.total:
            return None
        others = (sample.busy - last.busy) - (sample.own - last.own)
        return min(1.0, max(0.0, others / (sample.total - last.total)))

    def sample(self) -> CpuSample:
        """The cumulative CPU times now. Busy is everything but idle and I/O wait; guest time is already counted
        in user time on Linux, so it is left out of the total (as psutil's own ``cpu_percent``)."""
        times = self.system.cpu_times()
        fields = times._asdict()
        total = sum(fields.values()) - fields.get("guest", 0.0) - fields.get("guest_nice", 0.0)
        busy = total - fields.get("idle", 0.0) - fields.get("iowait", 0.0)
        own = self.process.cpu_times()
        mine = own.user + own.system + getattr(own, "children_user", 0.0) + getattr(own, "children_system", 0.0)
        return CpuSample(total, busy, mine)

    def free_memory_mb(self) -> int:
        """MiB that programs can still take without swapping (psutil's ``available``)."""
        return int(self.system.virtual_memory().available) >> 20


class DonorSensors:
    """The readings of one PC: its idle ``source`` (None: none works here, ``problem`` says why), the ``host``'s
    battery, load and memory, and the clocks (injectable for tests)."""

    def __init__(
        self,
        source: IdleSource | None,
        problem: str | None = None,
        host: HostSampler | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], dt.datetime] = dt.datetime.now,
    ) -> None:
        self.source = source
        self.problem = problem
        self.host = host if host is not None else HostSampler()
        self.clock = clock
        self.wall = wall

    def read(self, drained: bool = False, own_mb: int = 0) -> Readings:
        """Everything the policy needs now; ``drained`` and ``own_mb`` come from the daemon (see ``Readings``)."""
        idle = self.source.seconds_since_input() if self.source is not None else None
        problem = self.problem
        if idle is None and self.source is not None:
            problem = f"{self.source.name}: {self.source.problem()}"
        return Readings(
            now=self.clock(),
            idle_seconds=idle,
            on_battery=self.host.on_battery(),
            other_load=self.host.other_load(),
            free_memory_mb=self.host.free_memory_mb(),
            local_time=self.wall(),
            drained=drained,
            idle_problem=problem,
            own_mb=own_mb,
        )
