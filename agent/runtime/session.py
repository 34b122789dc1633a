"""One conversation's KV state on one stage, with mask-based rewind.

Speculative decoding feeds K draft tokens and then keeps only the accepted ones. Trimming an
OpenVINO state costs a copy per call; instead the rejected positions stay in the cache and are
masked out of ``attention_mask`` on every later step, while ``position_ids`` follow the logical
length (the number of kept tokens). Where the graph computes in f32 the result equals a trimmed cache,
at no cost per rewind. In lower precisions it does not quite (see ``RuntimeConfig.rewind``): a session
then compacts instead, copying the state without the rejected positions. A long step (a prompt) may run
on a paged compilation of the graph (``agent.runtime.paged_prefill``), which leaves the state compacted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import openvino as ov

from agent.errors import RuntimeStageError
from agent.runtime.hidden_precision import Widener, widens
from agent.runtime.paged_prefill import PagedStep
from agent.runtime.repeatable import ALIKE_MIN_PROMPT
from shards.manifest import LOGITS_INDEX

PAGED_MIN_POSITIONS = 128
"""Steps of at least this many positions run on the paged compilation. A speculative step (K <= 16 drafts + 1)
never does. A stage that computes prompts alike (``paged_prompts``) runs every prompt step there; measured on one
thread of a 2-core EPYC with SmolLM2 int4 (2 stages), a prompt step of 8 to 127 positions after 150 to 1,000 took
0.3-1.0x its time on the SDPA compilation, one of 2 positions 1.5-2.5x (the KV state's copy dominates it)."""


class StageSession:
    """A per-session InferRequest plus the physical mask of its cache."""

    def __init__(
        self,
        request: ov.InferRequest,
        input_name: str,
        output: ov.Output,
        *,
        holds_head: bool = False,
        selects_positions: bool = False,
        paged: Callable[[], PagedStep | None] | None = None,
        paged_min_positions: int = PAGED_MIN_POSITIONS,
        paged_prompts: bool = False,
        compact_rewind: bool = False,
    ) -> None:
        """``holds_head``: the graph ends in logits; ``selects_positions``: it also takes ``logits_index``
        (a head graph of format 2 on); ``paged``: makes this session's access to the paged compilation that
        steps of at least ``paged_min_positions`` run on, the KV state moved across (called on the first such
        step; None from it: they stay here); ``paged_prompts``: every prompt step (``last_only``) runs there too,
        whatever its length, so that a prompt's positions are computed alike however its steps are cut (one
        thread below f32, ``agent.runtime.repeatable``);
        ``compact_rewind``: rewinds drop positions from the state (a copy) instead of masking them."""
        self._request = request
        self._make_paged = paged
        self._paged: PagedStep | None = None
        self._paged_min = paged_min_positions
        self._paged_prompts = paged_prompts
        self._wrap: Callable[[ov.InferRequest], ov.InferRequest] | None = None
        self._output = output
        # hidden states a CPU stage narrowed to bf16 (agent.runtime.hidden_precision) go on as f32
        self._widen = Widener() if widens(output) else None
        self._holds_head = holds_head
        self._selects_positions = selects_positions
        self._compact = compact_rewind
        self._mask = np.zeros((1, 256), dtype=np.int64)
        self._physical = 0
        self._logical = 0
        # Inputs go in by port index as tensors over our own arrays: the binding's feed dict (a name lookup,
        # dtype and flag checks per input) cost ~0.1 ms of CPU a stage and step, ~3 % of a SmolLM2 stage's step.
        ports = {name: index for index, port in enumerate(request.model_inputs) for name in port.get_names()}
        try:
            self._input_port, self._mask_port, self._position_port = (
                ports[input_name],
                ports["attention_mask"],
                ports["position_ids"],
            )
            self._index_port = ports[LOGITS_INDEX] if selects_positions else -1
            beam_port = ports["beam_idx"]
        except KeyError as exc:
            raise RuntimeStageError(f"the stage graph has no input {exc}: it is not a shoal stage graph") from exc
        self._input_dtype = request.model_inputs[self._input_port].get_element_type().to_dtype()
        # beam_idx never changes (one sequence per request): set once, it stays through reset_state(). The request
        # holds a tensor over our array but not the array: every tensor set stays referenced here while it is set.
        self._beam = ov.Tensor(np.zeros(1, dtype=np.int32), shared_memory=True)
        request.set_input_tensor(beam_port, self._beam)
        self._fed: tuple[ov.Tensor, ...] = ()
        self._one_position = np.zeros((1, 1), dtype=np.int64)
        self._one_position_tensor = ov.Tensor(self._one_position, shared_memory=True)
        self._first_row = ov.Tensor(np.zeros(1, dtype=np.int64), shared_memory=True)
        self.kv_cut_seconds = 0.0
        """Time spent cutting rejected positions out of the KV state (``compact_rewind``), all told."""

    def wrap_requests(self, wrap: Callable[[ov.InferRequest], ov.InferRequest]) -> None:
        """Instrumentation: from now on this session runs on ``wrap(request)`` in place of each of its
        InferRequests (the paged one too): a stand-in that passes every call on to the request it wraps,
        and times ``infer``, say (as the benchmark harness does). Sessions never wrapped are unchanged."""
        self._request = wrap(self._request)
        self._wrap = wrap
        if self._paged is not None:
            self._paged.request = wrap(self._paged.request)

    @property
    def logical_length(self) -> int:
        """Tokens the model currently attends to (kept positions)."""
        return self._logical

    @property
    def physical_length(self) -> int:
        """Positions held in the cache, masked or not."""
        return self._physical

    def step(self, inputs: np.ndarray, positions: np.ndarray | None = None, last_only: bool = False) -> np.ndarray:
        """Run new positions through the stage and return its output (hidden states or logits).

        ``inputs`` is ``[1, n]`` token ids or ``[1, n, hidden]`` hidden states; ``positions`` the
        logical positions ``[1, n]`` (default: continuing the logical length). ``last_only`` says the
        caller needs the logits of the last position only: a head graph then returns ``[1, 1, vocab]``
        (and, from format 2, computes that row alone); a stage ending in hidden states ignores it,
        since the next stage needs every position. The returned array is a view of the request's
        output buffer, valid until the next call.
        """
        n = inputs.shape[1]
        if n < 1:
            raise RuntimeStageError("step needs at least one position")
        if positions is None:
            positions = np.arange(self._logical, self._logical + n, dtype=np.int64)[None]
        end = self._physical + n
        if end > self._mask.shape[1]:
            grown = np.zeros((1, max(end, 2 * self._mask.shape[1])), dtype=np.int64)
            grown[:, : self._physical] = self._mask[:, : self._physical]
            self._mask = grown
        paged = self._paged_for(n, last_only)
        if paged is not None:
            return self._paged_step(paged, inputs, positions, last_only)
        self._mask[0, self._physical : end] = 1
        request = self._request
        if n == 1:  # a decode step: no new arrays
            self._one_position[0, 0] = positions[0, 0]
            position = self._one_position_tensor
            rows = self._first_row
        else:
            position = _shared_tensor(positions, np.int64)
            rows = ov.Tensor(np.arange(n - 1 if last_only else 0, n, dtype=np.int64), shared_memory=True)
        self._fed = (
            _shared_tensor(inputs, self._input_dtype),
            ov.Tensor(self._mask[:, :end], shared_memory=True),
            position,
            rows,
        )
        request.set_input_tensor(self._input_port, self._fed[0])
        request.set_input_tensor(self._mask_port, self._fed[1])
        request.set_input_tensor(self._position_port, position)
        if self._selects_positions:
            request.set_input_tensor(self._index_port, rows)
        # share_outputs: the result is a view of the request's output tensor, not a copy
        out = request.infer(share_outputs=True)[self._output]
        if self._widen is not None:
            out = self._widen(out)
        self._physical = end
        self._logical += n
        return self._last_only(out, last_only)

    def _paged_for(self, n: int, last_only: bool) -> PagedStep | None:
        """The paged compilation a step of ``n`` positions runs on, made on the first long step (or prompt, with
        ``paged_prompts``); None: this one."""
        # a one-position step stays here even as a prompt: a decode step without drafts is one too, and decoding
        # must run on one compilation whatever K, or speculation is not exact
        prompt = last_only and self._paged_prompts and n >= ALIKE_MIN_PROMPT
        if (n < self._paged_min and not prompt) or self._make_paged is None:
            return None
        if self._paged is None:
            self._paged = self._make_paged()
            if self._paged is None:
                self._make_paged = None  # there is none: never ask again
            elif self._wrap is not None:
                self._paged.request = self._wrap(self._paged.request)
        return self._paged

    def _paged_step(self, paged: PagedStep, inputs: np.ndarray, positions: np.ndarray, last_only: bool) -> np.ndarray:
        """A long step on the paged compilation: the state comes back holding only kept positions."""
        n = inputs.shape[1]
        kept = np.flatnonzero(self._mask[0, : self._physical])
        index = np.arange(n - 1 if last_only else 0, n, dtype=np.int64)
        out = paged.run(self._request, kept, inputs, positions, index)
        length = len(kept) + n
        self._mask[0, :length] = 1
        self._mask[0, length : self._physical + n] = 0
        self._physical = self._logical = length
        return self._last_only(out, last_only)

    def _last_only(self, out: np.ndarray, last_only: bool) -> np.ndarray:
        return out[:, -1:] if last_only and self._holds_head and not self._selects_positions else out

    def rewind(self, n: int) -> None:
        """Forget the last ``n`` kept positions by masking them out (they stay in the cache)."""
        if n < 0 or n > self._logical:
            raise RuntimeStageError(f"cannot rewind {n} of {self._logical} positions")
        if n == 0:
            return
        if self._compact:
            self._drop_last(n)
            return
        kept = np.flatnonzero(self._mask[0, : self._physical])
        self._mask[0, kept[-n:]] = 0
        self._logical -= n

    def _drop_last(self, n: int) -> None:
        """Cut the last ``n`` positions out of every KV variable (compacted sessions never hold masked ones)."""
        started = time.perf_counter()
        keep = self._physical - n
        for state in self._request.query_state():
            kv = state.state.data  # [batch, kv heads, positions, head size], as shards/export lays it out
            if kv.ndim != 4 or kv.shape[2] != self._physical:
                raise RuntimeStageError(
                    f"KV variable {state.name} has shape {kv.shape}, expected "
                    f"[batch, heads, {self._physical}, head size]"
                )
            state.state = ov.Tensor(np.ascontiguousarray(kv[:, :, :keep]))
        self._mask[0, keep : self._physical] = 0
        self._physical = keep
        self._logical -= n
        self.kv_cut_seconds += time.perf_counter() - started

    def reset(self) -> None:
        """Drop the whole KV state (a new conversation)."""
        self._request.reset_state()
        self._mask[:] = 0
        self._physical = 0
        self._logical = 0


def _shared_tensor(array: np.ndarray, dtype: np.dtype | type[np.generic]) -> ov.Tensor:
    """An OpenVINO tensor over ``array`` itself where OpenVINO can read it in place (hidden states from the stage
    before, in this process: no copy), else over a converted copy (another dtype, read-only frames off the wire)."""
    if array.dtype != dtype or not array.flags.c_contiguous or not array.flags.writeable:
        array = np.array(array, dtype=dtype, order="C")
    return ov.Tensor(array, shared_memory=True)
