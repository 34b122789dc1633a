"""A tokenizer folder's chat template, rendered as transformers renders it (without importing transformers).

transformers' ``apply_chat_template`` compiles the Jinja template in an immutable sandbox with
``trim_blocks`` and ``lstrip_blocks``, a ``tojson`` filter that keeps non-ASCII text, the
``raise_exception`` and ``strftime_now`` globals, ``{% break %}``/``{% continue %}`` and a
``{% generation %}`` block (it marks the assistant's text; here it only renders its body). The variables are
the messages, ``add_generation_prompt``, ``tools`` and ``documents`` (None: templates test ``is not none``)
and the tokenizer's named special tokens. The same text gives the same token ids.

Unlike transformers, a message's content that spells a special token (``<|im_end|>`` pasted by a user) does
not become that control token: :meth:`ChatTemplate.render_marking` says where the contents wrote such texts,
so that the tokenizer encodes them as plain text (``agent.head.chat``).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn, TypeAlias

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from agent.errors import ChatProtocolError, ConfigError

TEMPLATE_FILE = "chat_template.jinja"
TEMPLATE_DIR = "additional_chat_templates"

_STAND_IN_FIRST = 0xF0000
"""Contents' special-token texts stand behind characters from here (Unicode's plane 15, private use) while
the template renders: one character each, never itself markup, and kept by ``tojson``."""

Span: TypeAlias = tuple[int, int]
"""Characters ``[start, end)`` of a text."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: transformers tracks the assistant's characters with it;
    a prompt only needs the text inside."""

    tags = {"generation"}  # noqa: RUF012 (jinja's Extension declares it as a class attribute)

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None, sort_keys: bool = False
) -> str:
    # jinja's own tojson escapes <, >, & and ' for HTML, which a prompt must not see
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def find_template(folder: Path, config: Mapping[str, Any]) -> str | dict[str, str] | None:
    """The folder's chat template(s) with transformers' precedence: ``chat_template.jinja`` and
    ``additional_chat_templates/*.jinja`` over ``chat_template`` in tokenizer_config.json (a string, or a
    list of ``{"name", "template"}``). Several templates come back as a dict by name (``default`` for the
    file). ``chat_template.json`` is a processor's file, which a tokenizer does not read: neither do we."""
    templates: dict[str, str] = {}
    if (folder / TEMPLATE_FILE).is_file():
        templates["default"] = (folder / TEMPLATE_FILE).read_text(encoding="utf-8")
    if (folder / TEMPLATE_DIR).is_dir():
        for path in sorted((folder / TEMPLATE_DIR).glob("*.jinja")):
            templates[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    if list(templates) == ["default"]:
        return templates["default"]
    if templates:
        return templates
    found = config.get("chat_template")
    if isinstance(found, list):
        return {str(t["name"]): str(t["template"]) for t in found}
    return found if isinstance(found, str) else None


class ChatTemplate:
    """A compiled chat template; ``variables`` (the special tokens) are passed to every rendering."""

    def __init__(self, source: str | dict[str, str], variables: Mapping[str, str], where: Path) -> None:
        if isinstance(source, dict):
            # as transformers does with no template named in the call (and no tools)
            if "default" not in source:
                raise ConfigError(f"{where}: several chat templates ({', '.join(sorted(source))}) and no default")
            source = source["default"]
        try:
            self._template = _compile(source)
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(f"{where}: the chat template does not compile (line {exc.lineno}: {exc})") from exc
        self._variables = dict(variables)

    def render(self, messages: Sequence[Mapping[str, str]]) -> str:
        """The prompt text of ``messages`` followed by the generation prompt (the assistant's turn opening).

        A template that refuses the conversation (``raise_exception``, e.g. roles that do not alternate)
        makes a :class:`ChatProtocolError`: the request is at fault, not the agent."""
        try:
            return self._template.render(
                messages=messages, tools=None, documents=None, add_generation_prompt=True, **self._variables
            )
        except jinja2.TemplateError as exc:
            raise ChatProtocolError(f"the model's chat template refuses this conversation: {exc}") from exc

    def render_marking(
        self, messages: Sequence[Mapping[str, str]], specials: re.Pattern[str]
    ) -> tuple[str, list[Span]]:
        """:meth:`render`, and the spans of the text where the messages' contents wrote a match of ``specials``
        (the special tokens' texts), which must stay text.

        The template sees each such match as one private-use character, put back in the text it renders: so
        it cannot take the match for its own markup, and a template that trims, escapes or wraps a content
        moves the match with it. Without a match the text is :meth:`render`'s and the list is empty."""
        contents = [m["content"] for m in messages if isinstance(m.get("content"), str)]
        found = sorted({match.group() for c in contents for match in specials.finditer(c)})
        if not found:
            return self.render(messages), []
        used = set().union(*map(set, contents))
        free = (chr(c) for c in range(_STAND_IN_FIRST, 0x10FFFE) if chr(c) not in used)
        stand_in = {text: char for text, char in zip(found, free, strict=False)}
        hidden = [
            {**m, "content": specials.sub(lambda match: stand_in[match.group()], m["content"])}
            if isinstance(m.get("content"), str)
            else m
            for m in messages
        ]
        text = {char: special for special, char in stand_in.items()}
        pieces: list[str] = []
        spans: list[Span] = []
        done = length = 0
        rendered = self.render(hidden)
        for match in re.finditer("|".join(map(re.escape, stand_in.values())), rendered):
            pieces += [rendered[done : match.start()], text[match.group()]]
            length += match.start() - done
            spans.append((length, length + len(text[match.group()])))
            length, done = spans[-1][1], match.end()
        pieces.append(rendered[done:])
        return "".join(pieces), spans
