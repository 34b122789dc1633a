"""An agent started the way ``shoal service install``'s systemd unit starts it (issue 44, acceptance 4): the unit's
``ExecStart`` command line and ``Environment``, its ``Nice=19``, ``IOSchedulingClass=idle`` and ``CPUWeight=idle``
applied with ``nice``, ``ionice`` and ``chrt --idle`` (no user systemd instance runs here). It answers a chat
through a 2-stage ring, and on SIGTERM, the service manager's stop, it exits cleanly within 10 s: its peer
hears its goodbye, its chat endpoint file and its running record are gone."""

from __future__ import annotations

import os
import queue
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from agent.cli.service_cmd import Host, InstallSettings, install_plan
from agent.node.launcher import READY, LocalAgent
from agent.node.running import RUNNING_FILE
from tests.integration.ring_lab import Fleet, start_agent, status, wait_for

pytestmark = pytest.mark.processes


def unit_start(unit: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """A systemd unit's ``ExecStart`` words, its ``Environment`` and its other ``[Service]`` settings."""
    settings: dict[str, str] = {}
    environment: dict[str, str] = {}
    for line in unit.splitlines():
        key, sep, value = line.partition("=")
        if not sep or line.startswith("#"):
            continue
        value = value.replace("%%", "%").replace("$$", "$")  # no specifier or variable is left to expand
        if key == "Environment":
            name, _, text = shlex.split(value)[0].partition("=")
            environment[name] = text
        else:
            settings[key] = value
    return shlex.split(settings["ExecStart"]), environment, settings


@pytest.fixture
def last_stage(exported: Callable[..., Path], fleet: Fleet, cache_dir: Path) -> Iterator[LocalAgent]:
    agent = start_agent(exported(2, "fp32"), 1, fleet.identity("svc-last"), cache_dir, extra=["--precision", "f32"])
    yield agent
    agent.stop()


def test_the_agent_started_as_the_unit_starts_it_answers_and_stops_cleanly_on_sigterm(
    exported: Callable[..., Path], fleet: Fleet, cache_dir: Path, last_stage: LocalAgent, tmp_path: Path
) -> None:
    identity = fleet.identity("svc-donor").cert.parent
    chat_file = tmp_path / "chat.json"
    last = f"{last_stage.address[0]}:{last_stage.address[1]}"
    config = tmp_path / "agent.toml"
    config.write_text(
        f'export_dir = "{exported(2, "fp32")}"\nstages = [0]\nlisten = "127.0.0.1:0"\nnext = "{last}"\n'
        f'peers = ["{last}"]\nchat = "127.0.0.1:0"\nchat_file = "{chat_file}"\ndevice = "CPU"\nprecision = "f32"\n'
        "verify = false\n",
        encoding="utf-8",
    )
    home = tmp_path / "home"
    data = home / ".local" / "share" / "shoal"
    host = Host(
        "linux", home, sys.executable, "ana", os.getuid(), home / ".config", data, {"SHOAL_CACHE_DIR": str(cache_dir)}
    )
    unit = install_plan(host, InstallSettings(identity, config)).files[0].text()
    argv, environment, service = unit_start(unit)
    assert argv[:3] == [sys.executable, "-m", "agent.cli.main"] and environment["SHOAL_CACHE_DIR"] == str(cache_dir)
    assert (service["Nice"], service["IOSchedulingClass"], service["CPUWeight"]) == ("19", "idle", "idle")
    # systemd's user manager gives a unit HOME, PATH and the unit's Environment; nice, ionice and chrt stand in
    # for its Nice=, IOSchedulingClass= and CPUWeight=idle (SCHED_IDLE: CPU time only when no one else wants it)
    env = {"HOME": str(home), "PATH": os.environ["PATH"], "LANG": "C.UTF-8", **environment}
    command = ["nice", "-n", service["Nice"], "ionice", "-c", "3", "chrt", "--idle", "0", *argv]
    log = (tmp_path / "agent.log").open("w")
    agent = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, env=env, text=True)
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in agent.stdout or []], daemon=True)
    try:
        reader.start()
        deadline = time.monotonic() + 180
        while not READY.search(lines.get(timeout=max(0.1, deadline - time.monotonic()))):
            pass
        process = psutil.Process(agent.pid)
        assert process.nice() == 19
        assert process.ionice().ioclass == psutil.IOPRIO_CLASS_IDLE
        assert os.sched_getscheduler(agent.pid) == os.SCHED_IDLE

        answer = subprocess.run(
            [sys.executable, "-m", "agent.cli.main", "ask", "What is the capital of France?", "--chat-file",
             str(chat_file), "--max-tokens", "12"],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert answer.returncode == 0, answer.stderr
        assert "Paris" in answer.stdout

        watcher = fleet.identity("svc-watch")

        def donor_state() -> str | None:
            members = status(last_stage.address, watcher)["members"]["members"]  # type: ignore[index]
            return next((m["state"] for m in members if m["name"] == "svc-donor"), None)

        wait_for(lambda: donor_state() == "member", 30, "the last stage to count the donor as a member")
        stopping = time.monotonic()
        agent.terminate()  # what systemctl --user stop sends (KillSignal=SIGTERM)
        assert agent.wait(timeout=10) == 0
        took = time.monotonic() - stopping
        print(f"stopped {took:.2f} s after SIGTERM")
        assert not chat_file.exists() and not (identity / RUNNING_FILE).exists()
        wait_for(lambda: donor_state() == "gone", 5, "the last stage to hear the donor's goodbye")
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait(5)
        if reader.ident is not None:
            reader.join(5)  # at the pipe's end of file, now that the agent has gone; then its pipe is closed
        if agent.stdout is not None and not reader.is_alive():
            agent.stdout.close()
        log.close()
