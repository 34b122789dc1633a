"""A PC that drops off the network without a word (cable pulled, power lost), between real hosts.

The agents and the head run in network namespaces of their own (``netlab``); the host of the last stage is
cut off in the middle of an answer, so its peers receive neither FIN nor RST. Nothing may hang: the head
fails that answer within seconds (keepalive and ``TCP_USER_TIMEOUT`` on every ring socket), stage 0 notices
its lost successor and frees the session, and once the cable is back the ring re-forms and answers as before.
A chat headed by an agent goes further: it waits for the cable and finishes the answer it was giving.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.fleet import NodeIdentity
from tests.integration.netlab import NetLab
from tests.integration.ring_lab import Fleet, start_agent, wait_for

pytestmark = [pytest.mark.processes, pytest.mark.root]
SHORT = "Name three colours."
LONG = "Write a very long story about a dragon who learns to code."  # SmolLM2 writes 400+ tokens (1 to 3 for others)
# keepalive 1/1/3 and a 3 s user timeout notice a cut in ~3-4.5 s (tune_socket); the rest is slack for a busy CI
NOTICE_WITHIN = 20.0


def _head(
    lab: NetLab,
    host: int,
    folder: Path,
    cache_dir: Path,
    identity: NodeIdentity,
    ring: list[tuple[str, int]],
    prompt: str,
    max_tokens: int,
) -> list[str]:
    """``shoal generate`` as the head of one answer, from inside ``host``."""
    return lab.command(
        host,
        [
            sys.executable,
            "-m",
            "agent.cli.main",
            "--cache-dir",
            str(cache_dir),
            "generate",
            str(folder),
            prompt,
            "--max-tokens",
            str(max_tokens),
            "--drafter",
            "none",
            "--no-verify",
            "--identity",
            str(identity.cert.parent),
            "--ring",
            ",".join(f"{host_}:{port}" for host_, port in ring),
        ],
    )


def _status(lab: NetLab, host: int, address: tuple[str, int], identity: NodeIdentity) -> dict[str, object]:
    """An agent's status, asked from inside ``host`` (the test's own namespace cannot reach the lab)."""
    done = subprocess.run(
        lab.command(
            host,
            [
                sys.executable,
                "-m",
                "agent.cli.main",
                "status",
                f"{address[0]}:{address[1]}",
                "--identity",
                str(identity.cert.parent),
                "--json",
            ],
        ),
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def test_a_stage_cut_off_mid_answer_fails_that_answer_and_the_ring_heals(
    netlab: NetLab,
    exported: Callable[..., Path],
    fleet: Fleet,
    cache_dir: Path,
) -> None:
    folder = exported(2, "fp32")
    first_address, last_address = (netlab.ip(1), 7100), (netlab.ip(2), 7101)
    ring = [first_address, last_address]
    head = fleet.identity("lab-head")
    last = start_agent(
        folder,
        1,
        fleet.identity("lab-node1"),
        cache_dir,
        listen=f"{last_address[0]}:7101",
        wrapper=netlab.command(2, []),
    )
    first = start_agent(
        folder,
        0,
        fleet.identity("lab-node0"),
        cache_dir,
        listen=f"{first_address[0]}:7100",
        next_address=last_address,
        wrapper=netlab.command(1, []),
    )

    def links_to_next() -> int:
        return sum("connected to next stage" in line for line in first.log)

    try:
        wait_for(lambda: links_to_next() >= 1, 30, "stage 0 to reach stage 1 across the lab")
        before = subprocess.run(
            _head(netlab, 3, folder, cache_dir, head, ring, SHORT, 16),
            capture_output=True,
            encoding="utf-8",
            errors="replace",
            timeout=180,
        )
        assert before.returncode == 0, before.stderr

        answer = subprocess.Popen(
            _head(netlab, 3, folder, cache_dir, head, ring, LONG, 1500),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            encoding="utf-8",
            errors="replace",
        )
        try:
            assert answer.stdout is not None and answer.stderr is not None
            assert answer.stdout.read(24), "the long answer produced no text"  # it is streaming now
            netlab.cut(2)
            cut_at = time.monotonic()
            try:
                answer.wait(NOTICE_WITHIN)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the head still waited {NOTICE_WITHIN:.0f} s after its last stage was cut off")
            noticed_after = time.monotonic() - cut_at
            errors = answer.stderr.read()
        finally:
            if answer.poll() is None:
                answer.kill()
        assert answer.returncode == 1, errors
        assert "shoal: error:" in errors and ("lost" in errors or "ring" in errors), errors
        print(f"\nthe head failed the answer {noticed_after:.1f} s after the cut: {errors.strip().splitlines()[-1]}")

        wait_for(
            lambda: any("lost next stage" in line for line in first.log),
            NOTICE_WITHIN,
            "stage 0 to notice its successor is gone",
        )
        held = _status(netlab, 3, first_address, head)
        assert held["next_stage"] == "down"
        assert held["sessions"] == [], "stage 0 still holds the failed answer's session"

        netlab.restore(2)
        wait_for(lambda: links_to_next() >= 2, 30, "stage 0 to re-dial its successor once it is back")
        after = subprocess.run(
            _head(netlab, 3, folder, cache_dir, head, ring, SHORT, 16),
            capture_output=True,
            encoding="utf-8",
            errors="replace",
            timeout=180,
        )
        assert after.returncode == 0, after.stderr
        assert after.stdout == before.stdout
    finally:
        netlab.restore(2)
        first.stop()
        last.stop()


def test_a_chat_cut_off_from_its_last_stage_pauses_and_goes_on_once_it_is_back(
    netlab: NetLab,
    exported: Callable[..., Path],
    fleet: Fleet,
    cache_dir: Path,
    tmp_path: Path,
) -> None:
    """The agent of the PC the user chats from (host 1) heads the chat; the last stage's host is cut off in
    the middle of the answer and plugged back in a few seconds later. The answer does not fail: the agent
    notices the cut, reconnects once the host is back, replays the session's steps, and ``shoal ask`` prints
    the whole answer, the same text as without the cut."""
    folder = exported(2, "fp32")
    last_address = (netlab.ip(2), 7101)
    chat_file = tmp_path / "chat.json"
    last = start_agent(
        folder,
        1,
        fleet.identity("lab-chat-node1"),
        cache_dir,
        listen=f"{last_address[0]}:7101",
        wrapper=netlab.command(2, []),
    )
    chat = start_agent(
        folder,
        0,
        fleet.identity("lab-chat-node0"),
        cache_dir,
        listen=f"{netlab.ip(1)}:7100",
        next_address=last_address,
        wrapper=netlab.command(1, []),
        extra=["--precision", "f32", "--chat", "127.0.0.1:0", "--chat-file", str(chat_file), "--chat-keep", "0"],
    )
    ask = netlab.command(
        1, [sys.executable, "-m", "agent.cli.main", "ask", LONG, "--max-tokens", "64", "--chat-file", str(chat_file)]
    )
    try:
        plain = subprocess.run(ask, capture_output=True, encoding="utf-8", errors="replace", timeout=180)
        assert plain.returncode == 0, plain.stderr

        answer = subprocess.Popen(
            ask, stdout=subprocess.PIPE, stderr=subprocess.PIPE, encoding="utf-8", errors="replace"
        )
        try:
            assert answer.stdout is not None and answer.stderr is not None
            head = answer.stdout.read(24)
            assert head, "the answer produced no text"  # it is streaming now
            netlab.cut(2)
            wait_for(
                lambda: any("ring lost after" in line for line in chat.log),
                NOTICE_WITHIN,
                "the chat agent to notice the cut",
            )
            netlab.restore(2)
            rest = answer.stdout.read()  # through the same buffer as the head (communicate() would skip it)
            errors = answer.stderr.read()
            answer.wait(30)
        finally:
            netlab.restore(2)
            if answer.poll() is None:
                answer.kill()
        assert answer.returncode == 0, errors
        assert head + rest == plain.stdout
        assert "replayed 1 time(s)" in errors, errors
    finally:
        chat.stop()
        last.stop()
