"""Trace one stage module into a stateful OpenVINO model, and compress its weights.

The steps OpenVINO and optimum-intel already provide are used as they are: the PyTorch
frontend (``ov.convert_model``), optimum-intel's ``fuse_cache_reorder`` (adds the ``beam_idx``
parameter and a ``Gather(past, beam_idx, axis=0)`` on every KV input, the pattern the GPU
plugin's IndirectKVCache fusion needs) and ``make_stateful`` (turns each past/present pair into
a ReadValue/Assign variable), and NNCF's ``compress_weights``.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openvino as ov
import torch

from shards.architecture import ArchSpec
from shards.export.stage_model import StageModule
from shards.manifest import LOGITS_INDEX

INT4_GROUP_SIZE = 128


@dataclass(frozen=True)
class StageIO:
    """Names of a stage graph's inputs and outputs once it is stateful."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def stage_io(has_embeddings: bool, has_head: bool) -> StageIO:
    first = "input_ids" if has_embeddings else "hidden_states"
    # an output must not share its name with an input: OpenVINO resolves names to the input first
    last = "logits" if has_head else "last_hidden_state"
    selected = (LOGITS_INDEX,) if has_head else ()
    return StageIO(inputs=(first, "attention_mask", "position_ids", *selected, "beam_idx"), outputs=(last,))


def kv_names(num_layers: int) -> tuple[list[str], list[str]]:
    """Names of the past (input) and present (output) KV tensors before they become state."""
    kinds = [f"{layer}.{kind}" for layer in range(num_layers) for kind in ("key", "value")]
    return [f"past_key_values.{k}" for k in kinds], [f"present.{k}" for k in kinds]


def trace_stage(module: StageModule, spec: ArchSpec, num_layers: int) -> ov.Model:
    """Convert ``module`` to an OpenVINO model with dynamic batch and sequence length; the KV
    cache is still explicit inputs/outputs (see :func:`make_stage_stateful`)."""
    batch, q_len, past_len = 1, 3, 2
    if module.has_embeddings:
        first = torch.ones((batch, q_len), dtype=torch.int64)
        first_shape = (ov.PartialShape([-1, -1]), ov.Type.i64)
    else:
        first = torch.zeros((batch, q_len, spec.hidden_size), dtype=torch.float32)
        first_shape = (ov.PartialShape([-1, -1, spec.hidden_size]), ov.Type.f32)
    mask = torch.ones((batch, past_len + q_len), dtype=torch.int64)
    positions = torch.arange(past_len, past_len + q_len, dtype=torch.int64)[None]
    kv_shape = (batch, spec.num_kv_heads, past_len, spec.head_dim)
    past = [torch.zeros(kv_shape, dtype=torch.float32) for _ in range(2 * num_layers)]
    kv_partial = (ov.PartialShape([-1, spec.num_kv_heads, -1, spec.head_dim]), ov.Type.f32)
    shapes = [first_shape, (ov.PartialShape([-1, -1]), ov.Type.i64), (ov.PartialShape([-1, -1]), ov.Type.i64)]
    selected: list[torch.Tensor] = []
    if module.has_head:
        selected = [torch.arange(q_len, dtype=torch.int64)]
        shapes.append((ov.PartialShape([-1]), ov.Type.i64))
    shapes += [kv_partial] * len(past)
    from openvino.frontend.pytorch.ts_decoder import TorchScriptPythonDecoder

    with torch.no_grad():
        # torch's trace check re-runs the module and compares (a third of a stage's conversion time); the
        # export's graphs are checked against transformers' tokens instead (tests/integration/test_token_exact.py)
        traced = TorchScriptPythonDecoder(
            module, example_input=(first, mask, positions, *selected, *past), trace_kwargs={"check_trace": False}
        )
        model = ov.convert_model(traced, input=shapes)

    io = stage_io(module.has_embeddings, module.has_head)
    past_names, present_names = kv_names(num_layers)
    for port, name in zip(model.inputs, [*io.inputs[:-1], *past_names], strict=True):
        port.get_tensor().set_names({name})
    for port, name in zip(model.outputs, [io.outputs[0], *present_names], strict=True):
        port.get_tensor().set_names({name})
    return model


def make_stage_stateful(model: ov.Model, num_layers: int) -> None:
    """Turn the explicit KV inputs/outputs of a traced stage into ReadValue/Assign state, with a
    ``beam_idx`` Gather on every read."""
    from optimum.exporters.openvino.stateful import fuse_cache_reorder, make_stateful

    main_input = model.inputs[0].get_any_name()
    kv_inputs, kv_outputs = kv_names(num_layers)
    # optimum-intel's passes locate the batch through an input named input_ids or inputs_embeds;
    # a middle stage's input is hidden states, which is inputs_embeds in all but name.
    port = model.input(main_input)
    if main_input == "hidden_states":
        port.get_tensor().set_names({"inputs_embeds"})
    not_kv: list[Any] = [p for p in model.inputs if p.get_any_name() not in kv_inputs]
    fuse_cache_reorder(model, not_kv, kv_inputs, gather_dim=0)
    make_stateful(model, not_kv, kv_inputs, kv_outputs, batch_dim=0)
    if main_input == "hidden_states":
        port.get_tensor().set_names({"hidden_states"})


def compress_weights(model: ov.Model, weights: str, has_embeddings: bool, has_head: bool) -> ov.Model:
    """Compress the stage's weights as optimum-intel compresses the whole model.

    int4 mirrors ``--weight-format int4 --sym --group-size 128`` on a whole model: every decoder
    MatMul in int4, the embeddings and the LM head kept in int8. NNCF treats "the last MatMul" of
    whatever graph it sees as the head, so a stage without the head asks for all layers in int4
    and then compresses the embedding table (if any) to int8 in a second pass.
    """
    if weights in ("fp16", "fp32"):
        return model
    with _nncf_quietly():
        return _compress(model, weights, has_embeddings, has_head)


@contextlib.contextmanager
def _nncf_quietly() -> Iterator[None]:
    """While it lasts, nncf writes nothing on stdout (a command's results go there, ``shoal demo``'s answer).

    nncf's import gives its logger a handler of its own on stdout, at INFO (bit-width tables on every
    compression): its records go to this process's handlers instead (stderr), at the application's level (the
    CLI's verbosity). Its progress bars (rich) print on whatever ``sys.stdout`` is when they draw: on stderr
    where its INFO records would show (``shoal -v``), nowhere otherwise (the export's own bar tells the step)."""
    from nncf.common.logging.logger import nncf_logger as nncf_log
    from nncf.common.logging.logger import stdout_handler

    nncf_log.removeHandler(stdout_handler)
    nncf_log.propagate = True
    nncf_log.setLevel(logging.NOTSET)
    bars = sys.stderr if nncf_log.isEnabledFor(logging.INFO) else io.StringIO()
    with contextlib.redirect_stdout(bars):
        yield


def _compress(model: ov.Model, weights: str, has_embeddings: bool, has_head: bool) -> ov.Model:
    import nncf
    from nncf.quantization.advanced_parameters import AdvancedCompressionParameters, GroupSizeFallbackMode

    if weights == "int8":
        return nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
    advanced = AdvancedCompressionParameters(group_size_fallback_mode=GroupSizeFallbackMode.ADJUST)
    int4 = dict(
        mode=nncf.CompressWeightsMode.INT4_SYM, group_size=INT4_GROUP_SIZE, ratio=1.0, advanced_parameters=advanced
    )
    if has_head:
        return nncf.compress_weights(model, **int4)
    if not has_embeddings:
        return nncf.compress_weights(model, all_layers=True, **int4)
    gathers = [
        op.get_friendly_name()
        for op in model.get_ops()
        if op.get_type_name() == "Gather"
        and op.input_value(0).get_node().get_type_name() != "ReadValue"
        and op.input_value(0).get_element_type().is_real()
    ]
    model = nncf.compress_weights(
        model, all_layers=True, ignored_scope=nncf.IgnoredScope(names=gathers, validate=False), **int4
    )
    return nncf.compress_weights(model, mode=nncf.CompressWeightsMode.INT8_ASYM)
