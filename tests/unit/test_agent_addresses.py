"""``shoal agent`` on an address it cannot have says so before it compiles anything (issue 40 §5)."""

from __future__ import annotations

import asyncio
import socket
from dataclasses import replace
from pathlib import Path

import pytest

from agent import daemon as daemon_module
from agent.daemon import Daemon
from agent.errors import ConfigError
from agent.fleet import init_fleet, issue_node
from agent.node.config import AgentConfig

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("taken", ["listen", "chat", "http"])
def test_an_address_in_use_is_refused_before_the_stages_are_loaded(
    taken: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    init_fleet(tmp_path / "fleet", "ours")
    node = issue_node(tmp_path / "fleet", "alpha")
    loaded: list[AgentConfig] = []

    async def load_stages(config: AgentConfig) -> None:
        loaded.append(config)
        raise AssertionError("the stages were loaded (checked and compiled) before the addresses")

    monkeypatch.setattr(daemon_module, "_load_stages", load_stages)
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        config = AgentConfig(
            export_dir=tmp_path / "export",
            stages=(0,),
            identity_dir=node.cert.parent,
            chat=("127.0.0.1", 0),
            http=("127.0.0.1", 0),
            chat_file=tmp_path / "chat.json",
        )
        config = replace(config, **{taken: ("127.0.0.1", port)})
        with pytest.raises(ConfigError) as refused:
            asyncio.run(Daemon.build(config))
    what = {"listen": "the ring", "chat": "the chat endpoint", "http": "the HTTP API"}[taken]
    assert str(refused.value) == f"cannot listen for {what} on 127.0.0.1:{port}: address already in use"
    assert loaded == []
