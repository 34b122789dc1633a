"""A donor PC's install: ``pip install shoal`` with no extras gives a ``shoal agent``, ``shoal ask`` and
``shoal status`` that serve and answer through a ring, with no torch, transformers, nncf, optimum or
openvino-genai.

The virtualenv is made from this checkout once per session (pip from the package registry's cache); the
export it serves comes from the full install, as an admin's export would reach a donor.
"""

from __future__ import annotations

import json
import subprocess
import sys
import venv
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.node.launcher import launch_ring
from tests.integration.ring_lab import Fleet

REPO = Path(__file__).parents[2]
EXPORT_ONLY = ("torch", "transformers", "nncf", "optimum", "openvino_genai")


@pytest.fixture(scope="session")
def donor_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with ``pip install <this checkout>`` and nothing else.

    The venv gets no pip of its own (ensurepip takes seconds): this environment's pip installs into it
    (``pip --python``), resolving the same requirements; ``--no-compile`` leaves byte-compiling to the imports.
    """
    root = tmp_path_factory.mktemp("donor") / "venv"
    venv.create(root, with_pip=False)
    pip = [sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install", "-q"]
    pip += ["--disable-pip-version-check", "--no-compile"]
    subprocess.run([*pip, str(REPO)], check=True, timeout=900, capture_output=True, cwd=root.parent)
    return root


def _size_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink()) / 1e6


def test_a_donor_install_has_no_export_packages_and_says_which_extra_export_needs(donor_venv: Path) -> None:
    python = str(donor_venv / "bin" / "python")
    probe = "import importlib.util as u, sys; print([m for m in sys.argv[1:] if u.find_spec(m)])"
    found = subprocess.run(
        [python, "-c", probe, *EXPORT_ONLY], capture_output=True, encoding="utf-8", errors="replace", check=True
    )
    assert found.stdout.strip() == "[]"
    export = subprocess.run(
        [
            str(donor_venv / "bin" / "shoal"),
            "export",
            "smollm2",
            "--stages",
            "2",
            "--out",
            str(donor_venv.parent / "x"),
        ],
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=120,
    )
    assert export.returncode == 1
    assert "pip install 'shoal[export]'" in export.stderr and "Traceback" not in export.stderr
    print(f"donor venv: {_size_mb(donor_venv):.0f} MB")  # -s shows it; the README gives the measured size


@pytest.fixture(scope="module")
def donor_ring(
    donor_venv: Path,
    exported: Callable[..., Path],
    fleet: Fleet,
    cache_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[object], Path]]:
    chat_file = tmp_path_factory.mktemp("donor-chat") / "chat.json"
    identities = [fleet.identity(f"donor{stage}").cert.parent for stage in range(2)]
    agents = launch_ring(
        exported(2, "fp32"),
        identities,
        cache_dir,
        chat_file=chat_file,
        extra_args=["--device", "CPU", "--precision", "f32"],
        python=str(donor_venv / "bin" / "python"),
    )
    yield agents, chat_file  # type: ignore[misc]
    for agent in agents:
        agent.stop()  # type: ignore[attr-defined]


def test_a_donor_install_serves_answers_and_reports_status(
    donor_venv: Path, donor_ring: tuple[list[object], Path], fleet: Fleet
) -> None:
    agents, chat_file = donor_ring
    shoal = str(donor_venv / "bin" / "shoal")
    answer = subprocess.run(
        [shoal, "ask", "What is the capital of France?", "--chat-file", str(chat_file), "--max-tokens", "12"],
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=180,
    )
    assert answer.returncode == 0, answer.stderr
    assert "Paris" in answer.stdout
    last = agents[-1].address  # type: ignore[attr-defined]
    status = subprocess.run(
        [
            shoal,
            "status",
            f"{last[0]}:{last[1]}",
            "--identity",
            str(fleet.identity("donor-status").cert.parent),
            "--json",
        ],
        capture_output=True,
        encoding="utf-8",
        errors="replace",
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    shown = report[0] if isinstance(report, list) else report
    assert shown["stages"] == [1] and shown["is_last"] and shown["steps_served"] > 0, shown
    assert all(agent.process.args[0] == str(donor_venv / "bin" / "python") for agent in agents)  # type: ignore[attr-defined]
