"""Where to cut a decoder into stages: contiguous layer ranges with balanced per-token cost.

Decoding is bound by reading weights, so a stage's time per token follows the bytes of weights
it reads. The LM head (vocabulary x width) often weighs as much as several layers, so an even
split by layer count would make the last stage the bottleneck.
"""

from __future__ import annotations

from shards.architecture import ArchSpec
from shards.errors import ExportError

# bytes read per parameter, by export format; int4 exports keep the LM head in int8.
BYTES_PER_PARAM = {"int4": 0.53, "int8": 1.0, "fp16": 2.0, "fp32": 4.0}
HEAD_BYTES_PER_PARAM = {"int4": 1.0, "int8": 1.0, "fp16": 2.0, "fp32": 4.0}


def plan_layer_split(spec: ArchSpec, stages: int, weights: str) -> list[range]:
    """Split ``spec.num_layers`` layers into ``stages`` contiguous non-empty ranges, minimising the
    largest stage's weight bytes (the last stage also reads the LM head)."""
    layers = spec.num_layers
    if stages < 1:
        raise ExportError(f"--stages must be at least 1, not {stages}")
    if stages > layers:
        raise ExportError(f"cannot cut {layers} layers into {stages} stages (at most one stage per layer)")
    layer_cost = spec.layer_param_count() * BYTES_PER_PARAM[weights]
    head_cost = spec.vocab_size * spec.hidden_size * HEAD_BYTES_PER_PARAM[weights]

    def cost(start: int, stop: int) -> float:
        return (stop - start) * layer_cost + (head_cost if stop == layers else 0.0)

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
