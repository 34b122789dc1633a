"""How many new tokens an answer may have, and how a prompt too long is refused (issue 40 §4)."""

from __future__ import annotations

import pytest

from agent.chat_client.protocol import ChatEvent, ChatRequest
from agent.errors import PromptTooLongError
from agent.head.chat import DEFAULT_MAX_TOKENS, check_prompt


def test_without_a_limit_the_answer_gets_the_default_or_the_room_left() -> None:
    assert check_prompt([1] * 100, None, 4096) == DEFAULT_MAX_TOKENS
    # the 3,962-token prompt: refused before, as 256 new tokens were added to it
    assert check_prompt([1] * 3962, None, 4096) == 134
    assert check_prompt([1] * 4095, None, 4096) == 1
    with pytest.raises(PromptTooLongError, match=r"prompt of 4096 tokens leaves no room .*; shorten the prompt$"):
        check_prompt([1] * 4096, None, 4096)


def test_a_limit_asked_for_is_kept_or_refused_naming_the_setting() -> None:
    assert check_prompt([1] * 3962, 134, 4096) == 134
    with pytest.raises(PromptTooLongError, match="lower --max-tokens to 134 or less") as refused:
        check_prompt([1] * 3962, 256, 4096)
    assert refused.value.lowering_helps
    assert refused.value.figures == {"prompt_tokens": 3962, "max_tokens": 256, "context_tokens": 4096}
    with pytest.raises(PromptTooLongError, match="lower max_tokens to 134 or less"):
        check_prompt([1] * 3962, 256, 4096, setting="max_tokens")
    with pytest.raises(PromptTooLongError, match="no room") as refused:
        check_prompt([1] * 5117, 16, 4096)
    assert not refused.value.lowering_helps
    with pytest.raises(PromptTooLongError, match="empty"):
        check_prompt([], None, 4096)


def test_a_request_may_leave_max_tokens_out_and_an_error_carries_its_figures() -> None:
    request = ChatRequest(token="t", messages=(("user", "hi"),))
    assert request.max_tokens is None and ChatRequest.from_line(request.to_line()) == request
    figures = {"prompt_tokens": 3962, "max_tokens": 256, "context_tokens": 4096}
    error = ChatEvent.error("prompt_too_long", "too long", "max_tokens", figures)
    assert ChatEvent.from_line(error.to_line()) == error
    plain = ChatEvent.error("fleet_busy", "busy")
    assert ChatEvent.from_line(plain.to_line()) == plain and b"stats" not in plain.to_line()
