"""Bounds on the CPU plugin's caches of kernels compiled for one input shape, so that an agent's memory stops
growing with every new prompt length it meets (issue 46's drift).

A stage graph has dynamic shapes: each prompt length, and each KV length a decode step attends to, is a shape the
CPU plugin compiles kernels for and keeps, in its runtime cache (``CPU_RUNTIME_CACHE_CAPACITY``, 5,000 entries by
default) and in oneDNN's primitive cache (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``, 1,024). Measured on stage 1 of the
2-stage SmolLM2 int4 export, one thread, 400 prompts of lengths 8-407 (2026-12-06, the 2-core EPYC VM): the process
grew 1,045 MB with the defaults, 413 MB with a runtime cache of 64, 159 MB with both at 64; the prompts took 20.3,
20.7 and 19.9 s, and a decode step 1.77, 1.79 and 1.91 ms (medians of 200; ±8 % between runs). With either cache
at 0 the prompts or the decode steps were 20-85 % slower. One length repeated 200 times grew 55 MB. Through
``CompiledStage`` (stage 1 of the 3-stage export, 200 new lengths with decode and speculative steps,
``python -m tests.support.stage_memory EXPORT 1 1 4 --new-lengths 50 [--unbounded]``): +22 MB bounded, +276 MB
unbounded, both in 14 s. The 3-stage chain's greedy decode, 5 processes of each alternating (/tmp/me/ab_decode.py):
138.1 tok/s bounded, 138.4 unbounded (medians). Decode keeps what it uses every step at the front of both caches;
only the shapes of past prompts fall out.
"""

from __future__ import annotations

import os

RUNTIME_CACHE_ENTRIES = 64
"""Shapes whose kernels the CPU plugin keeps per compiled model (``CPU_RUNTIME_CACHE_CAPACITY``)."""
PRIMITIVE_CACHE_ENTRIES = 64
"""oneDNN primitives kept per process (``ONEDNN_PRIMITIVE_CACHE_CAPACITY``), unless the environment sets it."""


def bound_primitive_cache() -> None:
    """Bound oneDNN's primitive cache for this process, unless its environment already does. oneDNN reads the
    variable when it first creates a primitive: call this before the first compilation."""
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", str(PRIMITIVE_CACHE_ENTRIES))


def cpu_cache_properties() -> dict[str, str]:
    """The compile properties bounding a CPU-compiled model's runtime cache."""
    return {"CPU_RUNTIME_CACHE_CAPACITY": str(RUNTIME_CACHE_ENTRIES)}
