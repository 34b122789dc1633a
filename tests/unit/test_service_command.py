"""``shoal service install | status | uninstall`` in a home folder of the test's own, the service manager's
commands recorded by a fake runner (no user systemd instance runs here; launchctl and schtasks are not on
Linux): the exact commands, the files, a dry run that shows exactly those, and an uninstall that leaves
nothing behind."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from agent.cli.main import build_parser
from agent.cli.service_cmd import DRY, RECORD, STARTER_CONFIG, Host, Ran, run_service
from agent.errors import ServiceError

DRY_WRITE = DRY + "would write "


class FakeRunner:
    """The service manager's tools, recorded: each command answers ``answers[argv]`` or success."""

    def __init__(self, tools: Sequence[str] = ("systemctl", "loginctl", "launchctl", "schtasks")) -> None:
        self.tools = set(tools)
        self.ran: list[tuple[str, ...]] = []
        self.answers: dict[tuple[str, ...], Ran] = {}

    def which(self, tool: str) -> str | None:
        return f"/usr/bin/{tool}" if tool in self.tools else None

    def run(self, argv: Sequence[str]) -> Ran:
        self.ran.append(tuple(argv))
        return self.answers.get(tuple(argv), Ran(0))


def _host(tmp_path: Path, platform: str = "linux") -> Host:
    home = tmp_path / "home"
    data = home / ".local" / "share" / "shoal"
    identity = data / "fleet" / "nodes" / "pc7"
    identity.mkdir(parents=True, exist_ok=True)
    (identity / "cert.pem").write_text("not read by install", encoding="utf-8")
    env = {"LOCALAPPDATA": str(home / "AppData" / "Local")} if platform == "windows" else {}
    if platform == "linux":
        env["HF_ENDPOINT"] = "http://mirror.office:8090"
    user = "OFFICE\\ana" if platform == "windows" else "ana"
    return Host(platform, home, sys.executable, user, 501, home / ".config" / "shoal", data, env)


def _args(*words: str) -> argparse.Namespace:
    return build_parser().parse_args(["service", *words])


def _tree(folder: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in sorted(folder.rglob("*"))}


def _dry_run(host: Host, capsys: pytest.CaptureFixture[str], *words: str) -> tuple[dict[str, str], list[str]]:
    """The files (path -> content) and the commands a dry run prints."""
    assert run_service(_args(*words, "--dry-run"), host.data_dir, FakeRunner(), host) == 0
    files: dict[str, str] = {}
    commands = []
    current = None
    for line in capsys.readouterr().out.splitlines():
        if line.startswith(DRY_WRITE):
            current = line.removeprefix(DRY_WRITE).removesuffix(" (if it does not exist):").removesuffix(":")
            files[current] = ""
        elif line.startswith(DRY + "would run"):
            commands.append(line.split(": ", 1)[1])
            current = None
        elif line.startswith(DRY):
            current = None
        elif current is not None:
            files[current] += line + "\n"
    return files, commands


def test_install_then_uninstall_on_linux_leaves_no_file_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    host = _host(tmp_path)
    before = _tree(host.home)
    runner = FakeRunner()
    assert run_service(_args("install"), host.data_dir, runner, host) == 0
    unit = host.home / ".config" / "systemd" / "user" / "shoal-agent.service"
    config = host.home / ".config" / "shoal" / "agent.toml"
    assert unit.is_file() and config.read_text(encoding="utf-8") == STARTER_CONFIG
    assert runner.ran == [
        ("systemctl", "--user", "show", "--property=Version"),  # the user manager answers before anything is written
        ("systemctl", "--user", "daemon-reload"),
        ("systemctl", "--user", "enable", "shoal-agent.service"),
        ("systemctl", "--user", "restart", "shoal-agent.service"),
    ]
    text = unit.read_text(encoding="utf-8")
    identity = host.data_dir / "fleet" / "nodes" / "pc7"
    assert f"ExecStart={sys.executable} -m agent.cli.main agent --identity {identity} --config {config}\n" in text
    assert "Environment=HF_ENDPOINT=http://mirror.office:8090\n" in text  # the office's mirror, from the shell
    capsys.readouterr()

    runner.ran.clear()
    runner.answers[("systemctl", "--user", "show", "shoal-agent.service", "--property=" + _PROPERTIES)] = Ran(
        0, "LoadState=loaded\nActiveState=active\nSubState=running\nMainPID=4242\n"
        "ActiveEnterTimestamp=Sun 2026-12-06 09:00:00 UTC\nNRestarts=0\n",
    )  # fmt: skip
    assert run_service(_args("status"), host.data_dir, runner, host) == 0
    status = capsys.readouterr().out
    assert "service: active (running) since Sun 2026-12-06 09:00:00 UTC, pid 4242, restarted 0 times" in status
    assert f"agent: no agent runs with the identity {identity}" in status
    assert "logs: journalctl --user -u shoal-agent" in status

    runner.ran.clear()
    assert run_service(_args("uninstall"), host.data_dir, runner, host) == 0
    assert runner.ran == [
        ("systemctl", "--user", "disable", "--now", "shoal-agent.service"),
        ("systemctl", "--user", "daemon-reload"),
    ]
    assert _tree(host.home) == before


_PROPERTIES = "LoadState,ActiveState,SubState,MainPID,ActiveEnterTimestamp,NRestarts"


def test_install_again_is_the_same_install_and_keeps_the_donors_settings(tmp_path: Path) -> None:
    host = _host(tmp_path)
    runner = FakeRunner()
    run_service(_args("install"), host.data_dir, runner, host)
    first = _tree(host.home)
    config = host.config_dir / "agent.toml"
    config.write_text(STARTER_CONFIG + "offer_mb = 4096\n", encoding="utf-8")
    run_service(_args("install"), host.data_dir, runner, host)
    assert _tree(host.home) == {**first, str(config.relative_to(host.home)): config.read_bytes()}
    run_service(_args("uninstall"), host.data_dir, runner, host)
    assert config.read_text(encoding="utf-8").endswith("offer_mb = 4096\n")  # the donor's now: kept
    assert not (host.home / ".config" / "systemd").exists() and not (host.data_dir / RECORD).exists()


def test_the_dry_run_shows_exactly_what_install_writes_and_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for platform in ("linux", "macos", "windows"):
        host = _host(tmp_path / platform, platform)
        untouched = _tree(host.home)
        files, commands = _dry_run(host, capsys, "install")
        assert _tree(host.home) == untouched  # a dry run writes nothing
        before = set(untouched)
        runner = FakeRunner()
        run_service(_args("install"), host.data_dir, runner, host)
        written = set(_tree(host.home)) - before
        for path, text in files.items():
            raw = Path(path).read_bytes()
            assert raw.decode("utf-16" if raw.startswith(b"\xff\xfe") else "utf-8") == text, (platform, path)
            assert str(Path(path).relative_to(host.home)) in written
        import shlex

        assert [shlex.join(c) for c in runner.ran if c not in _PROBES] == commands, platform


_PROBES = {("systemctl", "--user", "show", "--property=Version")}


def test_macos_bootstraps_a_launch_agent_in_the_users_gui_domain(tmp_path: Path) -> None:
    host = _host(tmp_path, "macos")
    runner = FakeRunner()
    run_service(_args("install"), host.data_dir, runner, host)
    plist = host.home / "Library" / "LaunchAgents" / "local.shoal.agent.plist"
    assert runner.ran == [
        ("launchctl", "bootout", "gui/501/local.shoal.agent"),
        ("launchctl", "enable", "gui/501/local.shoal.agent"),
        ("launchctl", "bootstrap", "gui/501", str(plist)),
    ]
    assert (host.home / "Library" / "Logs" / "shoal").is_dir()
    runner.ran.clear()
    runner.answers[("launchctl", "bootout", "gui/501/local.shoal.agent")] = Ran(
        3, "", "Boot-out failed: 3: No such process"
    )
    run_service(_args("uninstall"), host.data_dir, runner, host)
    assert runner.ran == [("launchctl", "bootout", "gui/501/local.shoal.agent")]
    assert not plist.exists()


def test_windows_registers_a_task_at_logon_with_schtasks(tmp_path: Path) -> None:
    host = _host(tmp_path, "windows")
    runner = FakeRunner()
    run_service(_args("install"), host.data_dir, runner, host)
    xml = host.home / "AppData" / "Local" / "shoal" / "shoal-agent.xml"
    assert runner.ran == [
        ("schtasks", "/End", "/TN", "shoal-agent"),
        ("schtasks", "/Create", "/TN", "shoal-agent", "/XML", str(xml), "/F"),
        ("schtasks", "/Run", "/TN", "shoal-agent"),
    ]
    assert xml.read_bytes().startswith(b"\xff\xfe") and (xml.parent / "logs").is_dir()
    runner.ran.clear()
    run_service(_args("uninstall"), host.data_dir, runner, host)
    assert runner.ran == [
        ("schtasks", "/End", "/TN", "shoal-agent"),
        ("schtasks", "/Delete", "/TN", "shoal-agent", "/F"),
    ]
    assert not xml.exists()


@pytest.mark.parametrize(
    ("platform", "tool"), [("linux", "systemctl"), ("macos", "launchctl"), ("windows", "schtasks")]
)
def test_install_refuses_in_one_line_where_the_platforms_tool_is_missing(
    tmp_path: Path, platform: str, tool: str
) -> None:
    host = _host(tmp_path, platform)
    before = _tree(host.home)
    with pytest.raises(ServiceError, match=f"^{tool} is not on this PC") as refused:
        run_service(_args("install"), host.data_dir, FakeRunner(tools=()), host)
    assert "\n" not in str(refused.value)
    assert _tree(host.home) == before


def test_install_refuses_where_no_user_manager_answers_and_writes_nothing(tmp_path: Path) -> None:
    host = _host(tmp_path)
    before = _tree(host.home)
    runner = FakeRunner()
    runner.answers[("systemctl", "--user", "show", "--property=Version")] = Ran(
        1, "", "Failed to connect to bus: No medium found\n"
    )
    with pytest.raises(ServiceError, match=r"does not reach your user's service manager \(Failed to connect to bus"):
        run_service(_args("install"), host.data_dir, runner, host)
    assert _tree(host.home) == before


@pytest.mark.parametrize("was_on", [False, True])
def test_serving_logged_out_enables_lingering_and_uninstall_undoes_only_its_own(tmp_path: Path, was_on: bool) -> None:
    host = _host(tmp_path)
    runner = FakeRunner()
    runner.answers[("loginctl", "show-user", "501", "--property=Linger", "--value")] = Ran(
        0, "yes\n" if was_on else "no\n"
    )
    run_service(_args("install", "--serve-logged-out"), host.data_dir, runner, host)
    assert runner.ran[-1] == ("loginctl", "enable-linger")
    runner.ran.clear()
    run_service(_args("uninstall"), host.data_dir, runner, host)
    assert (("loginctl", "disable-linger") in runner.ran) is not was_on


def test_platform_is_for_dry_runs_only(tmp_path: Path) -> None:
    host = _host(tmp_path)
    with pytest.raises(ServiceError, match="add --dry-run"):
        run_service(_args("install", "--platform", "windows"), host.data_dir, FakeRunner(), host)


def test_install_needs_an_enrolled_identity(tmp_path: Path) -> None:
    host = _host(tmp_path)
    (host.data_dir / "fleet" / "nodes" / "pc7" / "cert.pem").unlink()
    with pytest.raises(ServiceError, match="enroll it first with `shoal join"):
        run_service(_args("install", "--dry-run"), host.data_dir, FakeRunner(), host)


def test_the_starter_settings_are_settings_the_agent_takes(tmp_path: Path) -> None:
    from agent.node.config import load_agent_config

    (tmp_path / "agent.toml").write_text(STARTER_CONFIG, encoding="utf-8")
    config = load_agent_config(tmp_path / "agent.toml", {"identity_dir": tmp_path, "chat_file": tmp_path / "c.json"})
    assert config.listen == ("0.0.0.0", 7100) and config.chat == ("127.0.0.1", 0) and config.donor is not None


def test_status_tells_a_running_agent_from_a_record_left_by_a_dead_one(tmp_path: Path) -> None:
    import json
    import os
    import subprocess

    from agent.cli.service_cmd import agent_state

    identity = tmp_path / "id"
    identity.mkdir()
    record = identity / "agent.json"
    record.write_text(json.dumps({"node": "pc7", "listen": "127.0.0.1:9", "pid": os.getpid()}), encoding="utf-8")
    alive = agent_state(identity)
    assert alive.startswith(f"pid {os.getpid()} since ") and "not answering at 127.0.0.1:9" in alive
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    record.write_text(json.dumps({"node": "pc7", "listen": "127.0.0.1:9", "pid": gone.pid}), encoding="utf-8")
    assert agent_state(identity).startswith(f"not running: its record names process {gone.pid}, which is gone")
    record.unlink()
    assert agent_state(identity) == f"no agent runs with the identity {identity}"
