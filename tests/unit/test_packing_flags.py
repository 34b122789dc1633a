"""``shoal agent --kv --pack-budget --pack-window`` (issue 45): the flags reach the agent's configuration over the
file's settings, and a budget of 0 turns packing off; ``shoal status`` tells the steps per pack."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.cli import agent_cmd
from agent.cli.main import build_parser
from agent.fleet import init_fleet, issue_node
from agent.node.config import AgentConfig
from agent.runtime.packer import PackPolicy


def _configured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> AgentConfig:
    data_dir = tmp_path / "data"
    init_fleet(data_dir / "fleet")
    issue_node(data_dir / "fleet", "pc-1")
    config_file = tmp_path / "agent.toml"
    config_file.write_text(f'export_dir = "{tmp_path}"\nstages = 0\nkv = "state"\npack_budget = 64\n')
    seen: list[AgentConfig] = []

    async def serve(config: AgentConfig) -> int:
        seen.append(config)
        return 0

    monkeypatch.setattr(agent_cmd, "serve", serve)  # everything up to loading the stages
    args = build_parser().parse_args(["agent", "--config", str(config_file), *flags])
    assert agent_cmd.run_agent(args, tmp_path / "cache", data_dir) == 0
    return seen[0]


def test_the_packing_flags_override_the_files_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _configured(tmp_path, monkeypatch, "--kv", "paged", "--pack-budget", "32", "--pack-window", "0.002")
    assert config.runtime.kv == "paged"
    assert config.packing == PackPolicy(32, 0.002)


def test_the_files_settings_hold_without_flags_and_a_budget_of_0_is_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _configured(tmp_path, monkeypatch)
    assert config.runtime.kv == "state" and config.packing == PackPolicy(64, 0.0)
    assert _configured(tmp_path / "off", monkeypatch, "--pack-budget", "0").packing is None


def test_shoal_status_tells_the_steps_per_pack_of_the_ring_and_of_the_heads_own_stages() -> None:
    from agent.cli.status_cmd import status_lines

    status = {
        "node": "pc1",
        "stages": [],
        "steps_served": 12,
        "packs": 4,
        "packed_steps": 12,
        "kv_blocks": [[3, 2048], None],
        "chat": {"endpoint": "127.0.0.1:7001", "answered": 1, "running": 0, "local_packs": 5, "local_packed_steps": 9},
    }
    text = "\n".join(status_lines("here", status))
    assert "steps served 12, 12 steps in 4 packs (3.00 a pack), KV blocks in use 3/2048" in text
    assert "9 steps in 5 packs on its own stages (1.80 a pack)" in text
    alone = "\n".join(status_lines("here", {"node": "pc2", "stages": [], "chat": {}, "kv_blocks": [None]}))
    assert "packs" not in alone and "KV blocks" not in alone
