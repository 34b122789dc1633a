"""StageSession binds its inputs itself, as tensors over arrays it keeps (issue 47): what it hands OpenVINO must
outlive garbage collection, and inputs OpenVINO cannot read in place (read-only frames off the wire, another
dtype) go in as converted copies. Checked against plain ``infer(feed)`` calls on requests of the same compilation."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import numpy as np

from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import CompiledStage, LocalPipeline
from shards.manifest import LOGITS_INDEX, Manifest

PROMPT = np.arange(100, 120, dtype=np.int64)[None]
TOKENS = [310, 4021, 77, 1200]


def _reference(stages: list[CompiledStage]) -> list[np.ndarray]:
    """The last stage's logits for ``PROMPT`` and then each of ``TOKENS``, fed through the binding's own dispatch."""
    requests = [stage.compiled.create_infer_request() for stage in stages]
    logits = []
    for ids in [PROMPT, *(np.array([[t]], dtype=np.int64) for t in TOKENS)]:
        n = ids.shape[1]
        end = PROMPT.shape[1] + len(logits) if logits else n
        x: np.ndarray = ids
        for stage, request in zip(stages, requests, strict=True):
            feed = {
                stage.graph.inputs[0]: x,
                "attention_mask": np.ones((1, end), dtype=np.int64),
                "position_ids": np.arange(end - n, end, dtype=np.int64)[None],
                "beam_idx": np.zeros(1, dtype=np.int32),
            }
            if LOGITS_INDEX in stage.graph.inputs:
                feed[LOGITS_INDEX] = np.array([n - 1], dtype=np.int64)
            x = request.infer(feed)[stage.graph.outputs[0]]
        logits.append(x[0, -1].copy())
    return logits


def test_fed_tensors_outlive_collection_and_foreign_inputs_are_converted(exported: Callable[..., Path]) -> None:
    folder = exported(2, "fp32")
    pipeline = LocalPipeline(folder, Manifest.load(folder), RuntimeConfig(device="CPU", threads=1))
    expected = _reference(pipeline.stages)
    first, second = (stage.new_session() for stage in pipeline.stages)
    got = []
    for step, ids in enumerate([PROMPT, *(np.array([[t]], dtype=np.int64) for t in TOKENS)]):
        hidden = first.step(ids)
        if step % 2:  # as a frame off the wire: read-only bytes
            hidden = np.frombuffer(hidden.tobytes(), dtype=hidden.dtype).reshape(hidden.shape)
        elif step:  # another dtype than the graph's (float64 holds every float32 exactly)
            hidden = hidden.astype(np.float64)
        # what the sessions fed OpenVINO must not be freed and its memory reused before they feed it again
        gc.collect()
        # (numpy keeps freed small buffers by size and hands them out again: clutter of every small size)
        clutter = [np.full(size, 0x7F, dtype=np.uint8) for size in (4, 8, 16, 32, 64, 128, 256) * 100]
        got.append(second.step(hidden, last_only=True)[0, -1].copy())
        del clutter
    for step, (mine, reference) in enumerate(zip(got, expected, strict=True)):
        assert mine.shape == reference.shape
        np.testing.assert_array_equal(mine, reference, err_msg=f"step {step}")
