"""The TUI against a real fleet: four agents in this process over mutual TLS with the int4 3-stage SmolLM2
export (real OpenVINO). Three hold the stages the plan gives them; the fourth, the user's PC, holds none and
heads the chat. The app polls the head's real status (the stage table fills in as the ring forms) and streams
a greedy answer through the head's chat endpoint: its text is exactly what ``agent.chat_client.client.ask`` gives.
It also reads each stage agent's own status, as ``shoal chat`` does: every row gets its layers from the plan,
and its step latency, sessions and memory from the agent serving it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import pytest

from agent.addresses import parse_address
from agent.chat_client.client import ask
from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatRequest
from agent.cli.status_link import StatusLink
from agent.fleet import NodeIdentity, init_fleet, issue_node
from discovery.fleet_document import ModelSource, serving
from tests.integration.test_self_forming import agent, plan_of, push
from tests.tui.fakes import until
from tui.app import ChatApp
from tui.generation import GenerationSettings
from tui.sources import EndpointChatSource, LinkPeerStatus, LinkStatusSource
from tui.store import ConversationStore

pytestmark = [pytest.mark.tui, pytest.mark.timeout(300)]

PROMPT = "What is the capital of France?"
MAX_TOKENS = 12


def test_the_tui_shows_the_ring_forming_and_streams_the_same_text_as_ask(
    exported: Callable[..., Path], cache_dir: Path, tmp_path: Path
) -> None:
    folder = exported(3, "int4")
    fleet_dir = tmp_path / "fleet"
    init_fleet(fleet_dir, "office")
    ids: dict[str, NodeIdentity] = {n: issue_node(fleet_dir, n) for n in ("alpha", "beta", "gamma", "pc", "admin")}
    chat_file = tmp_path / "chat.json"

    async def main() -> None:
        started = time.monotonic()
        async with AsyncExitStack() as stack:
            first = await stack.enter_async_context(agent(ids["alpha"], cache_dir, None))
            others = [await stack.enter_async_context(agent(ids[n], cache_dir, first)) for n in ("beta", "gamma")]
            head = await stack.enter_async_context(
                agent(ids["pc"], cache_dir, first, chat=("127.0.0.1", 0), chat_file=chat_file, offer_mb=0)
            )
            daemons = [first, *others, head]
            assert head.addresses is not None
            ring = head.addresses.ring

            async def connect() -> StatusLink:
                return await StatusLink.open(ring, ids["pc"], timeout=3.0)

            async def connect_peer(address: str) -> StatusLink:
                return await StatusLink.open(parse_address(address), ids["pc"], timeout=3.0)

            app = ChatApp(
                EndpointChatSource(chat_file),
                LinkStatusSource(connect),
                ConversationStore(tmp_path / "conversations.sqlite"),
                poll_seconds=0.2,
                peers=LinkPeerStatus(connect_peer),
            )
            async with app.run_test(size=(80, 24)) as pilot:
                await until(pilot, lambda: app.fleet.reachable, "the head's first status", timeout=20)
                assert "serves no model" in app.fleet.banner
                await push(
                    fleet_dir,
                    ids["admin"],
                    first,
                    lambda doc, now: serving(doc, ModelSource(export_dir=str(folder)), now),
                )
                await until(
                    pilot,
                    lambda: app.fleet.ready and all(plan_of(d).status().get("ready") for d in daemons),
                    "the ring ready, in the TUI and on every agent",
                    timeout=180,
                )
                print(f"the TUI saw the ring ready {time.monotonic() - started:.1f} s after the agents started")
                rows = app.fleet.stages
                assert [r.stage for r in rows] == [0, 1, 2]
                assert sorted(r.state.name for r in rows) == ["alpha", "beta", "gamma"]  # the PC holds none
                assert {r.state.text for r in rows} == {"ready"}
                assert app.fleet_view.stages.row_count == 3
                app.settings = GenerationSettings(max_tokens=MAX_TOKENS)  # greedy
                app.prompt.text = PROMPT
                await pilot.press("enter")
                await until(pilot, lambda: not app.streaming and app.thread.history != [], "the answer", timeout=60)
                shown = app.conversation.messages[-1]
                streamed = app.thread.history[-1][1]
                assert "tok/s" in str(shown.note) and "first token" in str(shown.note), shown.note
                # each stage's own figures, from the agent serving it: the answer's steps were timed there
                await until(
                    pilot,
                    lambda: all(r.load.step_ms and r.share is not None for r in app.fleet.stages),
                    "every stage's step latency",
                    timeout=20,
                )
                rows = app.fleet.stages
                spans = [r.layers for r in rows]
                assert app.fleet.layers == 30 and spans[0] is not None and spans[-1] is not None, spans
                assert spans[0][0] == 0 and spans[-1][1] == 30, spans  # the plan's stages cover the model
                assert all(r.load.device == "CPU" and (r.load.memory_mb or 0) > 0 for r in rows), rows
                assert sum(r.share or 0 for r in rows) == pytest.approx(1.0)

            endpoint = ChatEndpoint.load(chat_file)
            request = ChatRequest(token=endpoint.token, messages=(("user", PROMPT),), max_tokens=MAX_TOKENS)
            events = [event async for event in ask(endpoint, request)]
            assert events[-1].event == "done", events[-1]
            expected = "".join(e.text for e in events)  # the tokens' text and the done event's held-back end
            assert streamed == expected and shown.text == expected
            assert len(expected) > 10, expected

    asyncio.run(main())
