"""Starting ``shoal agent`` processes on this machine: the demo fleet, benchmarks and tests."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import RingError

READY = re.compile(r"shoal agent: ready node=(\S+) listen=(\S+):(\d+)")


@dataclass
class LocalAgent:
    """One agent subprocess; the last lines of its log (stderr) are kept in ``log``."""

    stage: int
    process: subprocess.Popen[str]
    address: tuple[str, int] = ("", 0)
    log: deque[str] = field(default_factory=lambda: deque(maxlen=20_000))

    def log_text(self) -> str:
        return "\n".join(self.log)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (the agent says goodbye to its peers), then SIGKILL if it lingers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


def launch_agent(
    export_dir: Path,
    stage: int,
    identity_dir: Path,
    cache_dir: Path,
    *,
    listen: str = "127.0.0.1:0",
    next_address: tuple[str, int] | None = None,
    extra_args: list[str] | None = None,
    core: int | None = None,
    log_path: Path | None = None,
    timeout: float = 180.0,
    wrapper: list[str] | None = None,
    python: str = sys.executable,
) -> LocalAgent:
    """Start one agent and wait for its ready line (it has verified and compiled its stage).

    ``wrapper``: a command the agent runs under, e.g. ``ip netns exec NS`` for an agent in a network namespace.
    ``python``: the interpreter of the shoal install to run (another virtualenv's, say)."""
    command = [
        *(wrapper or []),
        python,
        "-m",
        "agent.cli.main",
        "--cache-dir",
        str(cache_dir),
        "agent",
        str(export_dir),
        "--stage",
        str(stage),
        "--identity",
        str(identity_dir),
        "--listen",
        listen,
        *(extra_args or []),
    ]
    if next_address is not None:
        command += ["--next", f"{next_address[0]}:{next_address[1]}"]
    env = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    pin = None if core is None else (lambda: os.sched_setaffinity(0, {core}))
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=pin
    )
    agent = LocalAgent(stage, process)
    threading.Thread(target=_collect, args=(process, agent.log, log_path), daemon=True).start()
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        match = READY.search(line)
        if match:
            agent.address = (match.group(2), int(match.group(3)))
            threading.Thread(target=process.stdout.read, daemon=True).start()  # keep the pipe drained
            return agent
    agent.stop()
    tail = "\n".join(list(agent.log)[-15:])
    raise RingError(f"the agent for stage {stage} did not start:\n{tail}")


def launch_ring(
    export_dir: Path,
    identity_dirs: list[Path],
    cache_dir: Path,
    *,
    extra_args: list[str] | None = None,
    cores: list[int | None] | None = None,
    log_dir: Path | None = None,
    chat_file: Path | None = None,
    python: str = sys.executable,
) -> list[LocalAgent]:
    """One agent per stage on loopback, started last stage first so that each knows its successor's port.

    ``chat_file``: the agent of stage 0 also heads chats (``shoal agent --chat``), its endpoint written there."""
    agents: list[LocalAgent] = []
    next_address = None
    try:
        for stage in reversed(range(len(identity_dirs))):
            args = list(extra_args or [])
            if stage == 0 and chat_file is not None:
                args += ["--chat", "127.0.0.1:0", "--chat-file", str(chat_file)]
                if agents:
                    args += ["--ring-last", f"{agents[-1].address[0]}:{agents[-1].address[1]}"]
            agent = launch_agent(
                export_dir,
                stage,
                identity_dirs[stage],
                cache_dir,
                next_address=next_address,
                extra_args=args,
                core=None if cores is None else cores[stage],
                log_path=None if log_dir is None else log_dir / f"agent-{stage}.log",
                python=python,
            )
            agents.insert(0, agent)
            next_address = agent.address
    except BaseException:
        for agent in agents:
            agent.stop()
        raise
    return agents


def _collect(process: subprocess.Popen[str], lines: deque[str], log_path: Path | None) -> None:
    assert process.stderr is not None
    sink = log_path.open("w") if log_path is not None else None
    try:
        for line in process.stderr:
            lines.append(line.rstrip())
            if sink is not None:
                sink.write(line)
                sink.flush()
    finally:
        if sink is not None:
            sink.close()
