"""A stage's decode precision chosen by timing it on this PC, remembered beside the compiled-model cache.

Which precision decodes fastest depends on the CPU: on a Xeon with AMX, f32 activations quantized on the fly
(``RuntimeConfig.precision`` ``auto``) took 15-25 % less time per token than the plugin's bf16 default; on an
AVX-512 BF16 EPYC the plugin's default may win (issue 47). So the first time a stage is compiled on a PC, each
candidate is compiled and timed on a short decode of the real graph, the fastest is kept, and the choice is
written to ``CHOICES_FILE`` in the OpenVINO cache folder: a restart compiles the kept one only. Which candidates
may be timed at all is the caller's business (``agent.runtime.stage.decode_candidates``: never one that would
make an exact stage inexact). Only one-position steps are timed (plain decoding): where ``auto`` was chosen for
cheaper K+1-position verification steps, that is not weighed. This module does not import OpenVINO.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger(__name__)

TIMING_ROUNDS = 5
"""Each candidate is timed once per round, in turn, and its fastest round counts: a PC's speed drifts within
seconds and other work only ever slows a round down, so alternating rounds compare the candidates fairly. Three
rounds of 16 steps once chose ``auto`` for a SmolLM2 stage by 12 % where four later timings chose bf16 by 3-16 %
(and the 3-stage chain decoded 7 % faster in bf16): the choice is kept for good, so it gets more rounds."""

CHOICES_FILE = "precision-choices.json"
"""Where the choices are kept, in the compiled-model cache folder (``RuntimeConfig.cache_dir``)."""


@dataclass(frozen=True)
class PrecisionChoice:
    """The precision a stage decodes in and how it was chosen."""

    precision: str
    """What the decode compilation was given as ``RuntimeConfig.precision``."""
    ms_per_token: Mapping[str, float] = field(default_factory=dict)
    """Each candidate's timed decode step (empty where there was nothing to choose)."""
    measured_now: bool = False
    """Timed on this start; False: read from the cache, or nothing to choose."""

    def describe(self) -> str:
        """One phrase for logs and ``shoal status``: ``bf16 (timed here: bf16 7.90, auto 8.80 ms/token)``."""
        if not self.ms_per_token:
            return self.precision
        timings = ", ".join(f"{name} {ms:.2f}" for name, ms in sorted(self.ms_per_token.items(), key=lambda kv: kv[1]))
        return f"{self.precision} ({'timed now' if self.measured_now else 'timed earlier'} here: {timings} ms/token)"

    def to_json(self) -> dict[str, object]:
        """What ``shoal status`` and ``shoal bench stages --json`` show."""
        return {
            "precision": self.precision,
            "ms_per_token": {k: round(v, 3) for k, v in self.ms_per_token.items()},
            "measured_now": self.measured_now,
        }


def choose_precision(
    key: str, candidates: Sequence[str], measure: Callable[[str], float], cache_dir: Path | None
) -> PrecisionChoice:
    """The fastest of ``candidates`` by ``measure`` (ms per token, called ``TIMING_ROUNDS`` times a candidate in
    alternating rounds, the least counts; ties go to the first), taken from
    ``cache_dir``'s ``CHOICES_FILE`` under ``key`` where it was chosen before, else timed now and written there.

    ``key`` names what the choice holds for: the graph, the device and its settings, the OpenVINO version.
    With one candidate nothing is timed; without ``cache_dir`` nothing is kept (each start times again).
    """
    if not candidates:
        raise ValueError("choose_precision needs at least one candidate")
    if len(candidates) == 1:
        return PrecisionChoice(candidates[0])
    path = cache_dir / CHOICES_FILE if cache_dir is not None else None
    known = _load(path).get(key) if path is not None else None
    if isinstance(known, dict) and known.get("precision") in candidates:
        timings = known.get("ms_per_token")
        kept = {str(k): float(v) for k, v in timings.items()} if isinstance(timings, dict) else {}
        return PrecisionChoice(str(known["precision"]), kept)
    rounds = [{candidate: measure(candidate) for candidate in candidates} for _ in range(TIMING_ROUNDS)]
    timed = {candidate: min(r[candidate] for r in rounds) for candidate in candidates}
    best = min(candidates, key=timed.__getitem__)
    choice = PrecisionChoice(best, timed, measured_now=True)
    if path is not None:
        _store(path, key, choice)
    return choice


def _load(path: Path | None) -> dict[str, object]:
    if path is None or not path.exists():
        return {}
    try:
        loaded = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        log.warning("%s is unreadable (%s): the decode precision is timed again", path, exc)
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _store(path: Path, key: str, choice: PrecisionChoice) -> None:
    """Add ``choice`` under ``key``, written to a unique file and renamed over the old one (another process
    writing at the same time may lose its entry: that stage is then timed again on its next start)."""
    choices = _load(path)
    choices[key] = {"precision": choice.precision, "ms_per_token": dict(choice.ms_per_token)}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.incomplete")
    try:
        partial.write_text(json.dumps(choices, indent=1, sort_keys=True))
        os.replace(partial, path)
    except OSError as exc:
        log.warning("cannot keep the decode precision choice in %s (%s): it is timed again on restart", path, exc)
