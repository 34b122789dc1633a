"""The benchmarks' agents: the cores they and the head are pinned to, and starting them through the launcher.

``python -m bench ring`` and ``python -m bench chat`` both run a head on one core (``--head-core``) and
``shoal agent`` processes for the other stages, one core per agent in stage order (``--agent-core``; with
fewer cores than agents, the last is shared by the rest). The agents are started by the product's own
launcher (:func:`agent.node.launcher.launch_agent`) with one inference thread each.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from agent.cli.common import core_list
from agent.node.launcher import LocalAgent, launch_agent
from bench import BenchError

AGENT_ARGS = ("--threads", "1", "--device", "CPU", "--no-verify")
"""Every benchmark agent: one OpenVINO thread on the CPU, its files not hashed again (the bench just exported them)."""
AGENT_ENV = {"OMP_NUM_THREADS": "1"}
AGENT_READY_TIMEOUT = 900.0
"""An agent compiles its stage on one thread before it is ready: minutes for a large model."""


class PinnedCores:
    """Where a benchmark's head and agents run (mixed into its settings, which hold the two fields)."""

    head_core: int
    agent_cores: tuple[int, ...]
    """The agents' cores in stage order (stage 1 first); with fewer cores than agents, the last is shared."""

    def agent_core(self, stage: int) -> int:
        """The core of the agent serving ``stage`` (1 and up: the head holds stage 0)."""
        return self.agent_cores[min(stage - 1, len(self.agent_cores) - 1)]

    def spare_cores(self) -> list[int]:
        """Usable cores that neither the head nor an agent is pinned to."""
        taken = {self.head_core, *self.agent_cores}
        return [core for core in sorted(os.sched_getaffinity(0)) if core not in taken]


def pick_cores(head_core: int | None, agent_cores: Sequence[int] | None) -> tuple[int, tuple[int, ...]]:
    """``--head-core`` and ``--agent-core`` checked, with their defaults: the first and the last usable core."""
    allowed = sorted(os.sched_getaffinity(0))
    head = allowed[0] if head_core is None else head_core
    agents = tuple(agent_cores) if agent_cores else (allowed[-1],)
    if head not in allowed or any(core not in allowed for core in agents):
        raise BenchError(f"--head-core/--agent-core must be among the usable cores {allowed}")
    if head in agents and len(allowed) > 1:
        raise BenchError("the head and the agents need different cores")
    return head, agents


def add_core_arguments(parser: argparse.ArgumentParser, head_help: str) -> None:
    """``--head-core`` (described by ``head_help``) and ``--agent-core``, as :func:`pick_cores` reads them."""
    parser.add_argument("--head-core", type=int, default=None, help=head_help)
    parser.add_argument(
        "--agent-core",
        type=core_list,
        default=None,
        metavar="N[,N...]",
        help="cores of the agents, one per agent in stage order (stage 1 first; the last is shared by any "
        "further agents; default: the last core)",
    )


def cores_text(agent_cores: Sequence[int], agents: int) -> str:
    """Which cores ``agents`` agents ran on, in words: one each, or the last shared by the agents beyond the list."""
    named = ", ".join(str(core) for core in agent_cores[:agents])
    if agents == 1:
        return f"core {agent_cores[0]}"
    if len(agent_cores) >= agents:
        return f"one core each (cores {named} in stage order)"
    if len(agent_cores) == 1:
        return f"core {agent_cores[0]}, which the {agents} agents share"
    return (
        f"cores {named} in stage order, the agents of stages {len(agent_cores)}-{agents} sharing core {agent_cores[-1]}"
    )


def start_agent(
    export: Path,
    stage: int,
    identity_dir: Path,
    core: int,
    cache_dir: Path,
    log: Path,
    next_address: tuple[str, int] | None = None,
    extra: Sequence[str] = (),
) -> LocalAgent:
    """``shoal agent`` serving ``stage`` on one thread pinned to ``core``, its log in ``log``; returns once it is
    ready. ``extra``: further ``shoal agent`` flags (a chat endpoint, ``--rewind``, say)."""
    return launch_agent(
        export,
        stage,
        identity_dir,
        cache_dir,
        next_address=next_address,
        extra_args=[*AGENT_ARGS, *extra],
        core=core,
        log_path=log,
        timeout=AGENT_READY_TIMEOUT,
        env=AGENT_ENV,
    )


def cpu_seconds(agent: LocalAgent) -> float:
    """CPU time the agent's process has used so far (0 once it is gone)."""
    import psutil

    try:
        times = psutil.Process(agent.process.pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)
