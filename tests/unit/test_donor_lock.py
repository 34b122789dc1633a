"""The donor install's lock (``packaging/requirements-donor.txt``, ``make lock``) matches pyproject.toml: each base
dependency is pinned there at a version its range admits, every pin carries the hashes ``pip install
--require-hashes`` checks, and nothing of the export's extras slipped in."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).parents[2]
LOCK = REPO / "packaging" / "requirements-donor.txt"
EXPORT_ONLY = {"torch", "transformers", "nncf", "optimum", "optimum-intel", "openvino-genai", "accelerate", "gguf"}


def locked() -> list[tuple[Requirement, list[str]]]:
    """Each pin of the lock with its hashes (a package pinned per Python version appears once per pin)."""
    entries: list[tuple[Requirement, list[str]]] = []
    for block in re.split(r"\n(?=[^\s#])", LOCK.read_text(encoding="utf-8")):
        first, *rest = block.strip().splitlines()
        if first.startswith("#"):
            continue
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", "\n".join(rest))
        entries.append((Requirement(first.rstrip(" \\")), hashes))
    return entries


def test_the_lock_pins_every_base_dependency_within_its_range_with_hashes() -> None:
    base = [
        Requirement(text) for text in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    ]
    pins = locked()
    assert "make lock" in LOCK.read_text(encoding="utf-8").split("\n", 3)[1]  # how to make it again
    for requirement, hashes in pins:
        assert len(requirement.specifier) == 1 and next(iter(requirement.specifier)).operator == "==", requirement
        assert hashes, f"{requirement} has no hash"
    by_name: dict[str, list[str]] = {}
    for requirement, _ in pins:
        by_name.setdefault(canonicalize_name(requirement.name), []).append(next(iter(requirement.specifier)).version)
    for dependency in base:
        versions = by_name.get(canonicalize_name(dependency.name))
        assert versions, f"{dependency.name} is a base dependency but not in the lock: make lock"
        for version in versions:
            assert dependency.specifier.contains(version, prereleases=True), (
                f"the lock pins {dependency.name}=={version}, outside pyproject's {dependency}: make lock"
            )
    assert not EXPORT_ONLY & set(by_name), "the donor's lock holds an export package"
