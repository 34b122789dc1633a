"""``shoal status`` for people: the plan's stages with their states, a download's progress, the pins."""

from __future__ import annotations

from typing import Any

from agent.cli.status_cmd import status_lines


def agent_status() -> dict[str, Any]:
    return {
        "node": "pc2",
        "layers": [10, 20],
        "stages": [1],
        "device": "CPU",
        "next_stage": "connected",
        "sessions": ["00000000000000aa"],
        "max_sessions": 8,
        "parked": 0,
        "evicted": 0,
        "steps_served": 12,
        "uptime_s": 3.5,
        "chat": {"endpoint": "127.0.0.1:7001", "answered": 2, "running": 1, "prompts_in": [[1024, 2754]]},
        "members": {"fleet": "f1", "members": [{"state": "member"}, {"state": "member"}, {"state": "lost"}]},
        "ring": {
            "activity": "standing by for stage 2",
            "download": {"what": "stage 2", "done": 3 * 1024 * 1024, "total": 12 * 1024 * 1024},
            "error": None,
        },
        "plan": {
            "hash": "ab" * 32,
            "epoch": 4,
            "planned_for": 3,
            "planned_by": "pc1",
            "ready": False,
            "waiting": "stage 2 on pc3 is downloading",
            "stages": [
                {"stage": 0, "name": "pc1", "state": "ready", "progress": None, "standbys": [], "reason": "fastest"},
                {
                    "stage": 1,
                    "name": "pc3",
                    "state": "downloading",
                    "progress": 40,
                    "standbys": [{"name": "pc2", "state": "downloading", "progress": 25}],
                    "reason": "automatic",
                },
                {"stage": 2, "name": None, "state": "uncovered", "progress": None, "standbys": [], "reason": "no room"},
            ],
            "pins": [{"node": "pc9", "stage": 2, "honoured": False, "reason": "pc9 is not a member"}],
        },
    }


def test_the_status_shows_each_stage_with_its_download_progress_and_the_pins() -> None:
    text = "\n".join(status_lines("10.0.0.2:7000", agent_status()))
    assert "agent pc2 at 10.0.0.2:7000, up 3.5 s: serves stage 1 (layers 10-19) on CPU" in text
    assert "sessions 1 of 8" in text
    assert "other members: 1 lost, 2 member" in text
    assert "downloading stage 2: 3.0 of 12.0 MiB (25 %)" in text
    assert "chats at 127.0.0.1:7001: 2 answered, 1 running\n  a prompt going in: 1,024 of 2,754 positions" in text
    assert "plan abababababab epoch 4 for document 3 (planned by pc1): stage 2 on pc3 is downloading" in text
    lines = text.splitlines()
    assert any(
        "stage 1: pc3" in line and "downloading 40 %" in line and "pc2 (downloading 25 %)" in line for line in lines
    )
    assert any("stage 2: uncovered" in line and "no room" in line for line in lines)
    assert "pin pc9 -> stage 2: NOT honoured: pc9 is not a member" in text


def test_an_agent_wired_by_hand_shows_no_plan() -> None:
    status = agent_status()
    for section in ("members", "ring", "plan"):
        del status[section]
    status["stages"] = []
    lines = status_lines("127.0.0.1:7000", status)
    assert lines[0].endswith("serves no stage")
    assert not any("plan" in line for line in lines)


def test_the_status_says_whether_a_stage_and_the_chats_were_exact() -> None:
    status = agent_status()
    status["exact_speculation"] = False
    status["chat"]["inexact"] = 1
    text = "\n".join(status_lines("10.0.0.2:7000", status))
    assert "next stage connected, not exact with drafts (--threads 1 or --precision f32 makes it so)" in text
    assert "2 answered (1 not exact), 1 running" in text
    status["exact_speculation"] = True
    status["chat"]["inexact"] = 0
    text = "\n".join(status_lines("10.0.0.2:7000", status))
    assert "next stage connected, exact" in text and "2 answered, 1 running" in text


def test_the_status_says_what_each_stage_decodes_in() -> None:
    status = agent_status()
    assert "decodes in" not in "\n".join(status_lines("10.0.0.2:7000", status))
    status["precision"] = ["bf16", "auto"]  # chosen by timing on that PC (agent.runtime.tuning)
    assert ", decodes in bf16/auto" in status_lines("10.0.0.2:7000", status)[0]


def test_the_status_says_what_a_donor_does_and_why_and_which_members_stepped_aside() -> None:
    status = agent_status()
    status["members"]["members"].append({"name": "pc4", "state": "member", "announces": {"donor": "away"}})
    status["members"]["members"].append({"name": "pc5", "state": "member", "announces": {"donor": "serving"}})
    status["donor"] = {
        "state": "draining",
        "reason": "keyboard or mouse used 2 s ago",
        "for_seconds": 1.5,
        "idle_source": "x11",
        "idle_problem": None,
    }
    text = "\n".join(status_lines("10.0.0.2:7000", status))
    assert "  pc4 is away (its owner's PC: its user is here)" in text and "pc5 is" not in text
    assert "  donor: draining for 1.5 s: keyboard or mouse used 2 s ago (idle source: x11)" in text
    status["donor"].update(state="off", reason="no idle source works here", idle_source=None, idle_problem="no DISPLAY")
    assert "(idle source: no idle source (no DISPLAY))" in "\n".join(status_lines("10.0.0.2:7000", status))
