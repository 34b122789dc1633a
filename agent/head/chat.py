"""Tokenizer, chat template, stop tokens and streaming detokenization for a head."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agent.errors import PromptTooLongError


class ChatTokenizer:
    """The export's tokenizer, with the chat template and the ids that end a reply."""

    def __init__(self, tokenizer_dir: Path) -> None:
        from transformers import AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        self.stop_ids = self._stop_ids(tokenizer_dir)

    def _stop_ids(self, folder: Path) -> frozenset[int]:
        ids: set[int] = set()
        if self._tok.eos_token_id is not None:
            ids.add(int(self._tok.eos_token_id))
        gen = folder / "generation_config.json"
        if gen.is_file():
            eos = json.loads(gen.read_text()).get("eos_token_id")
            ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        # chat models end a turn with an end-of-turn marker that is not always the eos token
        for marker in ("<|im_end|>", "<|eot_id|>", "<|end|>", "</s>"):
            token_id = self._tok.convert_tokens_to_ids(marker)
            if isinstance(token_id, int) and token_id != self._tok.unk_token_id:
                ids.add(token_id)
        return frozenset(ids)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation with the generation prompt appended."""
        if self._tok.chat_template is None:
            text = "\n".join(m["content"] for m in messages)
            return list(self._tok(text)["input_ids"])
        encoded: Any = self._tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        ids = encoded["input_ids"] if hasattr(encoded, "keys") else encoded
        return [int(i) for i in ids]

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=True))


class TextStream:
    """Turns a growing list of token ids into text deltas, holding back incomplete characters."""

    def __init__(self, tokenizer: ChatTokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._emitted = 0

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        text = self._tokenizer.decode(self._ids)
        if text.endswith("\ufffd"):  # a multi-byte character split across tokens
            return ""
        delta, self._emitted = text[self._emitted :], len(text)
        return delta


def check_prompt(prompt_ids: list[int], max_tokens: int, context_tokens: int) -> None:
    """Refuse, before anything is sent, a prompt that is empty or leaves no room for the reply."""
    if not prompt_ids:
        raise PromptTooLongError("the prompt is empty")
    if len(prompt_ids) + max_tokens > context_tokens:
        raise PromptTooLongError(
            f"prompt of {len(prompt_ids)} tokens plus {max_tokens} new tokens exceeds the "
            f"{context_tokens}-token context; shorten the prompt or lower --max-tokens"
        )
