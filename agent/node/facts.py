"""What this PC can give the fleet, measured once at start: its OpenVINO devices, memory and speed.

The agent announces these (``discovery.announcement``) so that placement can weigh its members without
asking each one; they are claims for planning, not promises.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import psutil

MEMORY_RESERVE = 0.25
"""Share of the memory available at start that the agent leaves to the PC's own user."""
SPEED_SIZE = 256
SPEED_SECONDS = 0.2


@dataclass(frozen=True)
class HostFacts:
    devices: tuple[str, ...]
    memory_mb: int
    """MiB a shard may take: what is available now, less a reserve for the user."""
    speed: float
    """A float32 matrix product's GFLOP/s on this PC's CPU (a rough, comparable figure of its speed)."""


def measure_host(speed: bool = True) -> HostFacts:
    """Devices from ``openvino.Core().available_devices``; memory from psutil; a short matmul for ``speed``
    (else 0: the agent measures it once it runs, not to delay its start). Blocking: call it off the loop."""
    import openvino as ov

    devices = tuple(sorted(d.split(".")[0] for d in ov.Core().available_devices))
    gflops = round(matmul_gflops(), 1) if speed else 0.0
    return HostFacts(devices, offerable_mb(), gflops)


def offerable_mb() -> int:
    """MiB a shard may take on this PC now: the memory available, less :data:`MEMORY_RESERVE` for its user."""
    return int(psutil.virtual_memory().available * (1 - MEMORY_RESERVE)) // (1 << 20)


def resident_mb() -> int:
    """MiB of memory this process holds now (its resident set): what a stage's weights and sessions cost the PC,
    for ``shoal status`` and the TUI's fleet view. A read of ``/proc`` or its equivalent, cheap enough per status."""
    return int(psutil.Process().memory_info().rss) >> 20


def matmul_gflops(size: int = SPEED_SIZE, seconds: float = SPEED_SECONDS) -> float:
    """GFLOP/s of repeated ``size``-square float32 matrix products for about ``seconds``."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    a @ b  # warm the BLAS threads up
    runs, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        a @ b
        runs += 1
    return 2 * size**3 * runs / max(elapsed, 1e-9) / 1e9
