"""The agent's configuration: a TOML file, overridden by flags, validated once."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.addresses import parse_address
from agent.errors import ConfigError
from agent.node.config import load_agent_config, stage_runtime
from tests.support.toy_model import toy_manifest


def test_file_then_flags(tmp_path: Path) -> None:
    config_file = tmp_path / "agent.toml"
    config_file.write_text(
        'export_dir = "/srv/export"\nstages = [1, 2]\nidentity_dir = "/srv/id"\n'
        'listen = "0.0.0.0:7000"\nnext = "10.0.0.3:7000"\nthreads = 2\nmax_sessions = 4\n'
    )
    config = load_agent_config(config_file, {"threads": 1, "device": None})
    assert config.export_dir == Path("/srv/export")
    assert config.stages == (1, 2)
    assert config.listen == ("0.0.0.0", 7000)
    assert config.next == ("10.0.0.3", 7000)
    assert config.runtime.threads == 1  # the flag wins over the file
    assert config.max_sessions == 4


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"stages": [0, 2]}, "consecutive"),
        ({"max_sessions": 0}, "at least 1"),
        ({"wire_dtype": "f8"}, "wire_dtype"),
        ({"colour": "blue"}, "unknown agent settings: colour"),
        ({"stages": None, "identity_dir": "x"}, "'stages' is missing"),
        ({"chat": "0.0.0.0:7000", "chat_file": "c.json"}, "loopback"),
        ({"chat": "127.0.0.1:0"}, "chat_file is needed"),
        ({"chat": "127.0.0.1:0", "chat_file": "c.json", "stages": [1]}, "needs ring_first"),
        ({"drafter": "oracle"}, "'drafter' must be one of"),
        ({"http": "127.0.0.1:8080"}, "http needs chat"),
        ({"chat_keep": -1}, "'chat_keep' must be a number of seconds, 0 or more"),
        ({"speed": 0}, "'speed' must be a speed in GFLOP/s, above 0, not 0"),
        ({"speed": "fast"}, "'speed' must be a speed in GFLOP/s"),
        # what a TOML file gets wrong (issue 22): each refused with the setting's name, never a traceback
        ({"stages": "two"}, "'stages' must be a whole number, not 'two'"),
        ({"stages": -1}, "'stages' must be at least 0, not -1"),
        ({"listen": 18152}, "'listen' must be a non-empty string, not 18152"),
        ({"listen": "nowhere"}, "'listen': address 'nowhere' is not HOST:PORT"),
        ({"max_sessions": "lots"}, "'max_sessions' must be a whole number, not 'lots'"),
        ({"threads": "four"}, "'threads' must be a whole number, not 'four'"),
        ({"verify": "yes"}, "'verify' must be true or false"),
        ({"device": "TPU"}, "'device' must be one of AUTO, CPU, GPU, NPU"),
        ({"precision": "f8"}, "'precision' must be one of"),
        ({"export_dir": 3}, "'export_dir' must be a non-empty string"),
        ({"http": "10.0.0.1:8080", "chat": "127.0.0.1:0", "chat_file": "c.json"}, "HTTP API is for clients on this PC"),
    ],
)
def test_bad_settings_are_refused(overrides: dict[str, object], message: str) -> None:
    values: dict[str, object] = {"export_dir": "e", "stages": [0], "identity_dir": "i"} | overrides
    with pytest.raises(ConfigError, match=message):
        load_agent_config(None, values)


def test_chat_settings(tmp_path: Path) -> None:
    config = load_agent_config(
        None,
        {
            "export_dir": "e",
            "stages": [1],
            "identity_dir": "i",
            "chat": "127.0.0.1:0",
            "chat_file": str(tmp_path / "c.json"),
            "ring_first": "10.0.0.1:7000",
            "ring_last": "10.0.0.3:7000",
            "drafter": "none",
            "chat_keep": 30.0,
            "chat_keep_max": 2,
        },
    )
    assert config.chat == ("127.0.0.1", 0)
    assert config.chat_file == tmp_path / "c.json"
    assert (config.ring_first, config.ring_last) == (("10.0.0.1", 7000), ("10.0.0.3", 7000))
    assert config.drafter == "none"
    assert (config.chat_keep, config.chat_keep_max) == (30.0, 2)
    assert load_agent_config(None, {"export_dir": "e", "stages": [0], "identity_dir": "i"}).chat is None


def test_unreadable_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("stages = [")
    with pytest.raises(ConfigError, match=r"bad\.toml"):
        load_agent_config(bad, {})


@pytest.mark.parametrize("text", ["nohost", "host:", "host:99999", "host:abc"])
def test_bad_addresses(text: str) -> None:
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_address(text)


def test_addresses() -> None:
    assert parse_address("10.1.2.3:80") == ("10.1.2.3", 80)
    assert parse_address("[::1]:7000") == ("::1", 7000)
    assert parse_address(":7000") == ("127.0.0.1", 7000)


def test_defaults_fill_only_what_the_file_and_flags_leave_out(tmp_path: Path) -> None:
    asked: list[str] = []

    def identity() -> str:
        asked.append("identity_dir")
        return "/data/fleet/nodes/pc-7"

    config_file = tmp_path / "agent.toml"
    config_file.write_text('export_dir = "/srv/export"\nstages = 0\n')
    config = load_agent_config(config_file, {"identity_dir": None}, {"identity_dir": identity})
    assert config.identity_dir == Path("/data/fleet/nodes/pc-7")
    config_file.write_text('export_dir = "/srv/export"\nstages = 0\nidentity_dir = "/srv/id"\n')
    assert load_agent_config(config_file, {}, {"identity_dir": identity}).identity_dir == Path("/srv/id")
    assert load_agent_config(
        None, {"export_dir": "e", "stages": [0], "identity_dir": "/flag"}, {"identity_dir": identity}
    ).identity_dir == Path("/flag")
    assert asked == ["identity_dir"]  # looked up once, where nothing named it


def test_the_agent_command_finds_its_identity_under_the_data_dir_with_a_config_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``shoal agent --config FILE`` where the file names no identity: the one node issued under the data dir."""
    from agent.cli import agent_cmd
    from agent.cli.main import build_parser
    from agent.fleet import init_fleet, issue_node

    data_dir = tmp_path / "data"
    init_fleet(data_dir / "fleet")
    issued = issue_node(data_dir / "fleet", "pc-7")
    config_file = tmp_path / "agent.toml"
    config_file.write_text(f'export_dir = "{tmp_path}"\nstages = 0\n')
    seen: list[object] = []

    async def serve(config: object) -> int:
        seen.append(config)
        return 0

    args = build_parser().parse_args(["agent", "--config", str(config_file)])
    monkeypatch.setattr(agent_cmd, "serve", serve)  # everything up to loading the stages
    assert agent_cmd.run_agent(args, tmp_path / "cache", data_dir) == 0
    assert seen[0].identity_dir == issued.cert.parent  # type: ignore[attr-defined]
    assert seen[0].runtime.cache_dir == tmp_path / "cache" / "ov-cache"  # type: ignore[attr-defined]
    assert seen[0].chat_file == data_dir / "chat.json"  # type: ignore[attr-defined]


def test_an_address_in_use_is_one_clear_error() -> None:
    import asyncio

    from agent.transport.listen import listen_tcp

    async def main() -> None:
        async def nothing(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        taken = await listen_tcp(nothing, ("127.0.0.1", 0), "the ring")
        port = taken.sockets[0].getsockname()[1]
        try:
            with pytest.raises(
                ConfigError, match=f"cannot listen for the chat endpoint on 127.0.0.1:{port}: address already in use$"
            ):
                await listen_tcp(nothing, ("127.0.0.1", port), "the chat endpoint")
        finally:
            taken.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('stages = "two"', "agent setting 'stages' must be a whole number, not 'two'"),
        ("listen = 18152", "agent setting 'listen' must be a non-empty string, not 18152"),
        ('max_sessions = "lots"', "agent setting 'max_sessions' must be a whole number, not 'lots'"),
        ('threads = "four"', "agent setting 'threads' must be a whole number, not 'four'"),
    ],
)
def test_a_mistake_in_the_agents_file_is_one_line_and_exit_status_1(tmp_path: Path, toml: str, message: str) -> None:
    import subprocess
    import sys

    config_file = tmp_path / "agent.toml"
    lines = [f'export_dir = "{tmp_path}"', f'identity_dir = "{tmp_path}"', toml]
    if not toml.startswith("stages"):
        lines.append("stages = 0")
    config_file.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "agent.cli.main", "agent", "--config", str(config_file)],
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [f"shoal: error: {message}"], done.stderr


def test_a_paged_pool_is_sized_from_the_offer_unless_set(tmp_path: Path) -> None:
    manifest = toy_manifest(3)  # a toy KV position takes a byte: the offer never limits it
    given = {"identity_dir": tmp_path, "export_dir": tmp_path, "stages": [1]}
    config = load_agent_config(None, {**given, "max_sessions": 3})
    assert stage_runtime(config, manifest, [1], 1024).kv_positions == 3 * manifest.context_tokens
    config = load_agent_config(None, {**given, "kv_positions": 77})
    assert stage_runtime(config, manifest, [1], 1024).kv_positions == 77
    assert stage_runtime(config, manifest, [], 1024) is config.runtime
