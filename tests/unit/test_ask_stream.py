"""``shoal ask`` streams an answer's text to stdout, tells a long prompt's progress on stderr (once it has taken
a second), and returns the ``done`` event: a progress event never ends the answer."""

from __future__ import annotations

import asyncio
import io

import pytest

from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatEvent, ChatRequest
from agent.cli.ask_cmd import stream_chat
from agent.errors import ShoalError
from tests.support.stream_server import serving

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

        out = io.StringIO()
        async with serving(agent) as port:
            endpoint = ChatEndpoint.new("127.0.0.1", port)
            done = await stream_chat(endpoint, ChatRequest(token=endpoint.token, messages=(("user", "hi"),)), out)
        assert out.getvalue() == "Summary.\n"
        return done

    done = asyncio.run(main())
    assert done.event == "done" and done.stats["tokens"] == 2
    # the report at 0.4 s is left out: a prompt that goes in within a second needs no word
    assert capsys.readouterr().err == "[prompt: 1,024 of 1,536 positions in, 1.3 s]\n"


class _Watched(io.StringIO):
    """An output that tells when the answer's first text arrived."""

    def __init__(self) -> None:
        super().__init__()
        self.written = asyncio.Event()

    def write(self, text: str) -> int:
        self.written.set()
        return super().write(text)


@pytest.mark.parametrize("cut", ["ctrl-c", "connection lost", "error event"])
def test_an_answer_cut_short_ends_its_line(cut: str) -> None:
    """Ctrl-C (the task cancelled, as ``asyncio.run`` does on SIGINT), a lost agent or an error mid-answer: the
    partial answer's line ends, so ``shoal: interrupted`` (or the error) starts a line of its own (issue 40 §7)."""

    async def main() -> str:
        async def agent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readline()
            writer.write(ChatEvent("token", id=1, text="Half an ans").to_line())
            if cut == "error event":
                writer.write(ChatEvent("error", code="failed", text="a stage failed").to_line())
            await writer.drain()
            if cut == "ctrl-c":
                await asyncio.sleep(30)
            writer.close()

        out = _Watched()
        async with serving(agent) as port:
            endpoint = ChatEndpoint.new("127.0.0.1", port)
            request = ChatRequest(token=endpoint.token, messages=(("user", "hi"),))
            answering = asyncio.ensure_future(stream_chat(endpoint, request, out))
            if cut == "ctrl-c":
                await out.written.wait()
                answering.cancel()
            with pytest.raises((asyncio.CancelledError, ShoalError)):
                await answering
        return out.getvalue()

    assert asyncio.run(main()) == "Half an ans\n"
