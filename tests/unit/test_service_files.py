"""The service files that ``shoal service install`` writes, checked by the tools of their platforms: the systemd
unit by ``systemd-analyze verify`` (any warning fails), the LaunchAgent by ``plistlib`` against the keys launchd
knows, the scheduled task against Task Scheduler's schema (``tests/support/task_scheduler.xsd``)."""

from __future__ import annotations

import os
import plistlib
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import xmlschema

from agent.cli.service_cmd import Host, InstallSettings, agent_launch, install_plan
from agent.cli.service_files import (
    TEMPLATES,
    AgentLaunch,
    fill,
    launchd_plist,
    memory_high,
    packaging_dir,
    systemd_quote,
    systemd_unit,
    task_xml,
    template,
)
from agent.errors import ServiceError

SCHEMA = Path(__file__).parents[1] / "support" / "task_scheduler.xsd"
TASK_NS = "http://schemas.microsoft.com/windows/2004/02/mit/task"
ODD = "dir with space & <xml> 100% $HOME"
"""A folder name that each syntax must escape: a space, XML's specials, systemd's specifier and variable."""

LAUNCHD_KEYS = {
    "Label": str,
    "ProgramArguments": list,
    "EnvironmentVariables": dict,
    "LimitLoadToSessionType": str,
    "RunAtLoad": bool,
    "KeepAlive": dict,
    "ThrottleInterval": int,
    "ProcessType": str,
    "LowPriorityIO": bool,
    "LowPriorityBackgroundIO": bool,
    "Nice": int,
    "ExitTimeOut": int,
    "StandardOutPath": str,
    "StandardErrorPath": str,
}
"""The keys of shoal's LaunchAgent and their types, as launchd.plist(5) documents them (each is one launchd
knows; ``KeepAlive`` may also be a bool, shoal's is the dictionary form)."""


def _launch(tmp_path: Path, environment: tuple[tuple[str, str], ...] = ()) -> AgentLaunch:
    return AgentLaunch(sys.executable, str(tmp_path / ODD / "id"), str(tmp_path / ODD / "agent.toml"), environment)


def verify_unit(unit: str, folder: Path) -> str:
    """What ``systemd-analyze --user verify`` prints about ``unit`` (empty: nothing to say), with its status."""
    if shutil.which("systemd-analyze") is None:
        pytest.fail("systemd-analyze is missing: apt-get install systemd (make test's set-up does)")
    path = folder / "shoal-agent.service"
    path.write_text(unit, encoding="utf-8")
    runtime = folder / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "SYSTEMD_LOG_COLOR": "0"}
    done = subprocess.run(
        ["systemd-analyze", "--user", "verify", str(path)], capture_output=True, text=True, env=env, timeout=60
    )
    return (done.stdout + done.stderr).strip() + ("" if done.returncode == 0 else f"\nexit status {done.returncode}")


def test_the_systemd_unit_passes_systemd_analyze_verify_without_a_word(tmp_path: Path) -> None:
    launch = _launch(tmp_path, (("HF_ENDPOINT", "http://mirror.office:8090"), ("SHOAL_DATA_DIR", f"/srv/{ODD}")))
    unit = systemd_unit(template("linux"), launch, "6G")
    assert verify_unit(unit, tmp_path) == ""
    lines = unit.splitlines()
    assert "Nice=19" in lines and "CPUWeight=idle" in lines and "IOSchedulingClass=idle" in lines
    assert "MemoryHigh=6G" in lines and "Restart=on-failure" in lines and "NoNewPrivileges=yes" in lines
    assert 'Environment="SHOAL_DATA_DIR=/srv/dir with space & <xml> 100%% $$HOME"' in lines
    assert "WantedBy=default.target" in lines and not any("@" in line for line in lines if not line.startswith("#"))


def test_the_verify_check_fails_on_a_warning_not_only_on_its_exit_status(tmp_path: Path) -> None:
    """systemd-analyze exits 0 on an unknown key (systemd 252's RestartSteps): only its words tell."""
    unit = systemd_unit(template("linux"), _launch(tmp_path), "75%").replace(
        "RestartSec=10s\n", "RestartSec=10s\nRestartStepz=5\n"
    )
    assert "Unknown key" in verify_unit(unit, tmp_path)


def test_the_systemd_command_line_keeps_each_word_whole(tmp_path: Path) -> None:
    """systemd splits ExecStart like a shell without variables or specifiers: shlex reads the same words back
    once the doubled % and $ are undone."""
    launch = _launch(tmp_path)
    unit = systemd_unit(template("linux"), launch, "75%")
    command = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    import shlex

    words = shlex.split(command.removeprefix("ExecStart=").replace("%%", "%").replace("$$", "$"))
    assert words == launch.arguments()
    assert systemd_quote("plain/path") == "plain/path"
    assert systemd_quote('a "b" \\c') == '"a \\"b\\" \\\\c"'


def test_the_launch_agent_round_trips_through_plistlib_with_the_keys_launchd_knows(tmp_path: Path) -> None:
    launch = _launch(tmp_path, (("HF_ENDPOINT", "http://mirror:8090/?a=1&b=2"),))
    log = str(tmp_path / ODD / "agent.log")
    data = plistlib.loads(launchd_plist(template("macos"), launch, log).encode())
    assert set(data) == set(LAUNCHD_KEYS)
    for key, kind in LAUNCHD_KEYS.items():
        assert isinstance(data[key], kind), key
    assert data["Label"] == "local.shoal.agent"
    assert data["ProgramArguments"] == launch.arguments()
    assert data["EnvironmentVariables"] == {"PYTHONUNBUFFERED": "1", "HF_ENDPOINT": "http://mirror:8090/?a=1&b=2"}
    assert data["KeepAlive"] == {"SuccessfulExit": False} and data["RunAtLoad"] is True
    assert data["ProcessType"] == "Background" and data["Nice"] == 19 and data["LowPriorityIO"] is True
    assert data["LimitLoadToSessionType"] == "Aqua"
    assert data["StandardOutPath"] == data["StandardErrorPath"] == log


def _task(tmp_path: Path, user: str = "OFFICE\\ana") -> bytes:
    host = Host(
        "windows",
        Path("C:/Users/ana"),
        "C:\\Users\\ana\\pipx\\venvs\\shoal\\Scripts\\python.exe",
        user,
        0,
        tmp_path / "config",
        tmp_path / "data",
        {"LOCALAPPDATA": "C:\\Users\\ana\\AppData\\Local"},
    )
    settings = InstallSettings(Path("C:/Users/ana/AppData/Local/shoal/fleet/nodes/pc 7"), tmp_path / "agent.toml")
    return task_xml(template("windows"), agent_launch(host, settings), user, "C:\\Users\\ana\\AppData\\Local\\shoal")


def test_the_scheduled_task_is_valid_against_task_schedulers_schema(tmp_path: Path) -> None:
    data = _task(tmp_path)
    assert data.startswith(b"\xff\xfe")  # UTF-16 with its byte order mark, as schtasks /XML reads it
    schema = xmlschema.XMLSchema(SCHEMA)
    schema.validate(data.decode("utf-16"))
    import xml.etree.ElementTree as ET

    root = ET.fromstring(data.decode("utf-16").split("?>", 1)[1])

    ns = {"t": TASK_NS}
    assert root.findtext("t:Triggers/t:LogonTrigger/t:UserId", namespaces=ns) == "OFFICE\\ana"
    assert root.findtext("t:Principals/t:Principal/t:UserId", namespaces=ns) == "OFFICE\\ana"
    assert root.findtext("t:Principals/t:Principal/t:LogonType", namespaces=ns) == "InteractiveToken"
    assert root.findtext("t:Principals/t:Principal/t:RunLevel", namespaces=ns) == "LeastPrivilege"
    assert root.findtext("t:Settings/t:Priority", namespaces=ns) == "9"  # IDLE_PRIORITY_CLASS
    assert root.findtext("t:Settings/t:RestartOnFailure/t:Count", namespaces=ns) == "10"
    assert root.findtext("t:Settings/t:ExecutionTimeLimit", namespaces=ns) == "PT0S"
    command = root.findtext("t:Actions/t:Exec/t:Command", namespaces=ns)
    assert command == "C:\\Users\\ana\\pipx\\venvs\\shoal\\Scripts\\pythonw.exe"  # no console window
    arguments = root.findtext("t:Actions/t:Exec/t:Arguments", namespaces=ns) or ""
    assert arguments.startswith(
        "-m agent.cli.main --log-file C:\\Users\\ana\\AppData\\Local\\shoal\\logs\\agent.log agent"
    )
    assert '--identity "C:\\Users\\ana\\AppData\\Local\\shoal\\fleet\\nodes\\pc 7"' in arguments


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ("<Priority>9</Priority>", "<Priority>11</Priority>"),
        ("<Count>10</Count>", "<Count>999</Count>"),
        ("<LogonType>InteractiveToken</LogonType>", "<LogonType>Interactive</LogonType>"),
        ("<Delay>PT30S</Delay>", "<Delay>30 seconds</Delay>"),
    ],
)
def test_the_schema_refuses_what_task_scheduler_would(tmp_path: Path, change: str, why: str) -> None:
    """The schema bites: a value out of Task Scheduler's range fails it."""
    text = _task(tmp_path).decode("utf-16").replace(change, why)
    with pytest.raises(xmlschema.XMLSchemaValidationError):
        xmlschema.XMLSchema(SCHEMA).validate(text)


def test_every_template_field_is_filled_and_every_value_used() -> None:
    folder = packaging_dir()
    for platform, name in TEMPLATES.items():
        text = (folder / name).read_text(encoding="utf-8")
        assert re.findall(r"@([A-Z_]+)@", text), platform
    with pytest.raises(ServiceError, match=r"not given \['B'\], unused \['C'\]"):
        fill("x=@A@ y=@B@", {"A": "1", "C": "2"})
    assert fill("a\n  @LINES@\nb @X@\n", {"LINES": "", "X": "1"}) == "a\nb 1\n"
    assert fill("a\n  @LINES@\nb\n", {"LINES": "  l1\n  l2\n"}) == "a\n  l1\n  l2\nb\n"


def test_memory_high_takes_systemds_forms_only() -> None:
    for good in ("8G", "512M", "75%", "infinity", "1.5G"):
        assert memory_high(good) == good
    for bad in ("8 GB", "-1", "lots", "75 %", "8G\nExecStartPre=/bin/rm"):
        with pytest.raises(ServiceError, match="memory limit"):
            memory_high(bad)


def test_install_plans_write_one_file_from_each_template(tmp_path: Path) -> None:
    """Every OS's plan writes its service file from its own template (never a copy kept in the code)."""
    for platform in TEMPLATES:
        host = Host(platform, tmp_path, sys.executable, "ana", 501, tmp_path / "cfg", tmp_path / "data")
        plan = install_plan(host, InstallSettings(tmp_path / "id", tmp_path / "cfg" / "agent.toml"))
        service = plan.files[0]
        assert service.path == host.service_file()
        first_comment = template(platform).splitlines()[1 if platform == "macos" else 0]
        assert first_comment in service.text()
