"""A LAN of "PCs" made of Linux network namespaces, for tests that need a cable pulled.

Layout (the root namespace is never touched: no links, addresses or routes are added there):
``{prefix}-br`` holds bridge ``br0`` and one veth port ``h{i}`` per host; ``{prefix}-h{i}`` is host i, with
``lo`` and ``eth0`` = ``{net}.{i}/24`` and no default route, so an address outside the lab fails at once.
``cut(i)`` downs host i's bridge port: its peers get no FIN and no RST, as when a PC's cable is pulled or it
loses power (measured in the shared netlab's NOTES.md: only keepalive and ``TCP_USER_TIMEOUT`` notice).

The test process stays in the root namespace and never opens a socket to a lab address (there it would
leave the machine); every party of a test runs as a subprocess inside a host (``command(i, ...)``).
Needs root and iproute2.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence


class NetLab:
    """``hosts`` namespaces on one bridge; ``up()`` first removes whatever a crashed run with this prefix left."""

    def __init__(self, prefix: str, hosts: int, net: str = "10.211.0") -> None:
        self.prefix, self.hosts, self.net = prefix, hosts, net

    @staticmethod
    def available() -> str | None:
        """Why this machine cannot build a lab (None: it can)."""
        if os.geteuid() != 0:
            return "network namespaces need root"
        if shutil.which("ip") is None:
            return "iproute2 (ip) is not installed"
        return None

    def ns(self, host: int) -> str:
        return f"{self.prefix}-h{host}"

    def ip(self, host: int) -> str:
        return f"{self.net}.{host}"

    def command(self, host: int, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside ``host`` (same filesystem and interpreter; only the network differs)."""
        return ["ip", "netns", "exec", self.ns(host), *argv]

    def up(self) -> None:
        self.down()
        bridge = f"{self.prefix}-br"
        try:
            _ip("netns", "add", bridge)
            _ip("-n", bridge, "link", "set", "lo", "up")
            _ip("-n", bridge, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
            _ip("-n", bridge, "link", "set", "br0", "up")
            for host in range(1, self.hosts + 1):
                ns = self.ns(host)
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("-n", bridge, "link", "add", f"h{host}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("-n", bridge, "link", "set", f"h{host}", "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{self.ip(host)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "route", "add", "224.0.0.0/4", "dev", "eth0")  # multicast (mDNS) without a default route
        except BaseException:
            self.down()
            raise

    def cut(self, host: int) -> None:
        """Unplug ``host``: its bridge port goes down; nothing is sent to its peers."""
        _ip("-n", f"{self.prefix}-br", "link", "set", f"h{host}", "down")

    def restore(self, host: int) -> None:
        _ip("-n", f"{self.prefix}-br", "link", "set", f"h{host}", "up")

    def down(self) -> None:
        """Stop everything still running inside the lab, then delete its namespaces."""
        names = [n for n in _namespaces() if n == f"{self.prefix}-br" or n.startswith(f"{self.prefix}-h")]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = [int(p) for n in names for p in _run("ip", "netns", "pids", n).split()]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + 3
            while pids and time.monotonic() < deadline and any(_run("ip", "netns", "pids", n).strip() for n in names):
                time.sleep(0.1)
        for name in names:
            _run("ip", "netns", "del", name)


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _run("ip", "netns", "list").splitlines() if line.strip()]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, encoding="utf-8", errors="replace")


def _run(*argv: str) -> str:
    return subprocess.run(argv, capture_output=True, encoding="utf-8", errors="replace").stdout
