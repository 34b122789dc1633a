"""Where to cut a decoder into stages: contiguous layer ranges with balanced per-token cost.

Decoding one token reads every weight once, so a stage's time per token is mostly the bytes of
weights it reads, plus a fixed cost per layer (norms, rotary embedding, attention over the cache,
a dozen kernel launches) that dominates small models. The LM head (vocabulary x width) often
costs as much as several layers, so an even split by layer count would make the last stage the
bottleneck. The head of a conversation also runs its generation loop on the PC of stage 0, so
stage 0 is given a little less.

Costs are in bytes-equivalent (what reading that many int4 weight bytes takes). The constants
fit per-stage decode timings of SmolLM2-135M and Qwen2.5-1.5B int4 exports on one CPU thread
(docs/benchmarks.md, "Where to cut"): an int4 layer costs 0.23 ms + 0.156 ms per MB of its
weights; the LM head 0.106 ms per MB of its int8 weights + 26 ns per vocabulary entry (the logits
it writes): 8.1 layers for SmolLM2, 7.0 for Qwen, where weight bytes alone say 15 and 9.4.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.errors import ExportError
from shards.architecture import ArchSpec

# bytes read per parameter, by export format; int4 exports keep the LM head in int8.
BYTES_PER_PARAM = {"int4": 0.53, "int8": 1.0, "fp16": 2.0, "fp32": 4.0}
HEAD_BYTES_PER_PARAM = {"int4": 1.0, "int8": 1.0, "fp16": 2.0, "fp32": 4.0}
LAYER_OVERHEAD_BYTES = 1.5e6
"""The fixed per-token cost of one layer, whatever its width (0.23 ms at 0.156 ms per MB)."""
HEAD_READ_FACTOR = {"int4": 0.68, "int8": 1.0, "fp16": 1.0, "fp32": 1.0}
"""The int8 LM head of an int4 export reads faster per byte than group-wise int4 layers (no unpacking)."""
HEAD_BYTES_PER_LOGIT = 164.0
"""Writing one logit (f32) and its share of the final norm, per vocabulary entry."""
HEAD_LOOP_BYTES = 10e6
"""The conversation head's own work per token on stage 0's PC (loop, wire, drafting; ~1.5 ms)."""


@dataclass(frozen=True)
class StageCostModel:
    """Per-token cost, in bytes-equivalent, of one decoder layer and of the final norm + LM head."""

    layer: float
    head: float

    @classmethod
    def of(cls, spec: ArchSpec, weights: str) -> StageCostModel:
        return cls(
            layer=spec.layer_param_count() * BYTES_PER_PARAM[weights] + LAYER_OVERHEAD_BYTES,
            head=(
                spec.vocab_size * spec.hidden_size * HEAD_BYTES_PER_PARAM[weights] * HEAD_READ_FACTOR[weights]
                + spec.vocab_size * HEAD_BYTES_PER_LOGIT
            ),
        )

    def stage(self, layers: int, holds_head: bool) -> float:
        """The compute of a stage of ``layers`` layers (plus the LM head if it holds it) per decoded token."""
        return layers * self.layer + (self.head if holds_head else 0.0)


def plan_layer_split(spec: ArchSpec, stages: int, weights: str) -> list[range]:
    """Split ``spec.num_layers`` layers into ``stages`` contiguous non-empty ranges, minimising the
    largest stage's cost per token (the last stage also runs the LM head; with more than one
    stage, the first also carries the conversation head's loop)."""
    layers = spec.num_layers
    if stages < 1:
        raise ExportError(f"--stages must be at least 1, not {stages}")
    if stages > layers:
        raise ExportError(f"cannot cut {layers} layers into {stages} stages (at most one stage per layer)")
    model = StageCostModel.of(spec, weights)

    def cost(start: int, stop: int) -> float:
        loop = HEAD_LOOP_BYTES if start == 0 and stop < layers else 0.0
        return model.stage(stop - start, stop == layers) + loop

    # best[s][i]: minimal max-cost of cutting the first i layers into s stages; small sizes only.
    inf = float("inf")
    best = [[inf] * (layers + 1) for _ in range(stages + 1)]
    cut = [[0] * (layers + 1) for _ in range(stages + 1)]
    best[0][0] = 0.0
    for s in range(1, stages + 1):
        for i in range(s, layers + 1):
            for j in range(s - 1, i):
                value = max(best[s - 1][j], cost(j, i))
                # prefer later cuts on ties so earlier stages (which also run the head's loop) stay light
                if value < best[s][i] or (value == best[s][i] and j > cut[s][i]):
                    best[s][i], cut[s][i] = value, j
    ranges: list[range] = []
    stop = layers
    for s in range(stages, 0, -1):
        start = cut[s][stop]
        ranges.append(range(start, stop))
        stop = start
    return ranges[::-1]


def layer_split_from_counts(spec: ArchSpec, counts: tuple[int, ...]) -> list[range]:
    """The contiguous layer ranges of stages holding ``counts`` layers each, in order (an admin's pinned
    cut, where the planner's cost model does not fit the fleet's PCs)."""
    if not counts or any(c < 1 for c in counts):
        raise ExportError(f"--layers needs one positive layer count per stage, not {','.join(map(str, counts))}")
    if sum(counts) != spec.num_layers:
        raise ExportError(
            f"--layers {','.join(map(str, counts))} adds up to {sum(counts)} layers; the model has {spec.num_layers}"
        )
    ranges, start = [], 0
    for count in counts:
        ranges.append(range(start, start + count))
        start += count
    return ranges
