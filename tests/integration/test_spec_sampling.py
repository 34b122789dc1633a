"""Acceptance 4: speculative sampling keeps the target's distribution, on real model distributions.

Target p: SmolLM2 fp32 at a few positions of a chat prompt; draft q: the int4 1-stage export
at the same positions; both after temperature 1.0 and top-k 40 (the last stage's readout). Many
seeded verification steps; the emitted tokens must fit p (chi-square), and the same test must
reject the rule when it is deliberately broken (and with a tenth of the samples).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from agent.head import speculative
from agent.head.speculative import verify_sampled
from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import LocalPipeline
from agent.sampling.params import SamplingParams, sampling_distribution
from shards.manifest import Manifest
from tests.unit.spec_stats import chi_square_pvalue, emitted_token_histograms
from tests.unit.test_speculative import BROKEN

PARAMS = SamplingParams(temperature=1.0, top_k=40)
SAMPLES = 20_000
BROKEN_SAMPLES = 2_000
"""A broken rule must show within a tenth of the samples: the check at SAMPLES has power to spare."""
POSITIONS = (3, 8, 15)  # where in the prompt the distributions are taken
K = 2


@pytest.fixture(scope="module")
def distributions(
    exported: Callable[..., Path], cache_dir: Path, chat_ids: list[list[int]]
) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    """(p_1..p_{K+1}, q_1..q_K) starting at each of POSITIONS."""

    def logits(folder: Path) -> np.ndarray:
        pipeline = LocalPipeline(folder, Manifest.load(folder), RuntimeConfig(device="CPU", cache_dir=cache_dir / "ov"))
        return pipeline.new_session().step(np.asarray([chat_ids[1]], dtype=np.int64))[0].copy()

    target, draft = logits(exported(2, "fp32")), logits(exported(1, "int4"))
    cases = []
    for start in POSITIONS:
        p = [sampling_distribution(target[start + i], PARAMS) for i in range(K + 1)]
        q = [sampling_distribution(draft[start + i], PARAMS) for i in range(K)]
        cases.append((p, q))
    return cases


def test_speculative_sampling_keeps_the_target_distribution(
    distributions: list[tuple[list[np.ndarray], list[np.ndarray]]],
    record_property: Callable[[str, object], None],
) -> None:
    for index, (p, q) in enumerate(distributions):
        first, second = emitted_token_histograms(verify_sampled, p, q, SAMPLES, seed=100 + index)
        p_first, p_second = chi_square_pvalue(first, p[0]), chi_square_pvalue(second, p[1])
        overlap = float(np.minimum(p[0], q[0]).sum())  # the expected acceptance of the first draft
        print(
            f"\nposition {POSITIONS[index]}: chi-square p-values {p_first:.3f} / {p_second:.3f}, "
            f"draft acceptance ≈ {overlap:.2f}"
        )
        record_property(f"pvalue_{POSITIONS[index]}", p_first)
        assert p_first > 1e-3, f"first emitted token does not follow p at position {POSITIONS[index]}"
        assert second.sum() > 1000 and p_second > 1e-3


@pytest.mark.parametrize("broken", list(BROKEN))
def test_the_check_fails_when_the_rule_is_broken(
    broken: str,
    distributions: list[tuple[list[np.ndarray], list[np.ndarray]]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name, replacement = BROKEN[broken]
    monkeypatch.setattr(speculative, name, replacement)
    pvalues = []
    for index, (p, q) in enumerate(distributions):
        first, _ = emitted_token_histograms(verify_sampled, p, q, BROKEN_SAMPLES, seed=100 + index)
        pvalues.append(chi_square_pvalue(first, p[0]))
    print(f"\n{broken}: p-values {[f'{v:.1e}' for v in pvalues]}")
    assert min(pvalues) < 1e-6, "the statistical check did not notice a broken acceptance rule"
