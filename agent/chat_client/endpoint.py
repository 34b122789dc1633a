"""Where a PC's chat clients find their agent: a small file with its loopback address and access token.

The agent writes it when its chat endpoint starts (readable by its user only) and removes it when it
stops; ``shoal ask`` reads it. The token keeps other local users' processes out: the endpoint is plain
TCP on loopback, so anyone on the PC could otherwise connect.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from agent.errors import ChatEndpointError


@dataclass(frozen=True)
class ChatEndpoint:
    """A running agent's chat address and the token a request must carry."""

    host: str
    port: int
    token: str
    http: str = ""
    """Base URL of the agent's OpenAI-style API (``--http``), empty when it serves none."""

    @classmethod
    def new(cls, host: str, port: int) -> ChatEndpoint:
        return cls(host, port, secrets.token_hex(32))

    def write(self, path: Path) -> None:
        """Write atomically, readable and writable by this user only."""
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch = path.with_name(path.name + f".{os.getpid()}.tmp")
        descriptor = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as out:
            json.dump({"host": self.host, "port": self.port, "token": self.token, "http": self.http}, out)
        os.replace(scratch, path)

    @classmethod
    def load(cls, path: Path) -> ChatEndpoint:
        try:
            data = json.loads(path.read_text())
            return cls(str(data["host"]), int(data["port"]), str(data["token"]), str(data.get("http", "")))
        except FileNotFoundError as exc:
            raise ChatEndpointError(
                f"{path} does not exist: start `shoal agent ... --chat 127.0.0.1:0` on this PC first"
            ) from exc
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ChatEndpointError(f"{path} is not a chat endpoint file: {exc}") from exc
