"""The benchmarks' agents: the cores they and the head are pinned to, and starting them through the launcher.

``python -m bench ring`` and ``python -m bench chat`` both run a head on one core (``--head-core``) and
``shoal agent`` processes for the other stages, one core per agent in stage order (``--agent-core``; with
fewer cores than agents, the last is shared by the rest). The agents are started by the product's own
launcher (:func:`agent.node.launcher.launch_agent`) with one inference thread each.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from collections.abc import Mapping, Sequence
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


def bench_dirs(cache_dir: Path, logs: str) -> tuple[Path, Path]:
    """The benchmarks' fleet (its CA made on first use; every agent's identity is issued from it) and a new
    timestamped folder for this run's logs under ``CACHE/bench/LOGS``."""
    from agent.fleet import init_fleet

    bench_dir = cache_dir / "bench"
    fleet_dir = bench_dir / "ring-fleet"
    if not (fleet_dir / "ca.pem").is_file():
        init_fleet(fleet_dir, name="shoal-bench", force=True)
    log_dir = bench_dir / logs / dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_dir.mkdir(parents=True, exist_ok=True)
    return fleet_dir, log_dir


def start_chat_ring(
    export: Path,
    stages: int,
    cores: PinnedCores,
    fleet_dir: Path,
    cache_dir: Path,
    log_dir: Path,
    heads: Mapping[str, Sequence[str]],
    extra: Sequence[str] = (),
) -> tuple[list[LocalAgent], dict[str, Path]]:
    """A ring of ``stages`` on this machine: the agents of stages 1 and up (last first, each told the next one's
    address) on their cores, then for each name in ``heads`` an agent of stage 0 on the head core that heads chats,
    with the further flags ``heads[name]``. ``extra``: flags of every agent. Returns the agents (stage 1 first, the
    chat agents last) and each chat agent's endpoint file; if one fails to start, those started are stopped."""
    from agent.fleet import issue_node

    agents: list[LocalAgent] = []
    endpoints: dict[str, Path] = {}
    address: tuple[str, int] | None = None
    try:
        for index in range(stages - 1, 0, -1):
            identity = issue_node(fleet_dir, f"stage-{index}", force=True)  # the bench fleet outlives runs
            core = cores.agent_core(index)
            print(f"bench: starting the agent of stage {index} on core {core}", file=sys.stderr, flush=True)
            agent = start_agent(
                export, index, identity.cert.parent, core, cache_dir, log_dir / f"agent{index}.log", address, extra
            )
            agents.insert(0, agent)
            address = agent.address
        assert address is not None, "a ring has at least 2 stages"
        last = agents[-1].address
        for name, flags in heads.items():
            identity = issue_node(fleet_dir, f"chat-{name}", force=True)
            endpoints[name] = log_dir / f"chat-{name}.json"
            print(f"bench: starting the chat agent {name} on core {cores.head_core}", file=sys.stderr, flush=True)
            chat = ["--chat", "127.0.0.1:0", "--chat-file", str(endpoints[name]), "--ring-last", f"{last[0]}:{last[1]}"]
            agents.append(
                start_agent(
                    export,
                    0,
                    identity.cert.parent,
                    cores.head_core,
                    cache_dir,
                    log_dir / f"chat-{name}.log",
                    address,
                    [*chat, *extra, *flags],
                )
            )
    except BaseException:
        for agent in agents:
            agent.stop(timeout=30)
        raise
    return agents, endpoints
