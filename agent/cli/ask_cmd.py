"""``shoal ask``: one answer from this PC's agent, which heads the conversation (``agent.chat``)."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import TextIO

from agent.chat.client import ask
from agent.chat.endpoint import ChatEndpoint
from agent.chat.protocol import ChatEvent, ChatRequest
from shards.errors import ShoalError


class ChatAnswerError(ShoalError):
    """The agent answered a chat with an error event."""


def run_ask(args: argparse.Namespace, data_dir: Path) -> int:
    endpoint = ChatEndpoint.load(args.chat_file or data_dir / "chat.json")
    messages = ((("system", args.system),) if args.system else ()) + (("user", args.prompt),)
    request = ChatRequest(token=endpoint.token, messages=messages, max_tokens=args.max_tokens,
                          temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)
    done = asyncio.run(stream_chat(endpoint, request))
    stats = done.stats
    print(f"[{stats['tokens']} tokens in {stats['seconds']:.2f} s, {stats['steps']} steps, "
          f"{stats['accepted']} of {stats['drafted']} drafted tokens accepted]", file=sys.stderr)
    return 0


async def stream_chat(endpoint: ChatEndpoint, request: ChatRequest, out: TextIO = sys.stdout) -> ChatEvent:
    """Write the answer's text to ``out`` as it comes; returns the ``done`` event, raises on an error."""
    async for event in ask(endpoint, request):
        if event.event == "token":
            out.write(event.text)
            out.flush()
        elif event.event == "error":
            out.write("\n")
            raise ChatAnswerError(f"{event.code}: {event.text}")
        else:
            out.write("\n")
            out.flush()
            return event
    raise ChatAnswerError("the answer ended without a done event")  # ask() always ends in done or error
