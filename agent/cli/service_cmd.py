"""``shoal service install | status | uninstall``: the agent in the background, started at every logon.

Linux gets a systemd user unit, macOS a LaunchAgent, Windows a scheduled task at logon. Each runs the agent as
the logged-in user, in that user's session, never as a system service: the donor policy watches that user's
keyboard and mouse, which a system service cannot see (Windows' ``GetLastInputInfo`` sees only its own
session), and none of it needs root or an administrator.

What install and uninstall do is first decided as a :class:`Plan` (the files to write, the commands to run) by
pure functions of this PC's facts (:class:`Host`); ``--dry-run`` prints the plan, otherwise :func:`apply`
carries it out through a :class:`Runner` (the tests pass one that records the commands). Install keeps a
record of the files and folders it made, so that uninstall removes those and nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import getpass
import hashlib
import io
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path, PureWindowsPath
from typing import Any, Protocol

from agent.cli.common import Subcommands
from agent.cli.service_files import (
    LABEL,
    PASSED_ENVIRONMENT,
    PLATFORMS,
    TASK,
    UNIT,
    AgentLaunch,
    launchd_plist,
    memory_high,
    shown,
    systemd_unit,
    task_xml,
    template,
)
from agent.errors import ServiceError, ShoalError

log = logging.getLogger(__name__)

RECORD = "service.json"
"""In the data folder: what ``shoal service install`` wrote and started (uninstall reads it)."""
TOOLS = {"linux": "systemctl", "macos": "launchctl", "windows": "schtasks"}
STARTER_CONFIG = """\
# shoal agent settings, read at every start of the service (`shoal agent --help` and agent/node/config.py
# list every key). Written by `shoal service install` where there was none; `shoal service install` again
# restarts the agent with what this file says.
listen = "0.0.0.0:7100"   # the ring: the other PCs of the fleet connect here
chat = "127.0.0.1:0"      # this PC's own chats (shoal ask, shoal chat), on loopback only
donor = true              # serve only while nobody uses this PC, at the lowest priority (a [donor] table tunes it)
"""


@dataclass(frozen=True)
class Host:
    """The facts of this PC that decide what install writes where (the tests make their own)."""

    platform: str
    """linux, macos or windows."""
    home: Path
    python: str
    """The interpreter of this install (``sys.executable``)."""
    user: str
    """The user the service runs as (Windows: ``DOMAIN\\user``, the task's logon trigger and principal)."""
    uid: int
    """The user's id (launchd's ``gui/UID`` domain, loginctl); 0 on Windows."""
    config_dir: Path
    """The user's shoal settings folder: where install puts ``agent.toml`` unless told otherwise."""
    data_dir: Path
    """The user's shoal data folder (identities, ``chat.json``, the install record)."""
    env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def this_pc(cls, data_dir: Path) -> Host:
        """This PC, as the running user sees it."""
        import platformdirs

        names = {"linux": "linux", "darwin": "macos", "win32": "windows"}
        platform = names.get(sys.platform)
        if platform is None:
            raise ServiceError(f"shoal service knows Linux, macOS and Windows, not {sys.platform}: run `shoal agent`")
        user = getpass.getuser()
        if platform == "windows" and os.environ.get("USERDOMAIN"):
            user = f"{os.environ['USERDOMAIN']}\\{user}"
        return cls(
            platform,
            Path.home(),
            sys.executable,
            user,
            os.getuid() if hasattr(os, "getuid") else 0,
            Path(platformdirs.user_config_dir("shoal", appauthor=False)),
            data_dir,
            dict(os.environ),
        )

    def local_appdata(self) -> Path:
        """Windows' ``%LOCALAPPDATA%``."""
        return Path(self.env.get("LOCALAPPDATA") or self.home / "AppData" / "Local")

    def service_file(self) -> Path:
        """Where the service manager reads the agent's service from."""
        if self.platform == "linux":
            return Path(self.env.get("XDG_CONFIG_HOME") or self.home / ".config") / "systemd" / "user" / UNIT
        if self.platform == "macos":
            return self.home / "Library" / "LaunchAgents" / f"{LABEL}.plist"
        return self.local_appdata() / "shoal" / f"{TASK}.xml"

    def log_folder(self) -> Path | None:
        """The folder of the agent's log file; None on Linux, where the journal keeps it."""
        if self.platform == "macos":
            return self.home / "Library" / "Logs" / "shoal"
        if self.platform == "windows":
            return self.local_appdata() / "shoal" / "logs"
        return None

    def logs(self) -> str:
        """Where to read the agent's log, as a donor would be told."""
        folder = self.log_folder()
        return f"journalctl --user -u {UNIT.removesuffix('.service')}" if folder is None else str(folder / "agent.log")


@dataclass(frozen=True)
class InstallSettings:
    """What the donor chose (``shoal service install``'s flags)."""

    identity_dir: Path
    config_file: Path
    memory_high: str = "75%"
    """Linux: above this the kernel reclaims the agent's memory first (systemd's ``MemoryHigh=``)."""
    serve_logged_out: bool = False
    """Linux: keep the user manager, so the agent, running after logout (``loginctl enable-linger``)."""


@dataclass(frozen=True)
class Command:
    """A command a plan runs."""

    argv: tuple[str, ...]
    may_fail: bool = False
    """Its failure changes nothing (stopping a service that is not running)."""


@dataclass(frozen=True)
class NewFile:
    """A file a plan writes."""

    path: Path
    content: bytes
    only_if_missing: bool = False
    """The donor's once it exists (the settings file): written only where there is none."""

    def text(self) -> str:
        """The content as text (the task definition is UTF-16)."""
        return self.content.decode("utf-16" if self.content.startswith(b"\xff\xfe") else "utf-8")


@dataclass(frozen=True)
class Plan:
    """What install or uninstall does, in order: ``before``, then the files and folders, then ``after``."""

    platform: str
    before: tuple[Command, ...] = ()
    files: tuple[NewFile, ...] = ()
    folders: tuple[Path, ...] = ()
    """Folders to create (the log folder)."""
    remove: tuple[Path, ...] = ()
    """Files to remove (uninstall)."""
    after: tuple[Command, ...] = ()


def _systemctl(*words: str, may_fail: bool = False) -> Command:
    return Command(("systemctl", "--user", *words), may_fail)


def agent_launch(host: Host, settings: InstallSettings) -> AgentLaunch:
    """How the service starts the agent on ``host``."""
    if host.platform != "windows":
        environment = tuple((name, host.env[name]) for name in PASSED_ENVIRONMENT if name in host.env)
        return AgentLaunch(host.python, str(settings.identity_dir), str(settings.config_file), environment)

    def windows(path: Path) -> str:  # a Windows path, also where another OS shows a Windows install (--platform)
        return str(PureWindowsPath(str(path)))

    return AgentLaunch(
        host.python,
        windows(settings.identity_dir),
        windows(settings.config_file),
        log_file=windows(host.local_appdata() / "shoal" / "logs" / "agent.log"),
    )


def install_plan(host: Host, settings: InstallSettings, templates: Path | None = None) -> Plan:
    """What ``shoal service install`` writes and runs on ``host`` (``templates``: the packaging folder)."""
    launch = agent_launch(host, settings)
    config = NewFile(settings.config_file, STARTER_CONFIG.encode(), only_if_missing=True)
    service = host.service_file()
    log_folder = host.log_folder()
    if host.platform == "linux":
        unit = systemd_unit(template("linux", templates), launch, settings.memory_high)
        after = [
            _systemctl("daemon-reload"),
            _systemctl("enable", UNIT),
            _systemctl("restart", UNIT),  # a running agent restarts with the new unit and settings
        ]
        if settings.serve_logged_out:
            after.append(Command(("loginctl", "enable-linger")))
        return Plan("linux", (), (NewFile(service, unit.encode()), config), (), (), tuple(after))
    assert log_folder is not None  # macOS and Windows keep the log in a file
    if host.platform == "macos":
        plist = launchd_plist(template("macos", templates), launch, str(log_folder / "agent.log"))
        domain = f"gui/{host.uid}"
        return Plan(
            "macos",
            (Command(("launchctl", "bootout", f"{domain}/{LABEL}"), may_fail=True),),  # an older one, if loaded
            (NewFile(service, plist.encode()), config),
            (log_folder,),
            (),
            (
                Command(("launchctl", "enable", f"{domain}/{LABEL}")),
                Command(("launchctl", "bootstrap", domain, str(service))),
            ),
        )
    working = str(PureWindowsPath(str(host.data_dir)))
    task = task_xml(template("windows", templates), launch, host.user, working)
    return Plan(
        "windows",
        (Command(("schtasks", "/End", "/TN", TASK), may_fail=True),),
        (NewFile(service, task), config),
        (log_folder,),
        (),
        (
            Command(("schtasks", "/Create", "/TN", TASK, "/XML", str(service), "/F")),
            Command(("schtasks", "/Run", "/TN", TASK)),
        ),
    )


def uninstall_plan(host: Host, record: Mapping[str, Any]) -> Plan:
    """What ``shoal service uninstall`` runs and removes: the service, then the files install wrote that
    nobody changed since (``record``: install's record, empty if there is none)."""
    files = [Path(p) for p in record.get("files", {})] or [host.service_file()]
    if host.platform == "linux":
        after = [_systemctl("daemon-reload", may_fail=True)]
        if record.get("linger"):
            after.append(Command(("loginctl", "disable-linger")))
        before = (_systemctl("disable", "--now", UNIT, may_fail=True),)
        return Plan("linux", before, remove=tuple(files), after=tuple(after))
    if host.platform == "macos":
        return Plan(
            "macos", (Command(("launchctl", "bootout", f"gui/{host.uid}/{LABEL}"), may_fail=True),), remove=tuple(files)
        )
    stop = (
        Command(("schtasks", "/End", "/TN", TASK), may_fail=True),
        Command(("schtasks", "/Delete", "/TN", TASK, "/F"), may_fail=True),
    )
    return Plan("windows", stop, remove=tuple(files))


@dataclass(frozen=True)
class Ran:
    """A command's outcome."""

    returncode: int
    stdout: str = ""
    stderr: str = ""


class Runner(Protocol):
    """Runs the service manager's commands (the tests record them instead)."""

    def which(self, tool: str) -> str | None: ...

    def run(self, argv: Sequence[str]) -> Ran: ...


class SystemRunner:
    """The real commands of this PC."""

    def which(self, tool: str) -> str | None:
        return shutil.which(tool)

    def run(self, argv: Sequence[str]) -> Ran:
        try:
            done = subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Ran(127, "", str(exc))
        return Ran(done.returncode, done.stdout, done.stderr)


def require_tool(host: Host, runner: Runner, tool: str | None = None) -> None:
    """Refuse in one line where the platform's service tool is missing."""
    tool = tool or TOOLS[host.platform]
    if runner.which(tool) is None:
        what = {
            "systemctl": "systemd",
            "loginctl": "systemd-logind",
            "launchctl": "launchd",
            "schtasks": "Task Scheduler",
        }
        raise ServiceError(
            f"{tool} is not on this PC, so shoal cannot install a {what[tool]} service here: start `shoal agent` "
            "some other way (packaging/README.md)"
        )


def _first_line(ran: Ran) -> str:
    text = (ran.stderr or ran.stdout).strip()
    return text.splitlines()[0] if text else f"exit status {ran.returncode}"


def _run(runner: Runner, command: Command) -> Ran:
    ran = runner.run(command.argv)
    if ran.returncode != 0 and not command.may_fail:
        raise ServiceError(f"{shown(command.argv)} failed: {_first_line(ran)}")
    log.debug("ran %s: exit %d", shown(command.argv), ran.returncode)
    return ran


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _missing_parents(path: Path) -> list[Path]:
    """The folders that creating ``path`` (a folder) creates, outermost first."""
    made = []
    while not path.exists() and path != path.parent:
        made.append(path)
        path = path.parent
    return made[::-1]


def read_record(host: Host) -> dict[str, Any]:
    """Install's record on this PC (empty: none, or unreadable)."""
    try:
        record = json.loads((host.data_dir / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _check_manager(host: Host, runner: Runner) -> None:
    """The service manager must answer before anything is written (Linux: a user manager may not run, e.g.
    over ssh without a login session)."""
    if host.platform == "linux":
        ran = runner.run(("systemctl", "--user", "show", "--property=Version"))
        if ran.returncode != 0:
            raise ServiceError(
                f"systemctl --user does not reach your user's service manager ({_first_line(ran)}): log in to a "
                "session of this PC (or run `loginctl enable-linger` once) and try again"
            )


def apply_install(host: Host, plan: Plan, settings: InstallSettings, runner: Runner) -> list[str]:
    """Carry out an install plan; returns what it did, one line each."""
    require_tool(host, runner)
    if settings.serve_logged_out:
        require_tool(host, runner, "loginctl")
    _check_manager(host, runner)
    record = read_record(host)
    files: dict[str, str] = dict(record.get("files", {}))
    folders: list[str] = list(record.get("folders", []))
    done = []
    for command in plan.before:
        _run(runner, command)
    for folder in [*(f.path.parent for f in plan.files), *plan.folders, host.data_dir]:
        made = _missing_parents(folder)
        folders += [str(p) for p in made if str(p) not in folders]
        folder.mkdir(parents=True, exist_ok=True)
    for new in plan.files:
        if new.only_if_missing and new.path.exists():
            done.append(f"kept {new.path} (yours)")
            continue
        new.path.write_bytes(new.content)
        files[str(new.path)] = _sha256(new.content)
        done.append(f"wrote {new.path}")
    linger = bool(record.get("linger"))
    if host.platform == "linux" and settings.serve_logged_out and not linger:
        ran = runner.run(("loginctl", "show-user", str(host.uid), "--property=Linger", "--value"))
        linger = ran.stdout.strip() != "yes"  # ours to undo only if it was off
    elif host.platform == "linux" and not settings.serve_logged_out and linger:
        _run(runner, Command(("loginctl", "disable-linger")))
        linger = False
    record = {
        "platform": host.platform,
        "files": files,
        "folders": folders,
        "linger": linger,
        "identity": str(settings.identity_dir),
        "config": str(settings.config_file),
    }
    (host.data_dir / RECORD).write_text(json.dumps(record, indent=1), encoding="utf-8")
    for command in plan.after:
        _run(runner, command)
        done.append(f"ran {shown(command.argv)}")
    return done


def apply_uninstall(host: Host, plan: Plan, runner: Runner) -> list[str]:
    """Carry out an uninstall plan: stop and remove the service, then the files and folders install made
    (a settings file changed since stays: it is the donor's now)."""
    require_tool(host, runner)
    record = read_record(host)
    written: Mapping[str, str] = record.get("files", {})
    done = []
    for command in plan.before:
        if (ran := _run(runner, command)).returncode != 0:
            done.append(f"{shown(command.argv)}: {_first_line(ran)} (went on)")
    for path in plan.remove:
        if not path.exists():
            continue
        digest = written.get(str(path))
        if path != host.service_file() and digest is not None and _sha256(path.read_bytes()) != digest:
            done.append(f"kept {path}: changed since install")
            continue
        path.unlink()
        done.append(f"removed {path}")
    for command in plan.after:
        _run(runner, command)
    (host.data_dir / RECORD).unlink(missing_ok=True)
    for folder in sorted(map(Path, record.get("folders", [])), key=lambda p: len(p.parts), reverse=True):
        try:
            folder.rmdir()  # only if empty: the agent's logs, say, stay
        except OSError:
            continue
    return done


DRY = "=== "
"""What starts every line of a dry run that is not a file's content (which it shows verbatim)."""


def dry_run_lines(plan: Plan) -> list[str]:
    """Exactly what a plan would write and run, for ``--dry-run``."""

    def runs(commands: tuple[Command, ...]) -> list[str]:
        return [f"{DRY}would run{' (may fail)' if c.may_fail else ''}: {shown(c.argv)}" for c in commands]

    lines = [f"{DRY}dry run ({plan.platform}): nothing is written or run", *runs(plan.before)]
    lines += [f"{DRY}would create the folder {folder}" for folder in plan.folders]
    for new in plan.files:
        lines.append(f"{DRY}would write {new.path}{' (if it does not exist)' if new.only_if_missing else ''}:")
        lines.append(new.text().rstrip("\n"))
    lines += [f"{DRY}would remove {path}" for path in plan.remove]
    return lines + runs(plan.after)


def service_state(host: Host, runner: Runner) -> str:
    """The service manager's word on the agent's service: running or not, since when."""
    if host.platform == "linux":
        properties = "LoadState,ActiveState,SubState,MainPID,ActiveEnterTimestamp,NRestarts"
        ran = runner.run(("systemctl", "--user", "show", UNIT, f"--property={properties}"))
        return systemd_state(ran.stdout) if ran.returncode == 0 else f"unknown ({_first_line(ran)})"
    if host.platform == "macos":
        ran = runner.run(("launchctl", "print", f"gui/{host.uid}/{LABEL}"))
        return launchd_state(ran.stdout) if ran.returncode == 0 else "not loaded"
    ran = runner.run(("schtasks", "/Query", "/TN", TASK, "/FO", "CSV", "/V", "/NH"))
    return task_state(ran.stdout) if ran.returncode == 0 else "not registered"


def systemd_state(show: str) -> str:
    """``systemctl show``'s properties, for a person."""
    values = dict(line.partition("=")[::2] for line in show.splitlines() if "=" in line)
    if values.get("LoadState") != "loaded":
        return f"not installed ({values.get('LoadState', 'unknown')})"
    state = f"{values.get('ActiveState')} ({values.get('SubState')})"
    if values.get("ActiveState") == "active":
        state += f" since {values.get('ActiveEnterTimestamp')}, pid {values.get('MainPID')}"
    return state + f", restarted {values.get('NRestarts', '0')} times"


def launchd_state(printed: str) -> str:
    """``launchctl print``'s state and pid, for a person."""
    values = {}
    for line in printed.splitlines():
        key, sep, value = line.strip().partition(" = ")
        if sep and key in ("state", "pid", "last exit code") and key not in values:
            values[key] = value
    state = values.get("state", "unknown")
    if "pid" in values:
        state += f", pid {values['pid']}"
    return state + (f", last exit {values['last exit code']}" if "last exit code" in values else "")


def task_state(csv_text: str) -> str:
    """``schtasks /Query /FO CSV /V /NH``'s status and last run (columns 4 and 6; their words are in the
    language of Windows)."""
    rows = [row for row in csv.reader(io.StringIO(csv_text)) if len(row) > 5]
    if not rows:
        return "unknown"
    return f"{rows[0][3]}, last run {rows[0][5]}"


def agent_state(identity_dir: Path) -> str:
    """The agent running with this identity: its process, since when, and what its status says it serves."""
    import psutil

    from agent.node.running import RUNNING_FILE

    try:
        record = json.loads((identity_dir / RUNNING_FILE).read_text(encoding="utf-8"))
        pid = int(record["pid"])
        started = psutil.Process(pid).create_time()
    except (OSError, ValueError, KeyError, TypeError):
        return f"no agent runs with the identity {identity_dir}"
    except psutil.Error:
        return f"not running: its record names process {record['pid']}, which is gone (it did not stop cleanly)"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started))
    return f"pid {pid} since {since}: " + "; ".join(_status_lines(identity_dir))


def _status_lines(identity_dir: Path) -> list[str]:
    """The first lines of ``shoal status`` for the agent running with this identity."""
    from agent.addresses import parse_address
    from agent.cli.status_cmd import status_lines
    from agent.cli.status_link import fetch_status
    from agent.fleet import NodeIdentity
    from agent.node.running import running_agent

    address = running_agent(identity_dir)
    if address is None:
        return ["no address recorded"]
    try:
        status = asyncio.run(fetch_status(parse_address(address), NodeIdentity.load(identity_dir), timeout=5.0))
    except (ShoalError, OSError, TimeoutError) as exc:
        return [f"not answering at {address} ({exc})"]
    return [line.strip() for line in status_lines(address, status)[:2]]


def status_lines_of(host: Host, runner: Runner) -> list[str]:
    """``shoal service status``: installed? running, since when, serving what, and where the logs are."""
    require_tool(host, runner)
    record = read_record(host)
    service = host.service_file()
    if not record and not service.exists():
        return ["shoal service: not installed (shoal service install)"]
    lines = [f"shoal service: {service}", f"  service: {service_state(host, runner)}"]
    if "identity" in record:
        lines.append(f"  agent: {agent_state(Path(record['identity']))}")
        lines.append(f"  settings: {record.get('config')}")
    lines.append(f"  logs: {host.logs()}")
    return lines


def add_parser(sub: Subcommands) -> None:
    """Register ``shoal service install | status | uninstall``."""
    p = sub.add_parser(
        "service",
        help="run the agent in the background at every logon, at low priority (systemd, launchd, Task Scheduler)",
    )
    service = p.add_subparsers(dest="service_command", required=True)
    s = service.add_parser(
        "install", help="start the agent now and at every logon; again: restart it with new settings"
    )
    s.add_argument("--identity", type=Path, default=None, help="this PC's identity folder (default: the one enrolled)")
    s.add_argument(
        "--config",
        type=Path,
        default=None,
        help="the agent's settings file (default: agent.toml in the settings folder)",
    )
    s.add_argument(
        "--memory-high",
        default="75%",
        metavar="SIZE",
        help="Linux: memory above which the agent's is reclaimed first (8G, 75%%, infinity; default 75%%)",
    )
    s.add_argument(
        "--serve-logged-out",
        action="store_true",
        help="Linux: keep serving after logout (loginctl enable-linger; no input to watch then)",
    )
    s.add_argument("--dry-run", action="store_true", help="print what it would write and run, and do nothing")
    s.add_argument("--platform", choices=PLATFORMS, default=None, help="with --dry-run: show another OS's files")
    service.add_parser("status", help="installed? running since when, serving what, where the logs are")
    s = service.add_parser("uninstall", help="stop the agent's service and remove what install wrote, nothing else")
    s.add_argument("--dry-run", action="store_true", help="print what it would remove and run, and do nothing")
    s.add_argument("--platform", choices=PLATFORMS, default=None, help="with --dry-run: another OS's steps")


def run_service(
    args: argparse.Namespace, data_dir: Path, runner: Runner | None = None, host: Host | None = None
) -> int:
    """``shoal service ...`` on this PC (``runner``, ``host``: the tests' own)."""
    host = host or Host.this_pc(data_dir)
    runner = runner or SystemRunner()
    platform = getattr(args, "platform", None)
    if platform is not None:
        if not args.dry_run:
            raise ServiceError("--platform only shows another OS's files: add --dry-run")
        host = replace(host, platform=platform)
    if args.service_command == "status":
        print("\n".join(status_lines_of(host, runner)))
        return 0
    if args.service_command == "uninstall":
        plan = uninstall_plan(host, read_record(host))
        if args.dry_run:
            print("\n".join(dry_run_lines(plan)))
            return 0
        for line in apply_uninstall(host, plan, runner):
            print(line)
        print("shoal service: uninstalled")
        return 0
    settings = InstallSettings(
        _identity(args.identity, host),
        args.config or host.config_dir / "agent.toml",
        memory_high(args.memory_high),
        args.serve_logged_out,
    )
    plan = install_plan(host, settings)
    if args.dry_run:
        print("\n".join(dry_run_lines(plan)))
        return 0
    for line in apply_install(host, plan, settings, runner):
        print(line)
    print(f"shoal service: installed; the agent's log: {host.logs()}; `shoal service status` tells how it runs")
    return 0


def _identity(explicit: Path | None, host: Host) -> Path:
    """The identity folder the service runs with (absolute: the service does not start where we are)."""
    from agent.cli.common import identity_dir
    from agent.errors import FleetError

    try:
        folder = identity_dir(explicit, host.data_dir).absolute()
    except FleetError:
        raise ServiceError(
            "this PC has no identity (or several): enroll it first with `shoal join TOKEN@HOST:PORT`, or pass "
            "--identity DIR"
        ) from None
    if not (folder / "cert.pem").is_file():
        raise ServiceError(f"{folder} holds no node identity (cert.pem): pass the folder `shoal join` made")
    return folder
