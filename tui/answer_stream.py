"""An answer's events as the app's messages: the loop of the app's ``answer`` worker."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from textual.message import Message

from tui.events import AnswerDone, AnswerFailed, AnswerProgress, AnswerStopped, AnswerToken, AnswerTurn
from tui.sources import ChatSource, Clock

log = logging.getLogger(__name__)


async def stream_answer(chat: ChatSource, turn: AnswerTurn, clock: Clock, post: Callable[[Message], object]) -> None:
    """Ask ``chat`` for ``turn``'s answer and post each of its events (a token with the time it arrived, read here:
    the UI's own pace does not count); cancelled, it posts :class:`AnswerStopped` (closing the stream tells the
    agent to stop)."""
    events = chat.answer(turn.messages, turn.settings)
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                if event.event == "token":
                    post(AnswerToken(turn, event.text, clock()))
                elif event.event == "progress":
                    post(AnswerProgress(turn, event))
                elif event.event == "done":
                    post(AnswerDone(turn, event))
                    return
                else:
                    post(AnswerFailed(turn, f"{event.code}: {event.text}"))
                    return
        post(AnswerFailed(turn, "the answer ended without a done event"))
    except asyncio.CancelledError:
        post(AnswerStopped(turn))
        raise
    except Exception as exc:  # the UI's edge: whatever broke shows as a line, never as a traceback
        log.exception("the answer's stream failed")
        post(AnswerFailed(turn, f"the answer's stream failed: {exc}"))
