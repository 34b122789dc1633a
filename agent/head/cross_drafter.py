"""Drafting with a small model whose tokenizer is not the target's: the two meet in text.

The context (target ids) is decoded to text, special tokens kept, and encoded with the draft model's
tokenizer; the draft model continues it greedily; its text is encoded back into target ids. Chat models
that share a template markup (ChatML's ``<|im_start|>``, as SmolLM2 and Qwen2.5 do) see the same
conversation. Re-encoding the whole context each step is cheap next to a model step, and the draft
model's cache follows it by common prefix (``ModelDrafter``), so only the tail is fed again.

Drafts are greedy, hence a deterministic function of the context: speculative sampling may then treat
the proposal distribution as one-hot on the drafted token, and keeps the target's distribution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from agent.head.drafters import Draft
from agent.head.model_drafter import ModelDrafter


class TextTokenizer(Protocol):
    """What the bridge needs of a tokenizer: :class:`~agent.head.chat.ChatTokenizer` (a transformers
    tokenizer has the same two methods)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]:
        """Token ids of ``text``."""
        ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str:
        """The text of ``ids``."""
        ...


class TextBridge:
    """Maps a target-token context to the draft tokenizer's ids, and draft text back to target ids.

    ``overlap``: target tokens re-encoded together with the draft's text, so that a word the context
    ended in the middle of joins the draft's continuation as the target tokenizer would join it.
    """

    def __init__(self, target_tokenizer: TextTokenizer, draft_tokenizer: TextTokenizer, overlap: int = 4) -> None:
        self._target = target_tokenizer
        self._draft = draft_tokenizer
        self._overlap = overlap

    def to_draft(self, target_ids: Sequence[int]) -> list[int]:
        """The draft tokenizer's ids for the text of ``target_ids``."""
        text = self._target.decode(list(target_ids), skip_special_tokens=False)
        return list(self._draft.encode(text, add_special_tokens=False))

    def draft_text(self, draft_ids: Sequence[int]) -> str:
        """The text of the draft model's ``draft_ids``, special tokens kept."""
        return str(self._draft.decode(list(draft_ids), skip_special_tokens=False))

    def continuation(self, target_ids: Sequence[int], text: str) -> list[int]:
        """Target ids that continue ``target_ids`` with ``text``; empty where the boundary re-tokenizes
        differently (the last context tokens would have to change, which a draft cannot do)."""
        tail = list(target_ids[-self._overlap :]) if self._overlap else []
        joined = self._target.decode(tail, skip_special_tokens=False) + text
        ids = list(self._target.encode(joined, add_special_tokens=False))
        if ids[: len(tail)] != tail:
            return []
        return ids[len(tail) :]


class CrossTokenizerDrafter:
    """A draft model with its own tokenizer, drafting greedily for the target through a :class:`TextBridge`."""

    blocking = True
    drafts_cheaply = False
    stops_on_belief = True

    def __init__(self, model: ModelDrafter, bridge: TextBridge) -> None:
        """``model`` must draft greedily (see the module docstring)."""
        self._model = model
        self._bridge = bridge

    def propose(
        self, context: Sequence[int], k: int, min_belief: float = 0.0, stop: Callable[[], bool] | None = None
    ) -> Draft:
        """Up to ``k`` target tokens; the draft model stops early below ``min_belief`` or on ``stop`` (see
        ``ModelDrafter``)."""
        if k <= 0:
            return Draft([])
        drafted = self._model.propose(self._bridge.to_draft(context), k, min_belief, stop)
        ids = self._bridge.continuation(context, self._bridge.draft_text(drafted.tokens))
        # The draft's last token may end inside a word that the target spells differently: cut to k.
        return Draft(ids[:k])

    def commit(self, context_len_kept: int) -> None:
        """Nothing to do: the draft model's cache re-syncs with the next context by common prefix."""

    def reset(self) -> None:
        self._model.reset()
