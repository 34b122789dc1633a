"""The record a running agent leaves in its identity folder: where it listens, so that this PC's commands
(``shoal status``, ``doctor``, ``pins``, ``chat``) find it without being told. Light to import: no OpenVINO."""

from __future__ import annotations

import json
import os
from pathlib import Path

from agent.files import write_atomic

RUNNING_FILE = "agent.json"
"""Written into the identity folder while the agent runs: where it listens (``shoal doctor`` reads it)."""


def running_agent(identity_folder: Path) -> str | None:
    """``HOST:PORT`` of the agent running with the identity in ``identity_folder`` (None: none runs), dialable
    from this PC (an agent listening on every interface is reached on loopback)."""
    try:
        record = json.loads((identity_folder / RUNNING_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    listen = record.get("listen") if isinstance(record, dict) else None
    if not isinstance(listen, str):
        return None
    host, _, port = listen.rpartition(":")
    return f"127.0.0.1:{port}" if host in ("0.0.0.0", "") else listen


def write_running_record(path: Path, node: str, ring: tuple[str, int]) -> None:
    """The record of an agent that listens at ``ring`` (its pid: this process)."""
    record = {"node": node, "listen": f"{ring[0]}:{ring[1]}", "pid": os.getpid()}
    write_atomic(path, json.dumps(record).encode(), private=False)
