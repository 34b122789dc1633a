"""Long steps (prompts) through OpenVINO's PagedAttention, the KV state moved into the stage's own cache.

A stage graph attends through ``ScaledDotProductAttention`` with its KV cache as OpenVINO state: what
speculative decoding needs (mask or cut rejected drafts, one conversation per request). For a long step the
CPU plugin's f32 SDPA kernel is slow: it takes the query four rows at a time against every key, the masked
half included. Measured on a 2-core AVX2 EPYC, one thread, SmolLM2 int4 at 2,048 prompt tokens: 6.7 s of a
16 s step (docs/benchmarks.md). The plugin's PagedAttention kernel, the one ``openvino_genai`` prefills with,
took 1.6 s for the same attention.

So a CPU stage also compiles its graph after OpenVINO's own SDPA-to-PagedAttention transformation, on its first
long step (``agent.runtime.session.PAGED_MIN_POSITIONS``). A long step runs there: the session's kept positions
are copied from the state into KV blocks, the step appends its own, and the blocks go back into the state,
compacted. The logits agree with the SDPA graph's to about 3e-5 in f32, and a prompt sent in chunks leaves the
same blocks as one step (tests/integration/test_paged_prefill.py), so a step longer than ``INFERENCE_POSITIONS``
runs as several inferences on the same blocks, which is faster. Decoding, drafts and rewinds stay on the SDPA
graph.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import openvino as ov

from agent.errors import RuntimeStageError
from agent.runtime.hidden_precision import Widener, narrow_output, narrows_hidden_states, widens
from shards.manifest import LOGITS_INDEX

_TOKEN_INPUTS = {"input_ids": "input_ids", "hidden_states": "inputs_embeds"}
"""The stage input each kind of stage has, and the name the transformation looks for it under."""
_LAYER = re.compile(r"layers\.(\d+)\.")
_STATE = re.compile(r"past_key_values\.(\d+)\.(key|value)")


@dataclass(frozen=True)
class BlockPrecision:
    """How KV blocks of one element type are held in numpy and crossed to and from the (f32) OpenVINO state."""

    name: str
    """The ``KV_CACHE_PRECISION`` value (``f32``, ``bf16``, ``f16``)."""
    element_type: ov.Type
    dtype: type[np.generic]
    """What numpy holds a block's values in (bf16: their bit patterns, as ``uint16``)."""

    def encode(self, values: np.ndarray) -> np.ndarray:
        """f32 values in this precision, rounded to the nearest (ties to even, as the plugin converts)."""
        if self.element_type != ov.Type.bf16:
            return values.astype(self.dtype)
        bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)

    def tensor(self, blocks: np.ndarray) -> ov.Tensor:
        """``blocks`` (of ``self.dtype``) as a tensor of this element type, sharing their memory. Set as an f32
        state, the plugin converts it exactly (every value of these precisions is one in f32)."""
        return ov.Tensor(blocks, ov.Shape(list(blocks.shape)), self.element_type)


BLOCK_PRECISIONS = {
    "f32": BlockPrecision("f32", ov.Type.f32, np.float32),
    "bf16": BlockPrecision("bf16", ov.Type.bf16, np.uint16),
    "f16": BlockPrecision("f16", ov.Type.f16, np.float16),
}
"""The CPU plugin's PagedAttention wants its KV blocks in the precision it computes in (measured with OpenVINO
2026.4 on a Xeon with AMX: bf16 compute refused f32 blocks)."""

INFERENCE_POSITIONS = 1024
"""The most positions one paged inference takes: a longer step runs as several on the same KV blocks, as chunks
sent one after another would (they leave the same blocks: tests/integration/test_paged_prefill.py). One inference
over a whole long prompt spends more in attention than chunks of it do. Measured on a 2-core Xeon with AMX, one
thread, a 4,095-position prompt in one step: Qwen2.5-Coder-1.5B int4 26.3 / 25.8 s in one inference, 23.4 / 23.4 s
in inferences of at most 1,024 (2,048: 24.2; 512: 23.9), SmolLM2-135M 4.80 / 4.70 s against 4.47 / 4.48 s; the
logits bit-identical; at 2,048 positions the cap made no difference beyond noise."""


@dataclass(frozen=True)
class PagedGraph:
    """A stage graph after the SDPA-to-PagedAttention transformation, and where each layer's KV blocks enter."""

    model: ov.Model
    token_input: str
    """``input_ids`` (``[n]`` ids) or ``inputs_embeds`` (``[n, hidden]``): the step's positions."""
    caches: dict[str, tuple[int, str]]
    """Each ``key_cache.j`` / ``value_cache.j`` input: the stage's local layer and ``key`` or ``value``."""
    width: int | None
    """The hidden size of a stage taking hidden states (None: it takes token ids)."""


def paged_graph(model: ov.Model, stage_input: str) -> PagedGraph:
    """Transform a stage graph (read, not compiled; changed in place) for paged long steps.

    ``stage_input`` is the graph's first input (``input_ids`` or ``hidden_states``). Raises
    ``RuntimeStageError`` when the graph does not take the transformation as expected.
    """
    from openvino._offline_transformations import paged_attention_transformation

    token_input = _TOKEN_INPUTS.get(stage_input)
    if token_input is None:
        raise RuntimeStageError(f"no paged prefill for a stage taking {stage_input!r}")
    # The transformation finds the positions' input by name; a middle stage's hidden states are embeddings.
    param = model.input(stage_input).get_node()
    shape = param.get_output_partial_shape(0)
    width = shape[-1].get_length() if token_input == "inputs_embeds" and shape[-1].is_static else None
    if token_input == "inputs_embeds" and width is None:
        raise RuntimeStageError(f"the stage's hidden states have no fixed width ({shape})")
    param.set_friendly_name(token_input)
    param.output(0).get_tensor().set_names({token_input})
    try:
        paged_attention_transformation(model)
    except RuntimeError as exc:
        raise RuntimeStageError(f"the stage graph does not take PagedAttention: {exc}") from exc
    names = {p.get_any_name() for p in model.inputs}
    if LOGITS_INDEX in names:
        _select_logits_by_token(model)
    caches = _cache_layers(model)
    if not caches:
        raise RuntimeStageError("the PagedAttention graph has no KV block inputs")
    return PagedGraph(model, token_input, caches, width)


def _select_logits_by_token(model: ov.Model) -> None:
    """The head selects ``logits_index`` along the sequence axis; after the transformation the positions lie
    along the first axis (one token per row), so the selection must too, or every position reaches the head."""
    import openvino.opset13 as ops

    for target in model.input(LOGITS_INDEX).get_target_inputs():
        gather = target.get_node()
        if gather.get_type_name() != "Gather" or target.get_index() != 1:
            raise RuntimeStageError(f"{LOGITS_INDEX} feeds a {gather.get_type_name()}, not a Gather's indices")
        gather.input(2).replace_source_output(ops.constant(np.array(0, dtype=np.int64)).output(0))
    model.validate_nodes_and_infer_types()


def _cache_layers(model: ov.Model) -> dict[str, tuple[int, str]]:
    """Which local layer each block input belongs to, read from the names of the key each attention takes."""
    caches: dict[str, tuple[int, str]] = {}
    for op in model.get_ordered_ops():
        if op.get_type_name() != "PagedAttentionExtension":
            continue
        layer = _layer_of(op.input(1).get_source_output().get_node())
        for port, kind in ((3, "key"), (4, "value")):
            caches[op.input(port).get_source_output().get_node().get_friendly_name()] = (layer, kind)
    return caches


def _layer_of(node: ov.Node) -> int:
    """The decoder layer a key projection's output came from (the traced names hold ``layers.N.``)."""
    for _ in range(16):
        found = _LAYER.search(node.get_friendly_name())
        if found:
            return int(found.group(1))
        if node.get_input_size() == 0:
            break
        node = node.input(0).get_source_output().get_node()
    raise RuntimeStageError(f"cannot tell which layer {node.get_friendly_name()} belongs to")


class PagedPrefill:
    """A stage graph compiled for paged long steps; one :class:`PagedStep` per session."""

    def __init__(
        self, compiled: ov.CompiledModel, graph: PagedGraph, output: str, inference_positions: int = INFERENCE_POSITIONS
    ) -> None:
        """``output``: the stage's output (``logits`` or ``last_hidden_state``); ``inference_positions``: the most
        positions of a step one inference takes."""
        if inference_positions < 1:
            raise ValueError(f"an inference takes at least one position, not {inference_positions}")
        self.compiled = compiled
        self.inference_positions = inference_positions
        self.graph = graph
        self.output = compiled.output(output)
        self.widens = widens(self.output)
        """Its output is hidden states narrowed to bf16, read as f32 (``agent.runtime.hidden_precision``)."""
        shape = compiled.input(next(iter(graph.caches))).get_partial_shape()
        if shape.rank.get_length() != 4 or not all(shape[i].is_static for i in (1, 2, 3)):
            raise RuntimeStageError(f"KV blocks of shape {shape}: expected [blocks, heads, block size, head size]")
        self.kv_heads, self.block_size, self.head_size = (shape[i].get_length() for i in (1, 2, 3))
        block_type = compiled.input(next(iter(graph.caches))).get_element_type()
        found = [b for b in BLOCK_PRECISIONS.values() if b.element_type == block_type]
        if not found:
            raise RuntimeStageError(f"KV blocks of {block_type}: expected one of {', '.join(BLOCK_PRECISIONS)}")
        self.blocks = found[0]
        self.selects_positions = any(p.get_any_name() == LOGITS_INDEX for p in compiled.inputs)
        one_block = (1, self.kv_heads, self.block_size, self.head_size)
        self.empty_blocks = self.blocks.tensor(np.zeros(one_block, self.blocks.dtype))
        """What a request's block inputs hold between steps (one block, shared)."""

    def new_step(self) -> PagedStep:
        return PagedStep(self, self.compiled.create_infer_request())


class PagedStep:
    """Runs one session's long steps on the paged compilation, its KV state kept in the session's request."""

    def __init__(self, prefill: PagedPrefill, request: ov.InferRequest) -> None:
        self.prefill = prefill
        self.request = request
        self._widen = Widener() if prefill.widens else None

    def run(
        self,
        state_request: ov.InferRequest,
        kept: np.ndarray,
        inputs: np.ndarray,
        positions: np.ndarray,
        logits_index: np.ndarray,
    ) -> np.ndarray:
        """Append ``inputs`` (``[1, n]`` ids or ``[1, n, hidden]``) at logical ``positions`` (``[1, n]``) after the
        ``kept`` physical positions of ``state_request``'s KV state, which then holds exactly those kept positions
        followed by the new ones (compacted), computed in inferences of at most ``inference_positions`` each.
        Returns the output as ``[1, rows, width]``: every position's, or the ``logits_index`` rows of a head (a
        stage without the head ignores them)."""
        p = self.prefill
        n, past = inputs.shape[1], len(kept)
        blocks = -(-(past + n) // p.block_size)
        states = {}
        for state in state_request.query_state():
            found = _STATE.match(state.name)
            if found is None:
                raise RuntimeStageError(f"unexpected KV variable {state.name}")
            states[(int(found.group(1)), found.group(2))] = state
        arrays = {
            name: self._to_blocks(states[key].state.data if past else None, kept, blocks)
            for name, key in p.graph.caches.items()
        }
        parts = []
        for begin in range(0, n, p.inference_positions):
            end = min(n, begin + p.inference_positions)
            wanted = logits_index[(logits_index >= begin) & (logits_index < end)] - begin
            unread = p.selects_positions and not len(wanted)
            if unread:  # a head graph computes at least one row: the part's last, not read
                wanted = np.array([end - begin - 1], dtype=logits_index.dtype)
            rows = self._infer(arrays, inputs[:, begin:end], past + begin, positions[:, begin:end], wanted)
            if not unread:
                parts.append(rows if end == n else rows.copy())  # the next inference reuses the request's buffer
        out = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        for name, key in p.graph.caches.items():
            # [blocks, heads, block size, head size] -> [1, heads, positions, head size]
            kv = arrays[name].transpose(1, 0, 2, 3).reshape(p.kv_heads, blocks * p.block_size, p.head_size)
            # the plugin converts the blocks' precision to the state's as it copies them in: exactly, and in one
            # pass over memory where numpy's decode took three (a 512-position prompt's first step spent 0.1 s)
            states[key].state = p.blocks.tensor(np.ascontiguousarray(kv[None, :, : past + n]))
        return out

    def _infer(
        self,
        arrays: dict[str, np.ndarray],
        inputs: np.ndarray,
        past: int,
        positions: np.ndarray,
        logits_index: np.ndarray,
    ) -> np.ndarray:
        """One inference on KV blocks ``arrays`` (each ``[blocks, heads, block size, head size]``, ``past`` positions
        filled; the inference's own are written in after them); the output as ``[1, rows, width]``."""
        p = self.prefill
        n = inputs.shape[1]
        blocks = -(-(past + n) // p.block_size)  # the ones this inference reads or fills; the arrays may hold more
        for name, layer_blocks in arrays.items():
            self.request.set_tensor(name, p.blocks.tensor(layer_blocks))
        feed = sequences_feed(p.graph.token_input, inputs[0], positions.reshape(-1), [past], [n], [range(blocks)])
        if p.selects_positions:
            feed[LOGITS_INDEX] = logits_index
        self.request.infer(feed, share_inputs=True, share_outputs=True)
        for name in arrays:
            # the request would keep the blocks alive until the session's next long step
            self.request.set_tensor(name, p.empty_blocks)
        out = self.request.get_tensor(p.output).data
        if self._widen is not None:
            out = self._widen(out)
        return out.reshape(1, -1, out.shape[-1])

    def _to_blocks(self, kv: np.ndarray | None, kept: np.ndarray, blocks: int) -> np.ndarray:
        """A layer's kept positions (``kv``: ``[1, heads, physical, head size]``) laid out as KV blocks."""
        p = self.prefill
        flat = np.zeros((p.kv_heads, blocks * p.block_size, p.head_size), dtype=p.blocks.dtype)
        if kv is not None:
            if kv.dtype != np.float32 or kv.ndim != 4:
                raise RuntimeStageError(f"KV state of {kv.dtype} {kv.shape}: expected f32 [1, heads, positions, size]")
            flat[:, : len(kept)] = p.blocks.encode(kv[0][:, kept])
        return np.ascontiguousarray(flat.reshape(p.kv_heads, blocks, p.block_size, p.head_size).transpose(1, 0, 2, 3))


def sequences_feed(
    token_input: str,
    rows: np.ndarray,
    positions: np.ndarray,
    past: Sequence[int],
    counts: Sequence[int],
    tables: Sequence[Sequence[int]],
) -> dict[str, np.ndarray]:
    """The inputs of one PagedAttention inference over several sequences, as the op's spec lays them out (and
    openvino.genai's ``ModelRunner`` packs them): ``rows`` (``[total]`` ids or ``[total, hidden]``), the new
    positions of every sequence one after another, ``counts[i]`` of them for sequence ``i``, which already holds
    ``past[i]`` positions in the blocks ``tables[i]`` (those its new ones are written into too)."""
    ends = np.cumsum(counts, dtype=np.int32)
    blocks = [len(t) for t in tables]
    return {
        token_input: rows,
        "position_ids": positions,
        "past_lens": np.asarray(past, dtype=np.int32),
        "subsequence_begins": np.concatenate(([0], ends)).astype(np.int32),
        "block_indices": np.fromiter((b for t in tables for b in t), dtype=np.int32, count=sum(blocks)),
        "block_indices_begins": np.concatenate(([0], np.cumsum(blocks))).astype(np.int32),
        "max_context_len": np.array(max(p + n for p, n in zip(past, counts, strict=True)), dtype=np.int32),
    }


def compile_paged_prefill(
    core: ov.Core, xml: str, stage_input: str, output: str, device: str, props: dict[str, str]
) -> PagedPrefill:
    """Read ``xml``, transform it and compile it with ``props``, its KV blocks in the precision it computes in
    (``INFERENCE_PRECISION_HINT`` in ``props``, else the device's default): f32 where that is f32."""
    graph = paged_graph(core.read_model(xml), stage_input)
    computes_in = props.get("INFERENCE_PRECISION_HINT")
    if computes_in is None:
        computes_in = core.get_property(device, "INFERENCE_PRECISION_HINT").to_string()
    blocks = BLOCK_PRECISIONS.get(computes_in, BLOCK_PRECISIONS["f32"])
    model = graph.model
    if narrows_hidden_states(core, device, output == "logits", computes_in):
        model = narrow_output(model, output, computes_in)
    try:
        compiled = core.compile_model(model, device, {**props, "KV_CACHE_PRECISION": blocks.name})
    except RuntimeError as exc:
        raise RuntimeStageError(f"cannot compile the PagedAttention graph on {device}: {exc}") from exc
    return PagedPrefill(compiled, graph, output)
