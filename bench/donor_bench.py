"""``python -m bench donor``: what a serving agent costs its donor's own programs (issue 43, acceptance 4).

A CPU-bound foreground task at normal priority runs for ``--seconds`` alone, then beside an agent that serves a
steady stream of chats (SmolLM2 1-stage int4, one inference thread, a client asking again and again), side by
side in one run. Two foreground tasks: a numpy matrix product loop (one BLAS thread) and a compile-like
single-threaded loop (Python's ``compile`` of a module's source). Each beside-run is made twice:

- ``same core``: the agent and the task pinned to one core, so the only thing between them is the scheduler:
  the agent as a donor's (``--donor``: nice 19, its inference threads in SCHED_IDLE) against an agent at normal
  priority, which shows what the donor settings buy;
- ``other core``: the donor's agent on another core: what is left is memory bandwidth and cache (decode reads
  every weight for every token), which no priority changes.

Reported: each task's throughput beside the agent as a share of alone (goal >= 0.95 for the donor's agent), and
what the agent still served meanwhile (tokens/s at the client).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from agent.errors import BenchError
from bench.report import print_figures

GOAL = 0.95
FOREGROUND = """
import json, os, sys, time
task, seconds = sys.argv[1], float(sys.argv[2])
if task == "matmul":
    import numpy as np
    a = np.random.default_rng(0).random((256, 256))
    work = lambda: a @ a
else:
    import inspect, json as module
    source = inspect.getsource(module.decoder)
    work = lambda: compile(source, "decoder.py", "exec")
work()
done, start = 0, time.monotonic()
while time.monotonic() - start < seconds:
    work()
    done += 1
print(json.dumps({"per_s": done / (time.monotonic() - start)}))
"""
TASKS = ("matmul", "compile")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seconds", type=float, default=10.0, help="each measurement's length (default 10)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def run_donor_bench(args: argparse.Namespace, cache_dir: Path) -> int:
    from bench.baseline import shoal_export

    if len(os.sched_getaffinity(0)) < 2:
        raise BenchError("python -m bench donor needs 2 cores: one shared by the agent and the task, one apart")
    cores = sorted(os.sched_getaffinity(0))[:2]
    export = shoal_export("smollm2", 1, cache_dir / "bench" / "donor-smollm2-1stage", cache_dir).path
    report: dict[str, Any] = {"machine": f"{platform.node()} {platform.machine()}", "date": time.strftime("%F %R")}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        for task in TASKS:
            alone = _foreground(task, args.seconds, cores[0])
            report[f"{task}_alone_per_s"] = round(alone, 1)
            for name, donor, core in (
                ("donor_same_core", True, cores[0]),
                ("normal_same_core", False, cores[0]),
                ("donor_other_core", True, cores[1]),
            ):
                with _ServingAgent(export, root / f"{task}-{name}", cache_dir, core, donor) as agent:
                    served_before = agent.tokens
                    began = time.monotonic()
                    beside = _foreground(task, args.seconds, cores[0])
                    served = (agent.tokens - served_before) / (time.monotonic() - began)
                report[f"{task}_{name}_share"] = round(beside / alone, 3)
                report[f"{task}_{name}_served_tok_s"] = round(served, 1)
        report["goal"] = f"foreground share >= {GOAL} beside the donor's agent on the same core"
        report["pass"] = all(report[f"{t}_donor_same_core_share"] >= GOAL for t in TASKS)
    print_figures(report, args.json)
    return 0


def _foreground(task: str, seconds: float, core: int) -> float:
    done = subprocess.run(
        ["taskset", "-c", str(core), sys.executable, "-c", FOREGROUND, task, str(seconds)],
        capture_output=True,
        text=True,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
        timeout=seconds * 3 + 60,
    )
    if done.returncode:
        raise BenchError(f"the {task} task failed: {done.stderr.strip()[-1000:]}")
    return float(json.loads(done.stdout)["per_s"])


class _ServingAgent:
    """One hand-wired agent serving the 1-stage export and heading chats, pinned to ``core``, with a client that
    asks again and again from a thread of this process (counting the tokens it receives)."""

    def __init__(self, export: Path, root: Path, cache_dir: Path, core: int, donor: bool) -> None:
        self.export, self.root, self.cache_dir, self.core, self.donor = export, root, cache_dir, core, donor
        self.tokens = 0
        self._stop = threading.Event()

    def __enter__(self) -> _ServingAgent:
        from agent.fleet import init_fleet, issue_node
        from agent.node.launcher import launch_agent

        self.root.mkdir(parents=True)
        init_fleet(self.root / "fleet", "bench")
        identity = issue_node(self.root / "fleet", "donor")
        chat_file = self.root / "chat.json"
        extra = ["--threads", "1", "--chat", "127.0.0.1:0", "--chat-file", str(chat_file)]
        self.agent = launch_agent(
            self.export,
            0,
            identity.cert.parent,
            self.cache_dir,
            extra_args=[*extra, *(["--donor"] if self.donor else [])],
            core=self.core,
            log_path=self.root / "agent.log",
        )
        self.client = threading.Thread(target=lambda: asyncio.run(self._ask(chat_file)), daemon=True)
        self.client.start()
        deadline = time.monotonic() + 60
        while self.tokens < 16:  # warm: the first answers compile and fill caches
            if time.monotonic() > deadline:
                raise BenchError(f"the agent did not answer:\n{self.agent.log_text()[-2000:]}")
            time.sleep(0.1)
        return self

    async def _ask(self, chat_file: Path) -> None:
        from agent.chat_client.client import ask
        from agent.chat_client.endpoint import ChatEndpoint
        from agent.chat_client.protocol import ChatRequest

        endpoint = ChatEndpoint.load(chat_file)
        request = ChatRequest(
            token=endpoint.token, messages=(("user", "Tell me about lighthouses."),), max_tokens=64, seed=1
        )
        while not self._stop.is_set():
            async for event in ask(endpoint, request):
                if event.event == "token":
                    self.tokens += 1

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.agent.stop()
        self.client.join(30)
