"""How stages are compiled on this PC (``RuntimeConfig``) and the names its settings take.

This module does not import OpenVINO, so the command line and the configuration can use it on any PC.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agent.errors import RuntimeStageError

KNOWN_DEVICES = ("AUTO", "CPU", "GPU", "NPU")
PRECISIONS = ("auto", "f32", "bf16", "f16")
REWINDS = ("auto", "mask", "compact")
PREFILL_ATTENTIONS = ("paged", "sdpa")
KV_MODES = ("state", "paged")
DEFAULT_KV_POSITIONS = 65536
"""The positions of a paged stage's KV pool where nothing sized it from the memory a PC offers."""


@dataclass(frozen=True)
class RuntimeConfig:
    """How stages are compiled on this PC."""

    device: str = "AUTO"
    threads: int | None = None
    """CPU inference threads; None lets OpenVINO decide."""
    cache_dir: Path | None = None
    """OpenVINO compiled-model cache; a restart then skips compilation."""
    precision: str = "auto"
    """Inference precision: ``auto``, or ``f32``, ``bf16``, ``f16`` throughout. ``auto`` on the CPU with
    int4/int8 weights computes with f32 activations, which the plugin quantizes to int8 on the fly for
    its int8 kernels (measured on a Xeon with AMX: 15-25 % less time per token than its bf16 default,
    and verifying K+1 positions at once costs far less); elsewhere ``auto`` is the plugin's default. With
    ``tune_precision``, where that default is not f32, both are timed on the first compilation on a PC and the
    faster kept (``agent.runtime.tuning``), unless the default would make the stage less exact.
    In bf16, or with activations quantized on the fly, the CPU plugin rounds differently where a graph
    is cut into stages: only ``f32`` makes a split int4/int8 export token-identical to its 1-stage export."""
    tune_precision: bool = False
    """Choose ``auto``'s decode precision by timing on this PC (cached with the compiled models). Off by default:
    processes that time on their own may choose differently, and then compute other tokens than an in-process
    run of the same export (the lab's ring against its reference did, at the 12th token)."""
    prefill_attention: str = "paged"
    """What long steps (prompts) attend through (``PREFILL_ATTENTIONS``). ``paged``, on the CPU: a second
    compilation of the stage graph with OpenVINO's PagedAttention, made on the stage's first long step, the KV
    state moved across (``agent.runtime.paged_prefill``): 2.0x faster than the SDPA graph on a 2,048-token
    prompt on a 2-core AVX2 EPYC (docs/benchmarks.md), for a second copy of the stage's packed weights in
    memory. ``sdpa``: every step on the one compilation (other devices always)."""
    fast_prefill: bool = True
    """With ``auto`` on the CPU and int4/int8 weights: the paged prefill compilation computes in the plugin's
    default precision (its KV blocks too), decoding stays in f32 activations. bf16 prefill was 1.6x (500 prompt
    tokens) to 2.5-3x (2,000) faster on a 2-core Xeon VM with AMX (docs/prefill-profile.md); it is the default
    since the paged compilation is a second copy of the weights anyway. Where the plugin's default is f32 (a CPU
    without bf16 or f16), nothing changes. False: prompts in f32 activations like decoding."""
    rewind: str = "auto"
    """How a session forgets rejected drafts (``REWINDS``). ``mask``: they stay in the KV state, masked
    out of attention; free. ``compact``: they are cut out of the state, one copy per rewind (measured on
    a Xeon with AMX, 250 positions: ~5 ms for 12 SmolLM2 layers, ~6 ms for 11 Qwen-1.5B layers).
    What keeps speculative greedy decoding token-identical to plain decoding (CPU plugin, OpenVINO
    2026.4, measured on SmolLM2): a graph computed in f32 throughout (``precision`` f32, or float
    weights) with either rewind; in lower precisions (activations quantized on the fly, the default for
    int4/int8, or bf16) masked positions move later logits by up to ~0.8, so only compaction on one
    thread is exact; on several threads those precisions also round a step of K+1 positions differently
    from K+1 steps of one, and no rewind is exact. ``auto``: compact where that makes decoding exact
    (CPU, one thread, below f32), else mask."""

    kv: str = "state"
    """Where a stage keeps its sessions' KV (``KV_MODES``). ``state``: each session's own infer request and state,
    on the SDPA compilation (``agent.runtime.session``); steps of several sessions run one after another. ``paged``,
    on the CPU: one PagedAttention compilation and one pool of KV blocks per stage shared by its sessions
    (``agent.runtime.paged_kv``), so that a stage server packs several sessions' steps into one inference
    (``agent.runtime.packed``); other devices keep ``state``. What packing keeps of exactness is measured in
    ``agent.runtime.paged_kv.paged_packs_alike``."""
    kv_positions: int | None = None
    """``kv = "paged"``: the positions a stage's block pool holds for all its sessions together (the pool's memory
    is taken only as blocks are first used); when a step finds no free blocks, sessions parked the longest ago give
    theirs up, else it is answered "fleet busy". None: an agent sizes it from the memory its PC offers
    (``agent.node.config.stage_runtime``); elsewhere ``DEFAULT_KV_POSITIONS``."""

    def __post_init__(self) -> None:
        if self.precision not in PRECISIONS:
            raise RuntimeStageError(f"precision must be one of {', '.join(PRECISIONS)}, not {self.precision!r}")
        if self.prefill_attention not in PREFILL_ATTENTIONS:
            raise RuntimeStageError(
                f"prefill attention must be one of {', '.join(PREFILL_ATTENTIONS)}, not {self.prefill_attention!r}"
            )
        if self.kv not in KV_MODES:
            raise RuntimeStageError(f"kv must be one of {', '.join(KV_MODES)}, not {self.kv!r}")
        if self.kv_positions is not None and self.kv_positions < 1:
            raise RuntimeStageError(f"kv positions must be at least 1, not {self.kv_positions}")
        if self.rewind not in REWINDS:
            raise RuntimeStageError(f"rewind must be one of {', '.join(REWINDS)}, not {self.rewind!r}")
