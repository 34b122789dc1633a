"""The fuzz targets over their committed seed corpus, in the ordinary suite: every seed decodes or raises shoal's
own error, whole and byte by byte alike (``tests/fuzz/targets.py``). ``make fuzz`` grows the corpus with atheris."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.targets import TARGETS

CORPUS = Path(__file__).parent / "corpus"
SEEDS = sorted(p for p in CORPUS.glob("*/*") if p.is_file())


def test_every_target_has_seeds_and_every_seed_a_target() -> None:
    assert {p.parent.name for p in SEEDS} == set(TARGETS)


@pytest.mark.parametrize("seed", SEEDS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_seed_holds_the_invariant(seed: Path) -> None:
    TARGETS[seed.parent.name](seed.read_bytes())


def test_the_wire_seeds_speak_this_protocol_version() -> None:
    # a seed refused at its header covers nothing past it: a new PROTOCOL_VERSION needs the corpus rewritten
    from tests.fuzz.targets import _frames

    stream = max((p for p in SEEDS if p.parent.name == "wire"), key=lambda p: p.stat().st_size)
    frames, error = _frames([stream.read_bytes()])
    assert error is None and len(frames) > 10, f"{error}: rewrite the seeds with `python -m tests.fuzz.seeds`"
