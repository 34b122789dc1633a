"""Issue 40 §1: an answer marked exact is the same whether its question is asked on a fresh session, on the
kept session of the same question, or again once that session was evicted, on the default one-thread agent.

One 1-stage int4 agent, ``--threads 1``, the CPU's default precision: there a prompt's numbers depend on how
its positions are grouped into steps (40 positions in one step and 39 + 1 give other logits), and a kept
session used to compute only the last position of a repeated prompt, so the second answer differed from the
first, marked exact all the same. A kept session is now reused only up to a chunk boundary and the rest is
computed in the chunks a fresh prompt is (``agent.head.resumable``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.chat_client.client import ask
from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatEvent, ChatRequest
from agent.head.prefill import DEFAULT_PREFILL_CHUNK
from tests.integration.ring_lab import AgentProcess, Fleet, start_agent

pytestmark = pytest.mark.processes
LIGHTHOUSE = "Describe a lighthouse at night in three sentences."
LOG = "\n".join(f"{i:04d} worker-{i % 5} handled request {i * 37 % 1009} in {i % 13 + 2} ms" for i in range(40))
DOCUMENT = f"Summarise this log in one sentence:\n{LOG}"  # about 700 positions: a whole chunk of 512 and more


@pytest.fixture(scope="module")
def one_thread_agent(
    exported: Callable[..., Path], fleet: Fleet, cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[AgentProcess, ChatEndpoint]]:
    """One agent holding the whole int4 model on one thread, keeping one conversation at a time."""
    endpoint_file = tmp_path_factory.mktemp("kept-exact") / "chat.json"
    agent = start_agent(
        exported(1, "int4"),
        0,
        fleet.identity("kept-exact"),
        cache_dir,
        extra=[
            "--threads",
            "1",
            "--chat",
            "127.0.0.1:0",
            "--chat-file",
            str(endpoint_file),
            "--chat-keep",
            "600",
            "--chat-keep-max",
            "1",
        ],
    )
    yield agent, ChatEndpoint.load(endpoint_file)
    agent.stop()


def _answer(endpoint: ChatEndpoint, question: str, sampling: dict[str, float]) -> tuple[list[int], dict[str, object]]:
    request = ChatRequest(token=endpoint.token, messages=(("user", question),), max_tokens=48, **sampling)  # type: ignore[arg-type]

    async def go() -> list[ChatEvent]:
        return [event async for event in ask(endpoint, request)]

    events = asyncio.run(go())
    assert events[-1].event == "done" and events[-1].stats is not None, events[-1]
    return [e.id for e in events if e.event == "token" and e.id is not None], events[-1].stats


@pytest.mark.parametrize("question", [LIGHTHOUSE, DOCUMENT], ids=["short", "past-a-chunk"])
def test_an_exact_answer_is_the_same_fresh_on_a_kept_session_and_after_its_eviction(
    one_thread_agent: tuple[AgentProcess, ChatEndpoint], question: str
) -> None:
    agent, endpoint = one_thread_agent
    greedy: dict[str, float] = {}
    seeded: dict[str, float] = {"temperature": 0.9, "seed": 7}
    answers: dict[str, list[tuple[list[int], dict[str, object]]]] = {"greedy": [], "seeded": []}
    # one session is kept at a time: the other sampling's question evicts it
    for name, sampling in (("greedy", greedy), ("greedy", greedy), ("seeded", seeded), ("seeded", seeded)):
        answers[name].append(_answer(endpoint, question, sampling))
    for name, sampling in (("greedy", greedy), ("seeded", seeded)):
        answers[name].append(_answer(endpoint, question, sampling))
    for name, ((fresh, fresh_stats), (kept, kept_stats), (again, again_stats)) in answers.items():
        for stats in (fresh_stats, kept_stats, again_stats):
            assert stats["exact"] is True, (name, stats)
        assert kept == fresh, f"{name}: the kept session's answer differs from the fresh one's"
        assert again == fresh, f"{name}: the answer after the eviction differs from the fresh one's"
        assert fresh_stats["cached_tokens"] == 0 and again_stats["cached_tokens"] == 0, (fresh_stats, again_stats)
        prompt = int(fresh_stats["prompt_tokens"])  # type: ignore[call-overload]
        # one-thread stages compute a prompt's positions alike however its steps are cut: all but the last
        # position is reused, less one more where the last would be a step of its own (other kernels)
        assert kept_stats["cached_tokens"] == prompt - 2, kept_stats
        assert prompt - 2 > prompt // DEFAULT_PREFILL_CHUNK * DEFAULT_PREFILL_CHUNK  # more than the chunk grid gave
    assert agent.log_text().count("chat resumes a kept session") >= 2


def _chat(
    endpoint: ChatEndpoint, messages: tuple[tuple[str, str], ...], sampling: dict[str, float]
) -> tuple[list[int], str, dict[str, object]]:
    request = ChatRequest(token=endpoint.token, messages=messages, max_tokens=48, **sampling)  # type: ignore[arg-type]

    async def go() -> list[ChatEvent]:
        return [event async for event in ask(endpoint, request)]

    events = asyncio.run(go())
    assert events[-1].event == "done" and events[-1].stats is not None, events[-1]
    tokens = [e for e in events if e.event == "token" and e.id is not None]
    return [e.id for e in tokens if e.id is not None], "".join(e.text for e in tokens), events[-1].stats


def test_a_conversations_later_turns_are_the_same_on_its_kept_session_as_afresh(
    one_thread_agent: tuple[AgentProcess, ChatEndpoint],
) -> None:
    """Issue 40 §1, its follow-up: turns 2 and 3 of a conversation, greedy and seeded, on the kept session of
    the turn before (which reuses the earlier prompt, computed alike however its steps are cut, and computes the
    last answer and the new message) and afresh once another conversation evicted it: the same tokens."""
    _, endpoint = one_thread_agent
    for sampling in ({}, {"temperature": 0.9, "seed": 7}):
        messages: tuple[tuple[str, str], ...] = (("user", LIGHTHOUSE),)
        _, text, stats = _chat(endpoint, messages, sampling)
        earlier = int(stats["prompt_tokens"])  # type: ignore[call-overload]
        for follow_up in ("Now say it in one sentence.", "Which of those details matters most to a sailor?"):
            messages = (*messages, ("assistant", text), ("user", follow_up))
            kept, _, kept_stats = _chat(endpoint, messages, sampling)
            _chat(endpoint, (("user", "Say hello."),), sampling)  # one session is kept at a time: this evicts it
            afresh, text, afresh_stats = _chat(endpoint, messages, sampling)
            for stats in (kept_stats, afresh_stats):
                assert stats["exact"] is True, stats
            assert kept == afresh, f"{sampling}: a later turn on the kept session differs from the fresh one"
            assert afresh_stats["cached_tokens"] == 0, afresh_stats
            assert kept_stats["cached_tokens"] in (earlier, earlier - 1), (kept_stats, earlier)
            earlier = int(afresh_stats["prompt_tokens"])  # type: ignore[call-overload]
