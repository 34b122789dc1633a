"""The README's first command as a user runs it (issue 25, acceptance 4): ``shoal demo`` in a real terminal
(tmux), which forms the local fleet's ring, opens the TUI, streams an answer to a question typed into it,
and on ctrl+q stops every agent it started.

The demo gets the session's int4 3-stage export minus its self-draft (the same stage files, so its export
is reused and nothing is exported again), a home folder of the test's own, and the session's compile cache.
Keys go in with ``tmux send-keys`` and the screen is read with ``tmux capture-pane``, as a person sees it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.tui, pytest.mark.processes, pytest.mark.timeout(400)]

SESSION = f"shoal-demo-test-{os.getpid()}"
QUESTION = "What is the capital of France?"


def demo_export(source: Path, folder: Path) -> Path:
    """``source`` without its draft: the stages and tokenizer linked, the manifest rewritten."""
    folder.mkdir(parents=True)
    for entry in source.iterdir():
        if entry.name not in ("manifest.json", "draft"):
            (folder / entry.name).symlink_to(entry)
    manifest = json.loads((source / "manifest.json").read_text())
    manifest["draft"] = None
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder


def tmux(*args: str) -> str:
    # -u and an explicit decode: CI runs without a locale (LANG unset), where tmux would draw the TUI's
    # box and dot characters as '_' and Python would read its output as ASCII
    return subprocess.run(["tmux", "-u", *args], check=True, capture_output=True, encoding="utf-8").stdout


def screen() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION)


def wait_for_screen(predicate: Callable[[str], bool], timeout: float, what: str) -> str:
    deadline = time.monotonic() + timeout
    shown = ""
    while time.monotonic() < deadline:
        try:
            shown = screen()
        except subprocess.CalledProcessError:  # the session ended
            break
        if predicate(shown):
            return shown
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}; the screen:\n{shown}")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")
def test_the_demo_opens_the_tui_streams_an_answer_and_ctrl_q_stops_every_agent(
    exported: Callable[..., Path], cache_dir: Path, tmp_path: Path
) -> None:
    export = demo_export(exported(3, "int4"), tmp_path / "exports" / "smollm2-3stage")
    home = tmp_path / "home"
    bin_dir = Path(sys.executable).parent
    # the TUI draws on stderr (Textual's way): nothing of the demo's is redirected
    command = f"{bin_dir / 'shoal'} demo --out {export}; echo demo-exited-$? > {tmp_path / 'exit'}"
    env = {"HOME": str(home), "SHOAL_CACHE_DIR": str(cache_dir), "TERM": "xterm-256color", "LANG": "C.UTF-8"}
    environment = [f"-e{name}={value}" for name, value in env.items()]
    tmux("new-session", "-d", "-s", SESSION, "-x", "120", "-y", "40", *environment, command)
    try:
        wait_for_screen(lambda s: "ring ready" in s, 240, "the TUI with the ring ready")
        tmux("send-keys", "-t", SESSION, "-l", QUESTION)
        tmux("send-keys", "-t", SESSION, "Enter")
        shown = wait_for_screen(lambda s: re.search(r"\d+ tokens · first token", s) is not None, 120, "the answer")
        assert QUESTION in shown
        assert "Paris" in shown, shown  # greedy SmolLM2 knows this one
        pids = _agents_of(home)
        assert len(pids) == 3, pids
        tmux("send-keys", "-t", SESSION, "C-q")
        deadline = time.monotonic() + 30
        while not (tmp_path / "exit").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (tmp_path / "exit").read_text().strip() == "demo-exited-0", screen()
        alive = [pid for pid in pids if _alive(pid)]
        assert alive == [], f"agents left running after ctrl+q: {alive}"
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)


def _agents_of(home: Path) -> list[int]:
    """The ``shoal agent`` processes whose identity lives under ``home`` (the demo's, and only these)."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            words = cmdline.read_bytes().split(b"\0")
        except OSError:  # ended meanwhile
            continue
        if b"agent" in words and any(str(home).encode() in word for word in words):
            pids.append(int(cmdline.parent.name))
    return pids


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its parent, the demo, which has ended) is not running
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split()[2] != "Z"
