"""``python -m bench fleet``: how fast a fleet forms and notices a loss, in a lab of network namespaces.

Each agent (``shoal agent`` with nothing but its identity) runs in a host namespace of its own on one
bridge (``tests/integration/netlab.py``); times are read from the agents' own log lines (one per
membership event), so nothing here opens a socket to a lab address. Needs root and iproute2.

Figures (the goals of issue 23):

- ``mdns_all_listed_s``: from launching every agent at once to every agent listing every other (< 3 s);
  ``mdns_after_last_ready_s``: the same from the last agent's ready line (on a 2-core machine, starting ten
  Python processes at once takes seconds of its own);
- ``seed_all_listed_s``: the same with mDNS off and one ``--peer`` seed for all (< 5 s);
- ``kill_lost_s`` / ``cut_lost_s``: from ``kill -9`` / pulling a host's cable to every other agent listing
  it lost, with the default settings (<= 10 s);
- ``apply_us``: the membership function over 1,000 members and 10,000 events, per event.
"""

from __future__ import annotations

import argparse
import platform
import re
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from agent.fleet import init_fleet, issue_node
from agent.node.launcher import LocalAgent, launch_agent
from bench.report import print_figures

EVENT = re.compile(r"member \w+ \(([\w.-]+)\): \w+ -> (\w+)")
PORT = 7100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--agents", default="4,10", help="fleet sizes to form, comma-separated (default 4,10)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each measurement (median reported)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run_fleet_bench(args: argparse.Namespace) -> int:
    from tests.integration.netlab import NetLab

    why = NetLab.available()
    if why is not None:
        print(f"python -m bench fleet: {why}", file=sys.stderr)
        return 2
    sizes = [int(n) for n in args.agents.split(",")]
    report: dict[str, Any] = {"machine": f"{platform.node()} {platform.machine()}", "date": time.strftime("%F")}
    report["apply_us"] = round(apply_microseconds(), 1)
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        lab = NetLab("shoalbench", max(sizes), net="10.214.0")
        lab.up()
        try:
            fleet = Fleet(lab, root, max(sizes))
            for size in sizes:
                for how, mdns in (("mdns", True), ("seed", False)):
                    runs = [fleet.form(size, mdns) for _ in range(args.runs)]
                    report[f"{how}_all_listed_s[{size}]"] = median([r[0] for r in runs])
                    report[f"{how}_after_last_ready_s[{size}]"] = median([r[1] for r in runs])
            report["kill_lost_s"] = median([fleet.loss(4, "kill") for _ in range(args.runs)])
            report["cut_lost_s"] = median([fleet.loss(4, "cut") for _ in range(args.runs)])
        finally:
            lab.down()
    print_figures(report, args.json)
    return 0


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return round(ordered[len(ordered) // 2], 2)


class Fleet:
    def __init__(self, lab: Any, root: Path, size: int) -> None:
        self.lab, self.cache = lab, root / "cache"
        init_fleet(root / "fleet", "bench")
        self.identities = [issue_node(root / "fleet", f"pc{i}").cert.parent for i in range(1, size + 1)]

    def _start(self, size: int, mdns: bool) -> list[LocalAgent]:
        agents: list[LocalAgent | None] = [None] * size
        self.last_ready = 0.0
        extra = [] if mdns else ["--no-mdns"]

        def start(i: int) -> None:
            seed = [] if mdns or i == 0 else ["--peer", f"{self.lab.ip(1)}:{PORT}"]
            agents[i] = launch_agent(
                None,
                None,
                self.identities[i],
                self.cache,
                listen=f"{self.lab.ip(i + 1)}:{PORT}",
                extra_args=[*extra, *seed],
                wrapper=self.lab.command(i + 1, []),
                timeout=120,
            )
            self.last_ready = max(self.last_ready, time.monotonic())

        threads = [threading.Thread(target=start, args=(i,)) for i in range(size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return [a for a in agents if a is not None]

    def form(self, size: int, mdns: bool) -> tuple[float, float]:
        """Seconds from launching ``size`` agents at once to each listing every other as a member, and from
        the last one's ready line (what remains once every process has started)."""
        began = time.monotonic()
        agents = self._start(size, mdns)
        try:
            _until(lambda: all(len(_members(a)) == size - 1 for a in agents), 60)
            done = time.monotonic()
            return done - began, max(0.0, done - self.last_ready)
        finally:
            _stop(agents)

    def loss(self, size: int, how: str) -> float:
        """Seconds from killing (or cutting off) the last agent to every other listing it lost."""
        agents = self._start(size, mdns=True)
        try:
            _until(lambda: all(len(_members(a)) == size - 1 for a in agents), 60)
            victim = f"pc{size}"
            began = time.monotonic()
            if how == "kill":
                agents[-1].process.send_signal(signal.SIGKILL)
            else:
                self.lab.cut(size)
            _until(lambda: all(_states(a).get(victim) == "lost" for a in agents[:-1]), 60)
            return time.monotonic() - began
        finally:
            self.lab.restore(size)
            _stop(agents)


def _states(agent: LocalAgent) -> dict[str, str]:
    found = {}
    for line in list(agent.log):
        match = EVENT.search(line)
        if match:
            found[match.group(1)] = match.group(2)
    return found


def _members(agent: LocalAgent) -> list[str]:
    return [name for name, state in _states(agent).items() if state == "member"]


def _until(check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError("the fleet did not get there in time")
        time.sleep(0.02)


def _stop(agents: list[LocalAgent]) -> None:
    for agent in agents:
        if agent.process.poll() is None:
            agent.process.kill()
    for agent in agents:
        agent.process.wait(10)


def apply_microseconds() -> float:
    """Microseconds per ``apply`` over 1,000 members and 10,000 events (heartbeats and ticks)."""
    from discovery.announcement import Announcement
    from discovery.membership import Heartbeat, Membership, Source, Tick, Verified, apply

    def announce(n: int) -> Announcement:
        return Announcement(f"{n:012x}", f"pc{n}", "f" * 16, "sha256:" + f"{n:064x}", "1", 4, 7100, f"{n:08x}", 0)

    state = Membership(announce(0))
    for n in range(1, 1001):
        state = apply(Verified(announce(n), "h", Source.MDNS, 0.0), state)
    events = [Heartbeat(announce(1 + i % 1000).node, i / 1000) for i in range(9000)] + [
        Tick(i / 100) for i in range(1000)
    ]
    start = time.perf_counter()
    for event in events:
        state = apply(event, state)
    return (time.perf_counter() - start) / len(events) * 1e6
