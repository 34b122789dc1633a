"""A real Hugging Face mirror for tests: olah, serving local git repositories in offline mode.

olah (PyPI ``olah``) lives in a virtualenv of its own, ``.venv-olah`` (``make setup`` makes it: olah's
requirements clash with shoal's). :class:`OlahMirror` writes olah's config, starts ``olah-cli`` as a subprocess,
waits until it answers over HTTP, and stops it. olah serves each git repository ``mirrors/models/ORG/NAME``
(branch ``main``) to the real ``huggingface_hub`` client as if it were on the Hub, and with ``offline = true``
never contacts an upstream. ``shards.hub.publish.publish_to_mirror(export, mirror.mirrors, "ORG/NAME")`` puts an
export there.

For the lab, the server can run inside a network namespace: ``command_prefix=["ip", "netns", "exec", NS]`` with
that host's address as ``host``. The readiness probe then runs inside the namespace too, so the test process
never opens a socket to a lab address.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

import pytest

REPO = Path(__file__).resolve().parents[2]
OLAH_VENV = REPO / ".venv-olah"
INSTALL_HINT = "make .venv-olah/.installed  (make setup, and so make test, creates it)"
LAB_PORT = 8090
"""olah's port when it runs behind a command prefix (a namespace of its own: nothing else listens there)."""

_PROBE = """
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1], timeout=1).close()
except urllib.error.HTTPError:
    pass  # any HTTP answer means the server is up
except OSError:
    sys.exit(1)
"""


class OlahMirror:
    """One olah server over the git repositories under ``root/mirrors``; use ``with`` or start()/stop()."""

    def __init__(
        self,
        root: Path,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        command_prefix: Sequence[str] = (),
        venv: Path = OLAH_VENV,
        startup_timeout: float = 60.0,
    ) -> None:
        self.root = Path(root)
        self.mirrors = self.root / "mirrors"
        """``mirrors-path``: the repositories olah serves (``models/ORG/NAME``)."""
        self.host = host
        self.prefix = list(command_prefix)
        self.port = port if port is not None else (LAB_PORT if self.prefix else _free_port(host))
        self.cli = Path(venv) / "bin" / "olah-cli"
        self.startup_timeout = startup_timeout
        self.config = self.root / "olah.toml"
        self.log_path = self.root / "olah.out"
        self._process: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """The URL to give huggingface_hub (``HF_ENDPOINT`` or ``endpoint=``)."""
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def write_config(self) -> Path:
        """olah's TOML config: this host and port, the mirrors, its own cache folder, offline."""
        for folder in (self.mirrors / "models", self.root / "repos", self.root / "logs"):
            folder.mkdir(parents=True, exist_ok=True)

        def q(value: str) -> str:
            return json.dumps(value)  # a JSON string is a TOML basic string

        self.config.write_text(
            "[basic]\n"
            f"host = {q(self.host)}\n"
            f"port = {self.port}\n"
            f"repos-path = {q(str(self.root / 'repos'))}\n"
            f"mirrors-path = [{q(str(self.mirrors))}]\n"
            # olah builds the URLs it hands out (LFS, redirects) from these; they must name this server
            f'mirror-scheme = "http"\n'
            f"mirror-netloc = {q(f'{self.host}:{self.port}')}\n"
            f"mirror-lfs-netloc = {q(f'{self.host}:{self.port}')}\n"
            "\n[accessibility]\n"
            "offline = true\n"
        )
        return self.config

    def start(self) -> OlahMirror:
        """Start olah and return once it answers HTTP; fails the test (with olah's output) if it does not."""
        if self.running:
            return self
        if not self.cli.is_file():
            pytest.fail(f"olah is not installed ({self.cli} is missing): run `{INSTALL_HINT}`", pytrace=False)
        self.write_config()
        self._log = self.log_path.open("ab")
        argv = [*self.prefix, str(self.cli), "-c", str(self.config), "--log-path", str(self.root / "logs")]
        env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}  # olah talks to no Hub
        env["PYTHONUNBUFFERED"] = "1"  # its access log reaches olah.out as requests come (tests read it)
        self._process = subprocess.Popen(
            argv, cwd=self.root, stdout=self._log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        deadline = time.monotonic() + self.startup_timeout
        while not self._answers():
            if self._process.poll() is not None:
                self._close_log()
                pytest.fail(f"olah exited with {self._process.returncode}:\n{self.log_tail()}", pytrace=False)
            if time.monotonic() > deadline:
                self.stop()
                pytest.fail(
                    f"olah did not answer within {self.startup_timeout:.0f} s:\n{self.log_tail()}", pytrace=False
                )
            time.sleep(0.1)
        return self

    def stop(self) -> None:
        """Terminate olah (then kill it if it lingers); the port is free when this returns."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self._close_log()

    def downloads(self, repo_id: str, revision: str, filename: str) -> int:
        """How many times olah has served ``filename`` of ``repo_id`` at ``revision`` (GETs in its access log)."""
        line = f'"GET /{repo_id}/resolve/{revision}/{filename} HTTP/'
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace").count(line)
        return 0

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no output)"

    def __enter__(self) -> OlahMirror:
        return self.start()

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.stop()

    def _answers(self) -> bool:
        url = self.endpoint + "/"
        if self.prefix:
            # probe from inside the prefix's namespace: the test process opens no socket to a lab address
            probe = subprocess.run([*self.prefix, sys.executable, "-c", _PROBE, url], capture_output=True, timeout=10)
            return probe.returncode == 0
        try:
            urllib.request.urlopen(url, timeout=1).close()
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
