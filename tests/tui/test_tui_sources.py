"""The real data sources with fake ends, and the ``shoal chat`` command's wiring."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatEvent, ChatRequest
from agent.cli.chat_cmd import identity_folder, peer_source, status_source
from agent.cli.main import main
from agent.errors import FleetError, PeerUnavailableError
from tui.generation import GenerationSettings
from tui.sources import EndpointChatSource, LinkPeerStatus, LinkStatusSource

pytestmark = pytest.mark.tui


def test_the_chat_source_reads_the_endpoint_at_each_answer_and_closes_the_stream_it_leaves(tmp_path: Path) -> None:
    endpoint_file = tmp_path / "chat.json"
    asked: list[ChatRequest] = []
    closed: list[bool] = []

    async def stream(endpoint: ChatEndpoint, request: ChatRequest) -> AsyncIterator[ChatEvent]:
        asked.append(request)
        try:
            for i in range(100):
                yield ChatEvent("token", id=i, text=f"{endpoint.port}:{i} ")
        finally:
            closed.append(True)

    source = EndpointChatSource(endpoint_file, stream)
    settings = GenerationSettings(temperature=0.5, top_p=0.9, max_tokens=7, seed=3)

    async def first_two() -> list[ChatEvent]:
        events = source.answer((("user", "hi"),), settings)
        got = [await anext(events), await anext(events)]
        await events.aclose()  # what Esc does (through a cancellation, or leaving the loop)
        return got

    missing = asyncio.run(_all(source.answer((("user", "hi"),), settings)))
    assert [(e.event, e.code) for e in missing] == [("error", "agent_unavailable")]
    assert "shoal agent" in missing[0].text and str(endpoint_file) in missing[0].text
    ChatEndpoint("127.0.0.1", 4001, "secret").write(endpoint_file)
    assert [e.text for e in asyncio.run(first_two())] == ["4001:0 ", "4001:1 "]
    assert closed == [True]
    ChatEndpoint("127.0.0.1", 4002, "new").write(endpoint_file)  # the agent restarted elsewhere
    assert asyncio.run(anext(source.answer((("user", "again"),), settings))).text == "4002:0 "
    first = asked[0]
    assert (first.token, first.messages, first.max_tokens, first.temperature, first.top_p, first.seed) == (
        "secret",
        (("user", "hi"),),
        7,
        0.5,
        0.9,
        3,
    )
    assert asked[1].token == "new"


async def _all(events: AsyncIterator[ChatEvent]) -> list[ChatEvent]:
    return [event async for event in events]


class FakeLink:
    def __init__(self, fail: bool) -> None:
        self.fail = fail
        self.closed = False

    async def get(self) -> dict[str, Any]:
        if self.fail:
            raise OSError("connection reset")
        return {"node": "pc"}

    async def close(self) -> None:
        self.closed = True


def test_the_status_source_keeps_one_link_and_dials_again_after_a_failure() -> None:
    links = [FakeLink(fail=False), FakeLink(fail=True), FakeLink(fail=False)]
    dialled: list[FakeLink] = []

    async def connect() -> FakeLink:
        if not links:
            raise PeerUnavailableError("cannot reach 127.0.0.1:7000")
        dialled.append(links.pop(0))
        return dialled[-1]

    async def main_() -> None:
        source = LinkStatusSource(connect)
        assert await source.get() == {"node": "pc"}
        assert await source.get() == {"node": "pc"}  # the same link
        assert len(dialled) == 1
        dialled[0].fail = True
        with pytest.raises(PeerUnavailableError, match="connection reset"):
            await source.get()
        assert dialled[0].closed
        with pytest.raises(PeerUnavailableError, match="connection reset"):
            await source.get()  # a new link, which fails too
        assert await source.get() == {"node": "pc"}
        assert len(dialled) == 3
        dialled[-1].fail = True
        with pytest.raises(PeerUnavailableError, match="connection reset"):
            await source.get()
        with pytest.raises(PeerUnavailableError, match="cannot reach"):  # the agent is gone: dialling fails
            await source.get()
        await source.close()

    asyncio.run(main_())


def test_the_chat_command_says_what_to_start_and_finds_an_identity_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["chat", "--data-dir", str(tmp_path)]) == 1
    error = capsys.readouterr().err
    assert f"{tmp_path / 'chat.json'} does not exist: start `shoal agent ... --chat 127.0.0.1:0`" in error
    named = tmp_path / "fleet" / "nodes" / "pc7"
    named.mkdir(parents=True)
    assert identity_folder("pc7", tmp_path) == named
    assert identity_folder(str(tmp_path / "elsewhere"), tmp_path) == tmp_path / "elsewhere"
    with pytest.raises(FleetError, match="pass --identity"):
        identity_folder(None, tmp_path / "empty")
    source = status_source("pc7", tmp_path)  # a folder without a certificate: the chat works, the fleet says why
    with pytest.raises(PeerUnavailableError, match="the fleet cannot be shown"):
        asyncio.run(source.get())
    assert peer_source("pc7", tmp_path) is None  # no identity to dial the stage agents with: their figures are unknown


def test_an_identity_no_agent_runs_with_is_told_to_be_the_one_of_the_agent_started_with_chat(tmp_path: Path) -> None:
    """The README's hand-wired ring issues ``me`` for ``shoal generate``; passed to ``shoal chat`` it names no
    running agent, and the fleet view says which identity it wants (issue 40 §7)."""
    from agent.fleet import init_fleet, issue_node

    init_fleet(tmp_path / "fleet", "ours")
    me = issue_node(tmp_path / "fleet", "me")
    with pytest.raises(PeerUnavailableError) as refused:
        asyncio.run(status_source("me", tmp_path).get())
    assert str(refused.value) == (
        f"no agent runs with the identity in {me.cert.parent}: --identity names the identity of this PC's agent, "
        f"the one started with --chat; or start `shoal agent --identity {me.cert.parent} --chat 127.0.0.1:0`"
    )


def test_the_peer_source_keeps_a_link_per_node_and_dials_a_node_again_at_its_new_address() -> None:
    dialled: list[tuple[str, FakeLink]] = []

    async def connect(address: str) -> FakeLink:
        if address.endswith(":9"):
            raise PeerUnavailableError(f"cannot reach {address}")
        dialled.append((address, FakeLink(fail=False)))
        return dialled[-1][1]

    async def main_() -> None:
        source = LinkPeerStatus(connect)
        assert await source.get("n1", "10.0.0.1:7100") == {"node": "pc"}
        assert await source.get("n2", "10.0.0.2:7100") == {"node": "pc"}
        assert await source.get("n1", "10.0.0.1:7100") == {"node": "pc"}
        assert [a for a, _ in dialled] == ["10.0.0.1:7100", "10.0.0.2:7100"]  # one link each, kept
        # n1 restarted on another port: its old link is closed and the new address dialled
        assert await source.get("n1", "10.0.0.1:7200") == {"node": "pc"}
        assert dialled[0][1].closed and [a for a, _ in dialled][-1] == "10.0.0.1:7200"
        with pytest.raises(PeerUnavailableError, match=r"cannot reach 10\.0\.0\.3:9"):
            await source.get("n3", "10.0.0.3:9")
        dialled[1][1].fail = True
        with pytest.raises(PeerUnavailableError, match="connection reset"):
            await source.get("n2", "10.0.0.2:7100")
        assert dialled[1][1].closed
        await source.close()
        assert all(link.closed for _, link in dialled)

    asyncio.run(main_())
