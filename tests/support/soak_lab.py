"""The soak in a lab of network namespaces (``python -m bench soak --lab``): a host can be cut off the network.

:func:`soak_in_lab` runs in the root namespace: it builds a lab of one host per agent (``LAB_HOSTS``), starts
the soak's driver (this module's ``main``) inside the head's host, and tears the lab down, whatever happened.
The driver forms the fleet there, each agent started inside its own host, and runs the soak as on loopback:
its clients reach the head's chat endpoint and API on the head host's loopback, and ask every agent's status
at its lab address, from inside the lab. The root namespace never opens a socket to a lab address (it has a
default route: such a packet would leave the machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agent.errors import BenchError
from tests.integration.netlab import NetLab
from tests.support.soak_fleet import HEAD, LAB_HOSTS

NET = "10.218.0"
REPO = Path(__file__).resolve().parents[2]
SETTINGS_FILE = "lab-settings.json"


def soak_in_lab(settings: Any, export: Path, cache_dir: Path, out: Path, prefix: str = "shoalsoak") -> dict[str, Any]:
    """Build the lab, run the soak (``bench.soak_bench.SoakSettings``) from inside its head host with every
    agent in its own host, and take the lab down; the report (also ``out/soak.json``)."""
    if (why := NetLab.available()) is not None:
        raise BenchError(f"the soak's lab cannot be built here: {why}")
    lab = NetLab(prefix, len(LAB_HOSTS), NET)
    (out / SETTINGS_FILE).write_text(json.dumps(asdict(settings)))
    lab.up()
    try:
        driver = [sys.executable, "-m", "tests.support.soak_lab", prefix, str(export), str(cache_dir), str(out)]
        done = subprocess.run(lab.command(LAB_HOSTS[HEAD], driver), cwd=REPO)
        if done.returncode:
            raise BenchError(f"the soak's driver in the lab failed (exit {done.returncode}); logs in {out}")
        return json.loads((out / "soak.json").read_text())  # type: ignore[no-any-return]
    finally:
        lab.down()  # stops whatever is still running in the lab, the driver and its agents included


def inside(namespace: str) -> bool:
    """Whether this process runs in the named network namespace (``ip netns``'s ``/run/netns/NAME``)."""
    own, named = os.stat("/proc/self/ns/net"), os.stat(f"/run/netns/{namespace}")
    return (own.st_dev, own.st_ino) == (named.st_dev, named.st_ino)


def main(argv: list[str]) -> int:
    """The driver, inside the head's host: ``PREFIX EXPORT CACHE_DIR OUT`` (the settings in ``OUT``)."""
    from bench.soak_bench import SoakSettings, soak

    prefix, export, cache_dir, out = argv[0], Path(argv[1]), Path(argv[2]), Path(argv[3])
    lab = NetLab(prefix, len(LAB_HOSTS), NET)
    if not inside(lab.ns(LAB_HOSTS[HEAD])):
        raise SystemExit(f"the soak's lab driver runs only inside {lab.ns(LAB_HOSTS[HEAD])} (soak_in_lab starts it)")
    found = json.loads((out / SETTINGS_FILE).read_text())
    settings = SoakSettings(**{**found, "fault_kinds": tuple(found["fault_kinds"])})
    report = soak(settings, export, cache_dir, out, lab=lab)
    (out / "soak.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
