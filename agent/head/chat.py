"""Tokenizer, chat template, stop tokens and streaming detokenization for a head.

The export's tokenizer folder is what transformers' ``save_pretrained`` wrote: ``tokenizer.json``,
``tokenizer_config.json`` (special tokens, and the chat template unless ``chat_template.jinja`` holds it)
and ``generation_config.json``. A donor reads it with the ``tokenizers`` library and renders the template
with jinja2, without transformers; the token ids are the ones ``AutoTokenizer`` gives for the folder,
because the little transformers does on top of ``tokenizers`` for such a folder (a
``PreTrainedTokenizerFast``) is repeated here: the special tokens of the config that ``tokenizer.json``
lacks are added, ``split_special_tokens`` and ``clean_up_tokenization_spaces`` are honoured, truncation and
padding are off.

One thing differs from transformers on purpose: what a message's content says stays text. A user who pastes
``<|im_end|>\n<|im_start|>system`` into a message gets those characters encoded as plain text, not as the
markers that would open a system turn of their own; the template's own markers are the only control tokens
(``ChatTokenizer.encode_chat``). Conversations that spell no special token get transformers' ids.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, TypeAlias

from tokenizers import AddedToken, Tokenizer

from agent.errors import ChatProtocolError, ConfigError, PromptTooLongError
from agent.head.chat_template import ChatTemplate, Span, find_template

NAMED_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
"""transformers' named special tokens, in its order (the order new tokens get their ids in)."""

END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<|end|>", "</s>")
"""Chat models end a turn with a marker that is not always the eos token."""

_ADDED_TOKEN_FIELDS = ("single_word", "lstrip", "rstrip", "normalized", "special")

_OFFSET_MARK = "\U0010fffd\U000ffffd"
"""An added token of the plain-text copy of a tokenizer (private-use characters), put before a piece of text
that is encoded on its own, so that the piece is encoded as the rest of its text would be: some
pre-tokenizers (SentencePiece's "first" metaspace) treat the text's first character differently."""

SpecialToken: TypeAlias = AddedToken | str


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; empty if the file is absent (transformers treats it so)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: not a readable JSON file ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object")
    return data


def _token(value: Any, special: bool | None = None) -> SpecialToken | None:
    """A special token as a config spells it: a string, or a serialized AddedToken (a dict with a
    ``content``); None for anything else."""
    if isinstance(value, AddedToken | str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        fields = {k: bool(value[k]) for k in _ADDED_TOKEN_FIELDS if k in value}
        if special is not None:
            fields["special"] = special
        return AddedToken(value["content"], **fields)
    return None


class _SpecialTokens:
    """The special tokens a tokenizer folder declares, read as transformers reads them."""

    def __init__(self, folder: Path, config: dict[str, Any]) -> None:
        config = dict(config)
        declared = config.get("added_tokens_decoder")
        if isinstance(declared, dict):
            self.declared = [
                t
                for _, v in sorted(declared.items(), key=lambda kv: int(kv[0]))
                if isinstance(t := _token(v), AddedToken)
            ]
        else:
            # a folder without added_tokens_decoder is of the older layout: special_tokens_map.json wins
            self.declared = []
            for key, value in _read_json(folder / "special_tokens_map.json").items():
                if key in ("extra_special_tokens", "additional_special_tokens") and isinstance(value, list):
                    config[key] = list(config.get(key) or []) + [t for v in value if (t := _token(v, True)) is not None]
                elif (token := _token(value, special=True)) is not None:
                    config[key] = token
        by_content = {str(t): t for t in self.declared}
        self.named = {
            k: by_content.get(str(t), t) for k in NAMED_SPECIAL_TOKENS if (t := _token(config.get(k))) is not None
        }
        # model-specific tokens (``eot_token``, ``image_token``...): any other *_token key; transformers takes
        # the serialized ones first, then the strings and a dict-valued extra_special_tokens
        others = [(k, v) for k, v in config.items() if k.endswith("_token") and k not in NAMED_SPECIAL_TOKENS]
        extra = config.get("extra_special_tokens", config.get("additional_special_tokens"))
        if isinstance(extra, dict):
            others += list(extra.items())
            extra = None
        self.model_specific = {
            k: t for k, v in sorted(others, key=lambda kv: isinstance(kv[1], str)) if (t := _token(v)) is not None
        }
        self.extra = [t for v in extra if (t := _token(v)) is not None] if isinstance(extra, list) else []

    def template_variables(self) -> dict[str, str]:
        """What a chat template sees of them (``bos_token``, ``eos_token``...): their text."""
        return {k: str(t) for k, t in {**self.named, **self.model_specific}.items()}

    def add_missing(self, tokenizer: Tokenizer) -> None:
        """Add what ``tokenizer.json`` lacks, as transformers does on load: the config's declared added tokens,
        and the special tokens that are not added tokens yet (a special token only in the vocabulary would
        otherwise go through the pre-tokenizer like text, and survive ``skip_special_tokens``)."""
        present = {str(t) for t in tokenizer.get_added_tokens_decoder().values()}
        wanted: list[SpecialToken] = list(self.declared)
        seen = present | {str(t) for t in wanted}
        for token in [*self.named.values(), *self.model_specific.values(), *self.extra]:
            if str(token) not in seen:
                seen.add(str(token))
                wanted.append(token)
        named = {str(t) for t in [*self.named.values(), *self.model_specific.values()]}
        tokens: list[AddedToken] = []
        for token in wanted:
            if isinstance(token, str):
                token = AddedToken(token, special=True)
            elif not token.special and str(token) in named:
                token.special = True
            tokens.append(token)
        if tokens:
            tokenizer.add_tokens(tokens)


class ChatTokenizer:
    """The export's tokenizer, with the chat template and the ids that end a reply."""

    def __init__(self, tokenizer_dir: Path) -> None:
        path = tokenizer_dir / "tokenizer.json"
        if not path.is_file():
            raise ConfigError(f"{tokenizer_dir}: no tokenizer.json (is this an export's tokenizer folder?)")
        config = _read_json(tokenizer_dir / "tokenizer_config.json")
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
            raise ConfigError(f"{path}: not a tokenizers file ({exc})") from exc
        # transformers turns off what tokenizer.json may have switched on, for a call without truncation/padding
        self._tok.no_truncation()
        self._tok.no_padding()
        self._tok.encode_special_tokens = bool(config.get("split_special_tokens", False))
        specials = _SpecialTokens(tokenizer_dir, config)
        specials.add_missing(self._tok)
        self._clean_up = bool(config.get("clean_up_tokenization_spaces", False))
        source = find_template(tokenizer_dir, config)
        self._template = None if source is None else ChatTemplate(source, specials.template_variables(), tokenizer_dir)
        matched = {} if self._tok.encode_special_tokens else self._tok.get_added_tokens_decoder()
        self._special_text = {i: str(t) for i, t in matched.items() if t.special and str(t)}
        texts = sorted(set(self._special_text.values()), key=len, reverse=True)
        self._special_texts = re.compile("|".join(map(re.escape, texts))) if texts else None
        """The special tokens that text would be encoded to; None: text never is (``split_special_tokens``)."""
        unk = specials.named.get("unk_token")
        self._unk_id = None if unk is None else self._tok.token_to_id(str(unk))
        self.stop_ids = self._stop_ids(tokenizer_dir, specials.named.get("eos_token"))

    def _stop_ids(self, folder: Path, eos: SpecialToken | None) -> frozenset[int]:
        ids: set[int] = set()
        if eos is not None:
            # transformers' eos_token_id: the token's id, else the unknown token's
            eos_id = self._tok.token_to_id(str(eos))
            eos_id = self._unk_id if eos_id is None else eos_id
            if eos_id is not None:
                ids.add(eos_id)
        gen_eos = _read_json(folder / "generation_config.json").get("eos_token_id")
        ids.update(int(i) for i in (gen_eos if isinstance(gen_eos, list) else [] if gen_eos is None else [gen_eos]))
        for marker in END_OF_TURN_MARKERS:
            token_id = self._tok.token_to_id(marker)
            if token_id is not None and token_id != self._unk_id:
                ids.add(token_id)
        return frozenset(ids)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        """Token ids of a conversation with the generation prompt appended.

        The messages' contents are text: a special token's text written in one is encoded as the plain text
        it is, and the only special tokens are those the template writes. Without a chat template, the
        contents joined by newlines, with the tokenizer's own special tokens (its post-processor adds BOS
        where the model expects it). A template that refuses the conversation raises
        :class:`~agent.errors.ChatProtocolError`."""
        if self._template is None:
            text = "\n".join(m["content"] for m in messages)
            if self._special_texts is None or not self._special_texts.search(text):
                return self.encode(text, add_special_tokens=True)
            return list(self._plain.encode(text, add_special_tokens=True).ids)
        if self._special_texts is None:
            # the template writes the special tokens itself: as apply_chat_template, add none
            return self.encode(self._template.render(messages), add_special_tokens=False)
        text, literal = self._template.render_marking(messages, self._special_texts)
        if not literal:
            return self.encode(text, add_special_tokens=False)
        return self._encode_keeping_text(text, literal)

    def _encode_keeping_text(self, text: str, literal: list[Span]) -> list[int]:
        """Token ids of ``text`` where a special token matched over a ``literal`` span is text after all.

        The text is encoded once as it always is; the stretches between two of the template's markers that
        hold such a match are encoded again as plain text (no special token matched), each as it would be
        in its place, and their ids replace that stretch's."""
        encoding = self._tok.encode(text, add_special_tokens=False)
        ids, offsets = encoding.ids, encoding.offsets

        def matched(index: int) -> bool:
            # a special token matched in the text (an lstrip/rstrip one spans its spaces too), not the
            # unknown token that the model made of a character it lacks
            special = self._special_text.get(ids[index])
            return special is not None and special in text[slice(*offsets[index])]

        def written_by_content(index: int) -> bool:
            start, end = offsets[index]
            return any(start < stop and begin < end for begin, stop in literal)

        markers = [i for i in range(len(ids)) if matched(i) and not written_by_content(i)]
        out: list[int] = []
        previous = -1
        for marker in [*markers, len(ids)]:
            stretch = ids[previous + 1 : marker]
            if any(matched(i) for i in range(previous + 1, marker)):
                start = offsets[previous][1] if previous >= 0 else 0
                stop = offsets[marker][0] if marker < len(ids) else len(text)
                stretch = self._plain_ids(text[start:stop], first=start == 0)
            out += stretch
            if marker < len(ids):
                out.append(ids[marker])
            previous = marker
        return out

    def _plain_ids(self, text: str, first: bool) -> list[int]:
        """Ids of ``text`` with no special token matched; ``first``: it starts its prompt (else it follows a
        marker, as :data:`_OFFSET_MARK` tells the pre-tokenizer; a text that holds the mark goes without)."""
        if first or _OFFSET_MARK in text:
            return list(self._plain.encode(text, add_special_tokens=False).ids)
        return list(self._plain.encode(_OFFSET_MARK + text, add_special_tokens=False).ids[1:])

    @functools.cached_property
    def _plain(self) -> Tokenizer:
        """A copy of the tokenizer that matches no special token in text (the first prompt whose contents
        spell one makes it)."""
        plain = Tokenizer.from_str(self._tok.to_str())
        plain.no_truncation()
        plain.no_padding()
        plain.encode_special_tokens = True
        plain.add_tokens([AddedToken(_OFFSET_MARK, special=False, normalized=False)])
        return plain

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of plain ``text`` (special tokens written in it are matched as such, unless the folder sets
        ``split_special_tokens``)."""
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """The text of ``ids``, as transformers' ``decode`` gives it (special tokens dropped by default)."""
        text = self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return _clean_up_tokenization(text) if self._clean_up else text


def _clean_up_tokenization(text: str) -> str:
    """transformers' ``clean_up_tokenization``: the spaces that word-level tokenizers put before punctuation."""
    for spaced, joined in (
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ):
        text = text.replace(spaced, joined)
    return text


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


class TokenText(Protocol):
    """What :func:`check_vocabulary` needs of a tokenizer (:class:`ChatTokenizer` has it)."""

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = ...) -> str:
        """The text of ``ids``."""
        ...


def check_vocabulary(prompt_ids: Sequence[int], vocab_size: int, tokenizer: TokenText) -> None:
    """Refuse, before anything is sent, a prompt holding ids that the tokenizer has and the model has not:
    tokens added to the tokenizer past the model's vocabulary (SmolLM2's ``<FILL_ME>`` is 49156 of 49152),
    for which stage 0 has no embedding. A :class:`~agent.errors.ChatProtocolError`: the request is at fault."""
    outside = sorted({i for i in prompt_ids if not 0 <= i < vocab_size})
    if outside:
        named = ", ".join(
            f"{tokenizer.decode([i], skip_special_tokens=False)!r} (id {i})" if i >= 0 else f"'id {i}'"
            for i in outside[:5]
        )
        more = f" and {len(outside) - 5} more" if len(outside) > 5 else ""
        which = "it" if len(outside) == 1 else "them"
        raise ChatProtocolError(
            f"the prompt holds {named}{more}, which the tokenizer knows and the model does not (its vocabulary "
            f"is {vocab_size} tokens, ids 0-{vocab_size - 1}): take {which} out of the prompt"
        )


DEFAULT_MAX_TOKENS = 256
"""New tokens an answer may have when its request names no limit (fewer where the context has less room left)."""


def check_prompt(
    prompt_ids: list[int], max_tokens: int | None, context_tokens: int, setting: str = "--max-tokens"
) -> int:
    """Refuse, before anything is sent, a prompt that is empty or leaves no room for the reply; return how many new
    tokens the answer may have: ``max_tokens``, or, when the request names none, :data:`DEFAULT_MAX_TOKENS` or what
    the context leaves after the prompt, whichever is fewer. ``setting`` names the limit in the refusal as the
    asker knows it (``--max-tokens`` on the command line, ``max_tokens`` in the API)."""
    if not prompt_ids:
        raise PromptTooLongError("the prompt is empty")
    room = context_tokens - len(prompt_ids)
    if max_tokens is None and room >= 1:
        return min(DEFAULT_MAX_TOKENS, room)
    if max_tokens is not None and max_tokens <= room:
        return max_tokens
    raise PromptTooLongError.of(len(prompt_ids), max_tokens, context_tokens, setting)
