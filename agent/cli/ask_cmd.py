"""``shoal ask``: answers from this PC's agent, which heads the conversation (``agent.chat``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import sys
import time
from pathlib import Path
from typing import TextIO

from agent.chat_client.client import ask, progress_line
from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatEvent, ChatRequest
from agent.cli.common import Subcommands
from agent.errors import ChatAnswerError, PromptTooLongError


def add_parser(sub: Subcommands) -> None:
    """Register ``shoal ask``."""
    p = sub.add_parser("ask", help="ask this PC's agent (started with --chat) for an answer, streamed")
    p.add_argument(
        "prompt", nargs="?", default=None, help="the question; without it, a conversation: one turn per line of stdin"
    )
    p.add_argument(
        "--chat-file", type=Path, default=None, help="the agent's chat endpoint file (default: <data dir>/chat.json)"
    )
    p.add_argument("--system", default=None, help="a system message before the prompt")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="the longest answer, in tokens (default: 256, or what the context leaves after the prompt if less)",
    )
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument(
        "--stop", action="append", default=[], metavar="TEXT", help="text that ends the answer (repeatable, up to 4)"
    )


def run_ask(args: argparse.Namespace, data_dir: Path) -> int:
    """One answer to PROMPT, or, without one, a conversation: each line of stdin is the user's next turn,
    sent with every earlier turn and answer (the agent keeps nothing between requests)."""
    endpoint = _endpoint(args.chat_file or data_dir / "chat.json")
    history: tuple[tuple[str, str], ...] = (("system", args.system),) if args.system else ()
    if args.prompt is not None:
        _turn(endpoint, args, (*history, ("user", args.prompt)), sys.stdout)
        return 0
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            return 0
        if not line.strip():
            continue
        asked = (*history, ("user", line.rstrip("\n")))
        answer = io.StringIO()
        try:
            _turn(endpoint, args, asked, _Tee(sys.stdout, answer))
        except ChatAnswerError as exc:  # this turn is lost, the conversation goes on without it
            print(f"shoal: error: {exc}", file=sys.stderr)
            continue
        history = (*asked, ("assistant", answer.getvalue().rstrip("\n")))


ENDPOINT_WAIT_SECONDS = 20.0
"""How long ``shoal ask`` waits for an agent still starting (its endpoint file not yet written): a user who
pastes the README's block starts the agent in the background and asks at once."""


def _endpoint(path: Path) -> ChatEndpoint:
    deadline = time.monotonic() + ENDPOINT_WAIT_SECONDS
    if not path.exists():
        print(f"[waiting up to {ENDPOINT_WAIT_SECONDS:.0f} s for the agent to write {path}]", file=sys.stderr)
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    return ChatEndpoint.load(path)


def _turn(
    endpoint: ChatEndpoint, args: argparse.Namespace, messages: tuple[tuple[str, str], ...], out: TextIO | _Tee
) -> None:
    request = ChatRequest(
        token=endpoint.token,
        messages=messages,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
        stop=tuple(args.stop),
    )
    print(f"[{answer_summary(asyncio.run(stream_chat(endpoint, request, out)))}]", file=sys.stderr)


PROGRESS_AFTER_SECONDS = 1.0
"""A prompt's progress is told once it has taken this long."""


def answer_summary(done: ChatEvent) -> str:
    """What an answer's ``done`` event says, in one line."""
    stats = done.stats
    rate = stats["tokens"] / max(stats["seconds"], 1e-9)
    line = (
        f"{stats['tokens']} tokens in {stats['seconds']:.2f} s, {rate:.1f} tok/s, {stats['steps']} steps, "
        f"{stats['accepted']} of {stats['drafted']} drafted tokens accepted"
    )
    if stats.get("cached_tokens"):
        line += f", {stats['cached_tokens']} of {stats['prompt_tokens']} prompt tokens kept from the last turn"
    if stats.get("replays"):
        line += f", the ring lost and its session replayed {stats['replays']} time(s)"
        line += "".join(f"; {cause}" for cause in stats.get("interruptions", []))
    if stats.get("exact") is False:
        line += "; not exact: asked again, it may get other tokens (see `shoal status`)"
    return line


class _Tee(io.TextIOBase):
    """Writes to the terminal and keeps a copy (the answer goes into the conversation's history)."""

    def __init__(self, *outs: TextIO) -> None:
        self._outs = outs

    def write(self, text: str) -> int:
        for out in self._outs:
            out.write(text)
        return len(text)

    def flush(self) -> None:
        for out in self._outs:
            out.flush()


async def stream_chat(endpoint: ChatEndpoint, request: ChatRequest, out: TextIO | _Tee = sys.stdout) -> ChatEvent:
    """Write the answer's text to ``out`` as it comes; returns the ``done`` event, raises on an error.

    An answer cut short (an error, Ctrl-C, a lost connection) still ends its line, so that what is said next on
    the terminal (``shoal: interrupted``) starts a line of its own."""
    mid_line = False
    try:
        # closed on the way out, returning or raising mid-answer: left to the collector, the generator would
        # hold the connection until the loop's finalizer hook ran its aclose()
        async with contextlib.aclosing(ask(endpoint, request)) as events:
            async for event in events:
                if event.event == "token":
                    out.write(event.text)
                    out.flush()
                    mid_line = not event.text.endswith("\n") if event.text else mid_line
                elif event.event == "error":
                    raise ChatAnswerError(f"{event.code}: {_in_cli_terms(event)}")
                elif event.event == "progress":
                    if event.stats["seconds"] >= PROGRESS_AFTER_SECONDS:  # a short prompt goes in without a word
                        print(f"[{progress_line(event)}]", file=sys.stderr, flush=True)
                else:
                    out.write(event.text + "\n")  # the end of the text, held back while it might have begun a stop
                    out.flush()
                    return event
            raise ChatAnswerError("the answer ended without a done event")  # ask() always ends in done or error
    except BaseException:  # Ctrl-C reaches here as the task's cancellation
        if mid_line:
            out.write("\n")
            out.flush()
        raise


def _in_cli_terms(error: ChatEvent) -> str:
    """An error event's text, a prompt too long for the context worded with this command's ``--max-tokens``."""
    figures = error.stats
    if error.code != "prompt_too_long" or not all(
        isinstance(figures.get(name), int) for name in ("prompt_tokens", "context_tokens")
    ):
        return error.text
    asked = figures.get("max_tokens")
    max_tokens = asked if isinstance(asked, int) else None
    return str(PromptTooLongError.of(figures["prompt_tokens"], max_tokens, figures["context_tokens"], "--max-tokens"))
