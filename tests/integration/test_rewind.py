"""Acceptance 3: mask-based rewind equals a cache that never saw the rejected tokens."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from agent.errors import RuntimeStageError
from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import LocalPipeline, PipelineSession
from shards.manifest import Manifest

KEPT = [504, 3575]  # two accepted draft tokens
FOLLOW = [[28]]


def _run(session: PipelineSession, prompt: list[int], chunks: list[list[int]], rewind: int = 0) -> np.ndarray:
    session.step(np.asarray([prompt]))
    for chunk in chunks:
        session.step(np.asarray([chunk]))
    session.rewind(rewind)
    return session.step(np.asarray(FOLLOW))[0, -1].copy()


def test_rewind_is_exact(
    exported: Callable[..., Path],
    cache_dir: Path,
    chat_ids: list[list[int]],
    record_property: Callable[[str, object], None],
) -> None:
    stages = 3  # a first, a middle and a last stage: each masks the rejected positions of its own cache
    folder = exported(stages, "fp32")
    pipeline = LocalPipeline(folder, Manifest.load(folder), RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov"))
    prompt = chat_ids[0]

    # Five draft tokens, three rejected: the rejected ones must leave no trace at all, so two
    # sessions that rejected different tokens are bit-identical.
    rewound = _run(pipeline.new_session(), prompt, [[*KEPT, 4649, 314, 7042]], rewind=3)
    rewound_other = _run(pipeline.new_session(), prompt, [[*KEPT, 11, 12, 13]], rewind=3)
    assert np.array_equal(rewound, rewound_other)

    # Against a session that never saw them: equal up to float32 rounding. The CPU kernels round
    # differently for a 5-token than a 2-token chunk; the same noise appears between two clean
    # sessions that feed the kept tokens as one chunk or one by one (the floor printed below).
    clean = _run(pipeline.new_session(), prompt, [KEPT])
    floor = float(np.abs(_run(pipeline.new_session(), prompt, [[t] for t in KEPT]) - clean).max())
    diff = float(np.abs(rewound - clean).max())
    record_property("rewind_max_abs_diff", diff)
    print(f"\n{stages}-stage rewind vs never-saw: max |logit diff| = {diff:.2e}; chunking noise floor {floor:.2e}")
    assert diff < 2e-4
    assert int(rewound.argmax()) == int(clean.argmax())

    # a second round of drafting and rewinding on top of the first stays exact
    session = pipeline.new_session()
    _run(session, prompt, [[*KEPT, 4649, 314, 7042]], rewind=3)
    session.step(np.asarray([[11, 12, 13]]))
    session.rewind(3)
    again = session.step(np.asarray(FOLLOW))[0, -1].copy()
    clean_session = pipeline.new_session()
    _run(clean_session, prompt, [KEPT])
    clean_again = clean_session.step(np.asarray(FOLLOW))[0, -1].copy()
    assert float(np.abs(again - clean_again).max()) < 2e-4


def test_rewind_beyond_length_is_refused(exported: Callable[..., Path], cache_dir: Path) -> None:
    folder = exported(2, "fp32")
    pipeline = LocalPipeline(folder, Manifest.load(folder), RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov"))
    session = pipeline.new_session()
    session.step(np.asarray([[1, 2, 3]]))
    with pytest.raises(RuntimeStageError):
        session.rewind(4)


def test_reset_starts_a_fresh_conversation_and_compiles_from_cache(
    exported: Callable[..., Path], tmp_path: Path, chat_ids: list[list[int]]
) -> None:
    folder = exported(2, "fp32")
    cache = tmp_path / "compiled"
    pipeline = LocalPipeline(folder, Manifest.load(folder), RuntimeConfig(device="CPU", cache_dir=cache))
    assert len(list(cache.glob("*.blob"))) == 2  # one compiled blob per stage, reused on restart
    session = pipeline.new_session()
    first = session.step(np.asarray([chat_ids[1]]))[0, -1].copy()
    session.step(np.asarray([[5, 6, 7]]))
    session.reset()
    assert session.logical_length == 0
    again = session.step(np.asarray([chat_ids[1]]))[0, -1].copy()
    assert np.array_equal(first, again)


@pytest.mark.parametrize("stages", [2, 3])
def test_last_only_computes_the_same_last_logits(
    stages: int, exported: Callable[..., Path], cache_dir: Path, chat_ids: list[list[int]]
) -> None:
    """A prompt's step asks the head graph for the last position's logits only (``logits_index``);
    they equal the last row of a step that computed logits at every position."""
    folder = exported(stages, "fp32")
    manifest = Manifest.load(folder)
    assert "logits_index" in manifest.stages[-1].inputs
    assert all("logits_index" not in s.inputs for s in manifest.stages[:-1])
    pipeline = LocalPipeline(folder, manifest, RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov"))
    prompt = np.asarray([chat_ids[2]])
    full_session, last_session = pipeline.new_session(), pipeline.new_session()
    full = full_session.step(prompt).copy()
    last = last_session.step(prompt, last_only=True).copy()
    assert full.shape[1] == prompt.shape[1] and last.shape[1] == 1
    assert np.array_equal(last[0, -1], full[0, -1])
    # the cache behind it is whole: the next step agrees as well
    after_full = full_session.step(np.asarray(FOLLOW))[0, -1].copy()
    assert np.array_equal(last_session.step(np.asarray(FOLLOW))[0, -1], after_full)
