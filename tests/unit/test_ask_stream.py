"""``shoal ask`` streams an answer's text to stdout, tells a long prompt's progress on stderr (once it has taken
a second), and returns the ``done`` event: a progress event never ends the answer."""

from __future__ import annotations

import asyncio
import io

import pytest

from agent.chat.endpoint import ChatEndpoint
from agent.chat.protocol import ChatEvent, ChatRequest
from agent.cli.ask_cmd import stream_chat

pytestmark = pytest.mark.fast

ANSWER = [
    ChatEvent.progress(512, 1536, 0.4),
    ChatEvent.progress(1024, 1536, 1.3),
    ChatEvent("token", id=1, text="Sum"),
    ChatEvent("token", id=2, text="mary."),
    ChatEvent("done", stats={"tokens": 2, "seconds": 2.0}),
]


def test_progress_goes_to_stderr_and_the_answer_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    async def main() -> ChatEvent:
        async def agent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readline()
            for event in ANSWER:
                writer.write(event.to_line())
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(agent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        endpoint = ChatEndpoint.new("127.0.0.1", port)
        out = io.StringIO()
        async with server:
            done = await stream_chat(endpoint, ChatRequest(token=endpoint.token, messages=(("user", "hi"),)), out)
        assert out.getvalue() == "Summary.\n"
        return done

    done = asyncio.run(main())
    assert done.event == "done" and done.stats["tokens"] == 2
    # the report at 0.4 s is left out: a prompt that goes in within a second needs no word
    assert capsys.readouterr().err == "[prompt: 1,024 of 1,536 positions in, 1.3 s]\n"
