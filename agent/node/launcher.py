"""Starting ``shoal agent`` processes on this machine: the demo fleet, benchmarks and tests."""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from agent.errors import RingError

READY = re.compile(r"shoal agent: ready node=(\S+) listen=(\S+):(\d+)")
PIPE_DRAIN_SECONDS = 5.0
"""How long ``LocalAgent.stop`` waits, once the agent has exited, for its log readers to reach its pipes' end."""


@dataclass
class LocalAgent:
    """One agent subprocess; the last lines of its log (stderr) are kept in ``log``."""

    stage: int | None
    process: subprocess.Popen[str]
    address: tuple[str, int] = ("", 0)
    log: deque[str] = field(default_factory=lambda: deque(maxlen=20_000))
    readers: list[threading.Thread] = field(default_factory=list)
    """The threads that drain the agent's stdout and stderr; each ends at its pipe's end of file."""

    def log_text(self) -> str:
        return "\n".join(self.log)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM (the agent says goodbye to its peers), then SIGKILL if it lingers; then its pipes are closed."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        self._close_pipes()

    def _close_pipes(self) -> None:
        # The readers see end of file once the agent (and any child that inherited its pipes) has gone; a pipe
        # is closed only after its reader has ended, never under a thread still reading it.
        for reader in self.readers:
            reader.join(PIPE_DRAIN_SECONDS)
        if any(reader.is_alive() for reader in self.readers):
            return  # something still writes to them: the readers keep draining, and the pipes stay open
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()


def launch_agent(
    export_dir: Path | None,
    stage: int | None,
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
    env: Mapping[str, str] | None = None,
) -> LocalAgent:
    """Start one agent and wait (at most ``timeout`` seconds) for its ready line: it has verified and compiled
    its stage (with no ``export_dir`` and ``stage``: a member that holds no stage, which is ready at once).
    Its log (stderr) is kept in ``LocalAgent.log`` and, with ``log_path``, written to that file.

    ``core``: the one CPU the agent runs on (with ``taskset`` where it is installed, else set in the child
    before it starts Python); ``wrapper``: a command the agent runs under, e.g. ``ip netns exec NS`` for an
    agent in a network namespace; ``python``: the interpreter of the shoal install to run (another
    virtualenv's, say); ``env``: variables added to the agent's environment."""
    command = [
        python,
        "-m",
        "agent.cli.main",
        "--cache-dir",
        str(cache_dir),
        "agent",
        *([str(export_dir)] if export_dir is not None else []),
        *(["--stage", str(stage)] if stage is not None else []),
        "--identity",
        str(identity_dir),
        "--listen",
        listen,
        *(extra_args or []),
    ]
    if next_address is not None:
        command += ["--next", f"{next_address[0]}:{next_address[1]}"]
    taskset = shutil.which("taskset") if core is not None else None
    if taskset:
        command = [taskset, "-c", str(core), *command]  # pinned by exec: no Python runs between fork and exec
    pin = None if core is None or taskset else (lambda: os.sched_setaffinity(0, {core}))
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", **(env or {})}
    process = subprocess.Popen(
        [*(wrapper or []), *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        encoding="utf-8",
        errors="replace",
        env=environment,
        preexec_fn=pin,
    )
    agent = LocalAgent(stage, process)
    lines: queue.Queue[str | None] = queue.Queue()
    waiting = threading.Event()
    waiting.set()
    agent.readers = [
        threading.Thread(target=_collect, args=(process, agent.log, log_path), daemon=True),
        threading.Thread(target=_watch_stdout, args=(process, lines, waiting), daemon=True),
    ]
    for reader in agent.readers:
        reader.start()
    deadline = time.monotonic() + timeout
    ended = False
    try:
        while not ended and (remaining := deadline - time.monotonic()) > 0:
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                break
            ended = line is None
            match = READY.search(line) if line is not None else None
            if match:
                agent.address = (match.group(2), int(match.group(3)))
                return agent
    except BaseException:  # interrupted while waiting: the agent must not outlive its launcher
        agent.stop()
        raise
    finally:
        waiting.clear()  # from now on the watcher only keeps the pipe drained
    agent.stop()
    tail = "\n".join(list(agent.log)[-15:])
    why = f"it ended (exit {process.returncode})" if ended else f"it was not ready within {timeout:.0f} s"
    which = f"the agent for stage {stage}" if stage is not None else f"the agent {identity_dir.name}"
    raise RingError(f"{which} did not start: {why}:\n{tail}")


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


def launch_fleet(
    identity_dirs: list[Path],
    cache_dir: Path,
    *,
    extra_args: list[str] | None = None,
    chat_file: Path | None = None,
    log_dir: Path | None = None,
    python: str = sys.executable,
) -> list[LocalAgent]:
    """Agents of a self-forming fleet on loopback, with nothing but their identities: the first is every other
    one's seed (``--peer``; loopback carries no multicast). ``chat_file``: the first also heads chats."""
    agents: list[LocalAgent] = []
    try:
        for index, identity in enumerate(identity_dirs):
            args = list(extra_args or [])
            if index == 0 and chat_file is not None:
                args += ["--chat", "127.0.0.1:0", "--chat-file", str(chat_file)]
            if agents:
                args += ["--peer", f"{agents[0].address[0]}:{agents[0].address[1]}"]
            agents.append(
                launch_agent(
                    None,
                    None,
                    identity,
                    cache_dir,
                    extra_args=args,
                    log_path=None if log_dir is None else log_dir / f"agent-{identity.name}.log",
                    python=python,
                )
            )
    except BaseException:
        for agent in agents:
            agent.stop()
        raise
    return agents


def _watch_stdout(process: subprocess.Popen[str], lines: queue.Queue[str | None], waiting: threading.Event) -> None:
    """Hand the agent's stdout lines to ``launch_agent`` while it waits for the ready line, then drain the pipe."""
    assert process.stdout is not None
    for line in process.stdout:
        if waiting.is_set():
            lines.put(line)
    lines.put(None)


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
