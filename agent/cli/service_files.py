"""The files of ``shoal service``: one template per OS in ``packaging/``, filled with the paths of this install.

Each template marks what an install fills in as ``@NAME@`` (an admin can fill them by hand:
``packaging/README.md``). Filling is pure: values are escaped for the file's syntax (a systemd command line,
a plist, XML), every field of the template must be given and every value used, so a template and this code
cannot drift apart silently.
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PureWindowsPath
from xml.sax.saxutils import escape

from agent.errors import ServiceError

PLATFORMS = ("linux", "macos", "windows")
UNIT = "shoal-agent.service"
"""The systemd user unit's name."""
LABEL = "local.shoal.agent"
"""The launchd job's label (``local.``: a name no vendor owns)."""
TASK = "shoal-agent"
"""The Windows scheduled task's name."""
TEMPLATES = {
    "linux": "linux/shoal-agent.service",
    "macos": "macos/local.shoal.agent.plist",
    "windows": "windows/shoal-agent.xml",
}
"""Each OS's template, relative to the ``packaging`` folder."""
PASSED_ENVIRONMENT = ("SHOAL_DATA_DIR", "SHOAL_CACHE_DIR", "HF_ENDPOINT", "HF_HOME", "HF_HUB_OFFLINE")
"""Variables of the installing shell that the service keeps (systemd and launchd start it without them): the
data and cache folders, and the office's Hub mirror. Windows' tasks see the user's own variables."""
_FIELD = re.compile(r"@([A-Z_]+)@")
_LINE_OR_FIELD = re.compile(r"^[ \t]*@(?P<line>[A-Z_]+)@\n|@(?P<field>[A-Z_]+)@", re.M)
_SHARE = "share/shoal/packaging/"
"""Where a wheel puts ``packaging/`` (pyproject's data-files), relative to its install's prefix."""


@dataclass(frozen=True)
class AgentLaunch:
    """How a service starts the agent: this install's interpreter, the node identity and the config file."""

    python: str
    identity_dir: str
    config_file: str
    environment: tuple[tuple[str, str], ...] = ()
    """Variables set for the agent, beside ``PYTHONUNBUFFERED`` (which every template sets)."""
    log_file: str | None = None
    """Where the agent writes its log itself (``shoal --log-file``): Windows' pythonw has no stdout or stderr."""

    def arguments(self) -> list[str]:
        """The agent's command line. ``python -m agent.cli.main`` rather than the ``shoal`` script: the
        interpreter's path is all an install has for sure (pipx and uv put the script behind a link)."""
        log = ["--log-file", self.log_file] if self.log_file else []
        return [self.python, "-m", "agent.cli.main", *log, "agent", "--identity", self.identity_dir, "--config",
                self.config_file]  # fmt: skip


def packaging_dir() -> Path:
    """The ``packaging`` folder of this install: the wheel's copy (``<prefix>/share/shoal/packaging``), else
    the checkout's (an editable install, a run from the source tree)."""
    try:
        files = importlib.metadata.distribution("shoal").files or []
    except importlib.metadata.PackageNotFoundError:
        files = []
    for file in files:
        posix = file.as_posix()
        if posix.endswith(_SHARE + TEMPLATES["linux"]):
            return Path(str(file.locate())).resolve().parents[1]
    checkout = Path(__file__).resolve().parents[2] / "packaging"
    if (checkout / TEMPLATES["linux"]).is_file():
        return checkout
    raise ServiceError("this install of shoal has no service templates (packaging/): reinstall it (pipx install shoal)")


def template(platform: str, folder: Path | None = None) -> str:
    """The template of ``platform`` (one of :data:`PLATFORMS`)."""
    path = (folder or packaging_dir()) / TEMPLATES[platform]
    return path.read_text(encoding="utf-8")


def fill(text: str, fields: Mapping[str, str]) -> str:
    """``text`` with each ``@NAME@`` replaced by ``fields[NAME]`` (already escaped for the file's syntax). A
    field alone on its line is replaced with that line: its value is whole lines, each ending in a newline,
    or nothing (the line goes).

    A field of the template that is not given, or a value the template has no field for, is our bug:
    ``ServiceError`` says which."""
    named = set(_FIELD.findall(text))
    if named != set(fields):
        missing, unused = sorted(named - set(fields)), sorted(set(fields) - named)
        raise ServiceError(f"the service template and shoal disagree: fields not given {missing}, unused {unused}")
    return _LINE_OR_FIELD.sub(lambda match: fields[match.group("line") or match.group("field")], text)


def systemd_quote(word: str) -> str:
    """One word of a systemd command line (``ExecStart=``): specifiers (``%``) and variables (``$``) kept
    literal, quoted where it holds a space, a quote or a backslash (systemd.syntax(7), systemd.service(5))."""
    word = word.replace("%", "%%").replace("$", "$$")
    if word and not re.search(r"[\s\"'\\;]", word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


_MEMORY = re.compile(r"(\d+(\.\d+)?[KMGT]?|\d+(\.\d+)?%|infinity)")


def memory_high(text: str) -> str:
    """A ``MemoryHigh=`` value: bytes with an optional K/M/G/T suffix, a percentage of the PC's memory, or
    ``infinity`` (systemd.resource-control(5)); anything else raises ``ServiceError``."""
    if not _MEMORY.fullmatch(text):
        raise ServiceError(f"memory limit {text!r}: give bytes with K, M, G or T (8G), a percentage (75%), or infinity")
    return text


def systemd_unit(text: str, launch: AgentLaunch, memory: str) -> str:
    """The systemd user unit from its template ``text``."""
    environment = "".join(f"Environment={systemd_quote(f'{k}={v}')}\n" for k, v in launch.environment)
    return fill(
        text,
        {
            "COMMAND": " ".join(systemd_quote(word) for word in launch.arguments()),
            "ENVIRONMENT": environment,
            "MEMORY_HIGH": memory_high(memory),
        },
    )


def _plist_string(value: str, indent: str) -> str:
    return f"{indent}<string>{escape(value)}</string>\n"


def launchd_plist(text: str, launch: AgentLaunch, log_file: str) -> str:
    """The LaunchAgent's property list from its template ``text``."""
    arguments = "".join(_plist_string(word, "\t\t") for word in launch.arguments())
    environment = "".join(f"\t\t<key>{escape(k)}</key>\n" + _plist_string(v, "\t\t") for k, v in launch.environment)
    return fill(text, {"ARGUMENTS": arguments, "ENVIRONMENT": environment, "LOG_FILE": escape(log_file)})


def pythonw(python: str) -> str:
    """The windowless interpreter beside ``python`` (``pythonw.exe``): a task's console window would stay
    open on the user's desktop."""
    path = PureWindowsPath(python)
    if path.name.lower() == "python.exe":
        return str(path.with_name("pythonw.exe"))
    return python


def task_xml(text: str, launch: AgentLaunch, user: str, working_dir: str) -> bytes:
    """The scheduled task's definition from its template ``text``: UTF-16 with its byte order mark, as
    ``schtasks /Create /XML`` reads it (and as Task Scheduler exports tasks)."""
    arguments = launch.arguments()
    filled = fill(
        text,
        {
            "USER": escape(user),
            "PYTHONW": escape(pythonw(arguments[0])),
            "ARGUMENTS": escape(subprocess.list2cmdline(arguments[1:])),
            "WORKING_DIRECTORY": escape(working_dir),
        },
    )
    return ('<?xml version="1.0" encoding="UTF-16"?>\n' + filled).encode("utf-16")


def shown(argv: Sequence[str]) -> str:
    """A command as a person would type it (for dry runs and errors)."""
    import shlex

    return shlex.join(argv)
