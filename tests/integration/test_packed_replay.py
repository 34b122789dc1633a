"""A stage lost in the middle of packed steps (issue 45, acceptance 4): its standby takes it over, the head replays
every session, and each answer is the one the undisturbed ring gave.

Real ``shoal agent`` processes on loopback, formed as the soak's fleet (``tests.support.soak_fleet``: three stages
of SmolLM2 int4, a warm standby, a spare, a head with the chat endpoint), every stage agent keeping its sessions'
KV in one paged pool (``--kv paged``) so that it packs the steps of the sessions decoding at once. Four chats
stream together; once each has its first tokens, the agent of the stage that has a standby is killed (``kill
-9``: no goodbye). Every chat ends whole, with the greedy tokens of the same four chats on the undisturbed ring.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agent.chat_client.client import ask
from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatRequest
from tests.support.soak_fleet import SPARE, STAGE_NODES, STANDBY, Member, SoakFleet

pytestmark = [pytest.mark.processes, pytest.mark.timeout(600)]

PROMPTS = (
    "Write a short story about a lighthouse keeper.",
    "Describe a walk through a forest in autumn.",
    "Tell me about the history of the bicycle.",
    "Explain how bread is baked, step by step.",
)
MAX_TOKENS = 32
KILL_AFTER = 4
"""Tokens every chat has streamed when the stage's agent is killed: all of them are mid-answer, their sessions
held by the stages' packs."""
PAGED = ("--kv", "paged")


class Chats:
    """The four chats streamed together through the head's chat endpoint, their tokens as they come."""

    def __init__(self, endpoint: ChatEndpoint) -> None:
        self.endpoint = endpoint
        self.tokens: list[list[int]] = [[] for _ in PROMPTS]
        self.ends: list[str] = ["" for _ in PROMPTS]
        self.replays: list[int] = [0 for _ in PROMPTS]
        """Fresh sessions each answer's history was replayed into (its ``done`` event's stats)."""

    async def one(self, index: int) -> None:
        request = ChatRequest(token=self.endpoint.token, messages=(("user", PROMPTS[index]),), max_tokens=MAX_TOKENS)
        async for event in ask(self.endpoint, request):
            if event.event == "token":
                self.tokens[index].append(int(event.id or 0))
            elif event.event == "done":
                self.ends[index], self.replays[index] = "done", int(event.stats.get("replays") or 0)
            elif event.event == "error":
                self.ends[index] = f"error {event.code}: {event.text}"

    async def all(self, timeout: float = 180.0) -> None:
        await asyncio.wait_for(asyncio.gather(*(self.one(i) for i in range(len(PROMPTS)))), timeout)


def test_a_stage_killed_mid_packed_decode_is_replayed_on_its_standby_and_every_answer_is_unchanged(
    exported: Callable[..., Path], cache_dir: Path, tmp_path: Path
) -> None:
    began = time.monotonic()
    fleet = SoakFleet(tmp_path, cache_dir, exported(3, "int4"))
    export_s = time.monotonic() - began
    # a member is started with the flags it was first given (SoakFleet.start), beside the fleet's own: given here,
    # before form(), every agent that may hold a stage keeps paged KV
    for name in (*STAGE_NODES, STANDBY):
        fleet.members[name] = Member(name, PAGED)
    fleet.members[SPARE] = Member(SPARE, ("--offer-mb", "0", *PAGED))
    try:
        began = time.monotonic()
        fleet.form(timeout=240)
        formed = time.monotonic() - began
        endpoint = ChatEndpoint.load(fleet.chat_file)

        began = time.monotonic()
        undisturbed = Chats(endpoint)
        asyncio.run(undisturbed.all())
        undisturbed_s = time.monotonic() - began
        assert undisturbed.ends == ["done"] * len(PROMPTS), undisturbed.ends
        assert undisturbed.replays == [0] * len(PROMPTS)
        assert all(len(t) > KILL_AFTER for t in undisturbed.tokens), "an answer ended before the kill could land"

        victim = asyncio.run(fleet.standing_by())
        assert victim is not None, "no stage had a standby"
        stage = asyncio.run(fleet.stage_holders()).index(victim)
        killed_at: list[int] = []
        victim_status: dict[str, Any] = {}

        async def disturbed() -> Chats:
            chats = Chats(endpoint)
            streaming = asyncio.ensure_future(chats.all())
            while min(len(t) for t in chats.tokens) < KILL_AFTER:
                assert not streaming.done(), chats.ends
                await asyncio.sleep(0.01)
            victim_status.update(await fleet.status(victim) or {})
            fleet.kill(victim)
            killed_at.extend(len(t) for t in chats.tokens)
            await streaming
            return chats

        started = time.monotonic()
        chats = asyncio.run(disturbed())
        took = time.monotonic() - started
        print(
            f"export {export_s:.1f} s, fleet formed in {formed:.1f} s, undisturbed answers in {undisturbed_s:.1f} s; "
            f"stage {stage}'s {victim} killed with {killed_at} tokens streamed, having packed "
            f"{victim_status.get('packed_steps')} steps in {victim_status.get('packs')} inferences; "
            f"answered in {took:.1f} s, replays {chats.replays}"
        )
        assert victim_status.get("packs", 0) < victim_status.get("packed_steps", 0), "the lost stage never packed"
        assert all(n < len(t) for n, t in zip(killed_at, undisturbed.tokens, strict=True)), "a chat had ended"
        assert chats.ends == ["done"] * len(PROMPTS), chats.ends
        assert all(n >= 1 for n in chats.replays), f"every session was held by the stage lost: {chats.replays}"
        assert chats.tokens == undisturbed.tokens
        assert asyncio.run(fleet.stage_holders())[stage] == STANDBY
        statuses = asyncio.run(fleet.statuses())
        for name in (*(n for n in STAGE_NODES if n != victim), STANDBY):
            status = statuses.get(name) or {}
            assert status.get("packs", 0) < status.get("packed_steps", 0), f"{name} never packed: {status}"
    finally:
        fleet.stop_all()
