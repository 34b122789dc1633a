"""Peak resident memory of a process, and a launcher that records it for any Python module.

``python -m bench.peak OUT MODULE [ARGS...]`` runs ``MODULE`` as ``__main__`` (as ``python -m
MODULE ARGS...`` would) and writes the process's peak resident set size in bytes to ``OUT`` when
it exits.

Why not ``wait4``'s ``ru_maxrss``: Linux carries a parent's high-water mark into a forked child
and keeps it across ``exec``, so a child of a 600 MB benchmark process never reports less than
600 MB. ``VmHWM`` in ``/proc/self/status`` belongs to the memory map, which ``exec`` replaces, so
it measures the child alone (GNU ``/usr/bin/time`` gets the same figure because it is small).
"""

from __future__ import annotations

import atexit
import resource
import runpy
import sys
from pathlib import Path


def peak_rss_bytes() -> int:
    """This process's peak resident memory since its last ``exec`` (``ru_maxrss`` off Linux)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        print("usage: python -m bench.peak OUT MODULE [ARGS...]", file=sys.stderr)
        sys.exit(2)
    out, module, *rest = argv
    atexit.register(lambda: Path(out).write_text(str(peak_rss_bytes())))
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
