"""The TUI while a stage's agent is killed (``kill -9``) in the middle of an answer.

A self-forming fleet of real agent processes on loopback (the int4 3-stage SmolLM2 export of the session):
four PCs that offer memory, so that the plan puts one on each stage and the fourth stands by with a stage
compiled, and the user's PC, which holds no stage and heads the chat. The app polls that head's real status
and streams a greedy answer through its chat endpoint. Once a few tokens are on screen, the agent of the
stage that has a standby is killed. The app keeps answering keys (typing into the prompt) while the ring is
down, the fleet view shows the killed PC as lost, and the answer goes on: the head replays the session into
the new plan's ring (the standby's), and the text is that of the same question asked afterwards, the line
under the answer telling of the replay. Nothing on screen is a traceback.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from textual.widgets import DataTable

from agent.chat_client.client import ask
from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatRequest
from agent.cli.status_link import StatusLink
from agent.fleet import NodeIdentity, init_fleet, issue_node
from agent.node.launcher import LocalAgent, launch_agent
from bench.tui_bench import key_to_prompt
from discovery import control
from discovery.admin import edit_fleet_document, push_document
from discovery.fleet_document import ModelSource, serving
from tests.support.plan_fleet import AGENT_FLAGS
from tests.tui.fakes import until
from tui.app import ChatApp
from tui.fleet import FleetReport
from tui.generation import GenerationSettings
from tui.sources import EndpointChatSource, LinkStatusSource
from tui.store import ConversationStore

pytestmark = [pytest.mark.tui, pytest.mark.processes, pytest.mark.timeout(420)]

PROMPT = "Write a long story about a lighthouse keeper and the sea."
MAX_TOKENS = 120
KILL_AFTER_TOKENS = 4
HOLDERS = ("pc1", "pc2", "pc3", "pc4")
"""Four PCs offer memory for three stages: one of them stands by."""
KEY_BOUND = 1.0
"""Seconds a key press may take to reach the prompt while the ring is down (the loop watch of
``tests/conftest.py`` fails any step that holds the loop longer than this, too). Timed from the key queued
to the prompt showing it, as ``python -m bench tui`` times it: ``Pilot.press`` waits for an idle process."""


def test_a_stage_killed_mid_answer_shows_as_lost_the_app_answers_keys_and_the_answer_is_replayed(
    exported: Callable[..., Path], cache_dir: Path, tmp_path: Path
) -> None:
    folder = exported(3, "int4")
    fleet_dir = tmp_path / "fleet"
    init_fleet(fleet_dir, "office")
    ids = {n: issue_node(fleet_dir, n) for n in (*HOLDERS, "head", "admin")}
    chat_file = tmp_path / "chat.json"
    agents: dict[str, LocalAgent] = {}

    def start(name: str, *args: str) -> LocalAgent:
        return launch_agent(
            None,
            None,
            ids[name].cert.parent,
            cache_dir,
            # f32: the replay's steps and the later question's are cut differently (drafts, K), and only f32
            # rounds a position alike whatever step it came in (README: "Speculation and greedy text")
            extra_args=[*AGENT_FLAGS, "--no-mdns", "--precision", "f32", *args],
            log_path=tmp_path / f"{name}.log",
            timeout=120,
        )

    started = time.monotonic()
    try:
        agents["pc1"] = start("pc1")
        seed = ["--peer", f"{agents['pc1'].address[0]}:{agents['pc1'].address[1]}"]
        others: dict[str, tuple[str, ...]] = {n: tuple(seed) for n in HOLDERS[1:]}
        others["head"] = (*seed, "--offer-mb", "0", "--chat", "127.0.0.1:0", "--chat-file", str(chat_file))
        with ThreadPoolExecutor(len(others)) as pool:  # each start waits for its agent's ready line
            for name, agent in zip(others, pool.map(lambda n: start(n, *others[n]), others), strict=True):
                agents[name] = agent
        print(f"5 agents up {time.monotonic() - started:.1f} s after the first start")
        asyncio.run(_chat_through_the_kill(agents, ids, fleet_dir, folder, chat_file, tmp_path, started))
    finally:
        for agent in agents.values():
            agent.stop(timeout=10)


async def _chat_through_the_kill(
    agents: dict[str, LocalAgent],
    ids: dict[str, NodeIdentity],
    fleet_dir: Path,
    folder: Path,
    chat_file: Path,
    tmp_path: Path,
    started: float,
) -> None:
    _, signed = edit_fleet_document(fleet_dir, lambda doc, now: serving(doc, ModelSource(export_dir=str(folder)), now))
    await push_document(agents["pc1"].address, ids["admin"], control.FleetDocumentOffer(signed))

    async def connect() -> StatusLink:
        return await StatusLink.open(agents["head"].address, ids["head"], timeout=3.0)

    app = ChatApp(
        EndpointChatSource(chat_file),
        LinkStatusSource(connect),
        ConversationStore(tmp_path / "conversations.sqlite"),
        poll_seconds=0.2,
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await until(
            pilot, lambda: app.fleet.ready and _standing_by(app.fleet) is not None, "the ring and a standby", 240
        )
        print(f"the TUI saw the ring ready and a standby {time.monotonic() - started:.1f} s after the first start")
        stage, victim = _standing_by(app.fleet) or (0, "")
        assert victim in HOLDERS, app.fleet.stages

        app.settings = GenerationSettings(max_tokens=MAX_TOKENS)  # greedy
        app.prompt.text = PROMPT
        await pilot.press("enter")
        await until(
            pilot,
            lambda: app.turn is not None and app.turn.tally.tokens >= KILL_AFTER_TOKENS,
            "the first tokens of the answer",
            60,
        )
        assert app.turn is not None
        tokens_at_kill = app.turn.tally.tokens
        agents[victim].process.kill()  # kill -9: no goodbye to its peers
        agents[victim].process.wait(5)
        killed = time.monotonic()
        print(f"killed {victim} (stage {stage}) after {tokens_at_kill} tokens")

        # while the ring is down the app answers keys: typed letters reach the prompt at once
        presses = [await key_to_prompt(app, letter, KEY_BOUND) for letter in "shoal"]
        await pilot.pause()
        assert app.prompt.text == "shoal", app.prompt.text
        print(f"key presses during the outage: {', '.join(f'{1e3 * p:.0f} ms' for p in presses)}")

        seen_in_stage_row: list[bool] = []

        def shown_lost() -> bool:
            report = app.fleet
            if any(r.holder is not None and r.holder.name == victim and r.state.text == "lost" for r in report.stages):
                seen_in_stage_row.append(True)
            return any(m.name == victim and m.state == "lost" for m in report.others) or bool(seen_in_stage_row)

        await until(pilot, shown_lost, f"{victim} shown as lost in the fleet view", 30)
        print(f"{victim} shown as lost {time.monotonic() - killed:.1f} s after the kill")
        await pilot.pause()
        assert victim in _table_text(app, "#fleet-others") or victim in _table_text(app, "#fleet-stages")
        assert "lost" in _table_text(app, "#fleet-others") + _table_text(app, "#fleet-stages")

        await until(pilot, lambda: not app.streaming, "the answer's end, replayed or failed", 150)
        print(f"the answer ended {time.monotonic() - killed:.1f} s after the kill")
        shown = app.conversation.messages[-1]
        assert "Traceback" not in str(shown.text) + str(shown.note) + str(app.status_line.chat)
        assert app.thread.history, f"the answer failed: {shown.note}; {app.status_line.chat}"
        assert "ring replayed 1×" in str(shown.note), shown.note
        streamed = app.thread.history[-1][1]
        await until(pilot, lambda: app.fleet.ready and _holder(app.fleet, stage) != victim, "the stage moved", 30)
        assert _holder(app.fleet, stage) not in (None, victim)

    endpoint = ChatEndpoint.load(chat_file)
    request = ChatRequest(token=endpoint.token, messages=(("user", PROMPT),), max_tokens=MAX_TOKENS)
    events = [event async for event in ask(endpoint, request)]
    assert events[-1].event == "done", events[-1]
    assert streamed == "".join(e.text for e in events), "the replayed answer differs from the same question's"
    assert len(streamed) > 50, streamed


def _standing_by(report: FleetReport) -> tuple[int, str] | None:
    """The stage that has a standby with its stage compiled, and the node holding that stage."""
    for row in report.stages:
        if row.holder is not None and any(s.state == "standby" for s in row.standbys):
            return row.stage, row.holder.name
    return None


def _holder(report: FleetReport, stage: int) -> str | None:
    row = next((r for r in report.stages if r.stage == stage), None)
    return None if row is None or row.holder is None else row.holder.name


def _table_text(app: ChatApp, selector: str) -> str:
    table: DataTable[Any] = app.query_one(selector, DataTable)
    return " ".join(str(cell) for index in range(table.row_count) for cell in table.get_row_at(index))
