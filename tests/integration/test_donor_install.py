"""A donor PC's install: shoal with no extras gives a ``shoal agent``, ``shoal ask`` and ``shoal status`` that
serve and answer through a ring, with no torch, transformers, nncf, optimum or openvino-genai, and a
``shoal service install`` that finds its templates in the wheel.

The virtualenv is made once per session the locked way of packaging/README.md: the wheel and sdist built from
this checkout (``python -m build``: the wheel from the sdist, so the sdist is complete), the lock's pinned and
hashed dependencies (``pip install --require-hashes -r packaging/requirements-donor.txt``), then the wheel with
``--no-deps``. The export it serves comes from the full install, as an admin's export would reach a donor.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import venv
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.node.launcher import launch_ring
from tests.integration.ring_lab import Fleet

pytestmark = pytest.mark.processes

REPO = Path(__file__).parents[2]
EXPORT_ONLY = ("torch", "transformers", "nncf", "optimum", "openvino_genai")


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder holding the sdist and the wheel that ``python -m build`` makes of this checkout."""
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(REPO)], check=True, timeout=600, capture_output=True
    )
    return out


@pytest.fixture(scope="session")
def donor_venv(tmp_path_factory: pytest.TempPathFactory, built: Path) -> Path:
    """A fresh virtualenv with the donor lock's packages and the built wheel, nothing else.

    The venv gets no pip of its own (ensurepip takes seconds): this environment's pip installs into it
    (``pip --python``); ``--no-compile`` leaves byte-compiling to the imports.
    """
    root = tmp_path_factory.mktemp("donor") / "venv"
    venv.create(root, with_pip=False)
    pip = [sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install", "-q"]
    pip += ["--disable-pip-version-check", "--no-compile"]
    lock = REPO / "packaging" / "requirements-donor.txt"
    subprocess.run([*pip, "--require-hashes", "-r", str(lock)], check=True, timeout=900, capture_output=True)
    (wheel,) = built.glob("shoal-*.whl")
    subprocess.run([*pip, "--no-deps", str(wheel)], check=True, timeout=300, capture_output=True)
    return root


def test_the_sdist_and_the_wheel_carry_the_service_templates(built: Path) -> None:
    import tarfile
    import zipfile

    templates = ["linux/shoal-agent.service", "macos/local.shoal.agent.plist", "windows/shoal-agent.xml"]
    (wheel,) = built.glob("shoal-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert all(any(n.endswith(f".data/data/share/shoal/packaging/{t}") for n in names) for t in templates), names
    assert not [n for n in names if n.startswith(("tests/", "bench/", "packaging/"))]
    (sdist,) = built.glob("shoal-*.tar.gz")
    with tarfile.open(sdist) as archive:
        members = archive.getnames()
    assert all(any(m.endswith(f"/packaging/{t}") for m in members) for t in templates), members


def test_the_wheel_installed_by_the_lock_runs_and_plans_its_service(donor_venv: Path, tmp_path: Path) -> None:
    shoal = str(donor_venv / "bin" / "shoal")
    version = subprocess.run([shoal, "--version"], capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.strip() == "shoal 0.1.0", version
    identity = tmp_path / "identity"
    identity.mkdir()
    (identity / "cert.pem").write_text("not read by a dry run", encoding="utf-8")
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    dry = subprocess.run(
        [shoal, "service", "install", "--identity", str(identity), "--dry-run"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    unit = tmp_path / ".config" / "systemd" / "user" / "shoal-agent.service"
    assert f"=== would write {unit}:" in dry.stdout
    python = donor_venv / "bin" / "python"
    assert f"ExecStart={python} -m agent.cli.main agent --identity {identity} --config " in dry.stdout
    assert not unit.exists()


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
