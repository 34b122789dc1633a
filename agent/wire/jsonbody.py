"""JSON from a peer: ``json.loads`` whose every failure is a ``ValueError``; and canonical JSON, the bytes a
signature or a hash covers (:func:`canonical_json`).

The C parser raises ``RecursionError`` for a document nested deeper than the interpreter's recursion limit (a
few kilobytes of ``[[[[``), which no ``except ValueError`` catches: a peer could end the task reading it. Every
decoder of peers' JSON (frames' bodies, control messages, signed documents, chat and API requests, enrollment)
reads through :func:`loads_json`, and keeps its own ``except ValueError``.
"""

from __future__ import annotations

import json
from typing import Any


def loads_json(data: bytes | str) -> Any:
    """``json.loads(data)``; ``ValueError`` for anything that is not JSON, nesting too deep included."""
    try:
        return json.loads(data)
    except RecursionError as exc:
        raise ValueError("the JSON is nested too deeply") from exc


def canonical_json(doc: object) -> bytes:
    """``doc`` as canonical JSON (sorted keys, no spaces, ASCII): the same bytes for the same content in any
    process, what a signature (``agent.fleet.signed``) or a hash (a plan's) covers."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()
