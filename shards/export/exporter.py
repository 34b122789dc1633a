"""``shoal export``: checkpoint -> one folder per stage + tokenizer + manifest, atomically.

Everything is written under ``OUT.incomplete/`` and renamed to ``OUT`` only once the manifest
is in place, so an interrupted or failed export never leaves a folder that looks complete.
Each stage is built from its own tensors only (embeddings/head where that stage holds them),
so peak memory follows the largest stage, not the model.
"""

from __future__ import annotations

import gc
import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import openvino as ov
import torch
from tqdm.auto import tqdm

from agent.errors import ExportError
from shards.architecture import ArchSpec, arch_spec_from_config, attention_window, check_attention_window
from shards.checkpoint import Checkpoint, open_checkpoint
from shards.export.convert import compress_weights, make_stage_stateful, stage_io, trace_stage
from shards.export.request import ExportRequest, current_export, export_context, layer_ranges, reusable
from shards.export.stage_model import StageModule, stage_weight_names
from shards.export.tokenizer_files import write_tokenizer
from shards.manifest import (
    MANIFEST_NAME,
    DraftEntry,
    FileEntry,
    GraphEntry,
    Manifest,
    SourceInfo,
)

log = logging.getLogger(__name__)

STEPS = ("load", "trace", "convert", "compress", "save")


def export(
    request: ExportRequest,
    cache_dir: Path,
    progress: bool = True,
    stop_requested: Callable[[], bool] = lambda: False,
) -> Manifest:
    """Run an export; returns the manifest of the finished folder (existing and matching: reused).

    ``stop_requested`` is asked between steps: once it answers True the export raises :class:`ExportError`
    and removes what it wrote, and never puts the finished folder in place."""

    def check_stop() -> None:
        if stop_requested():
            raise ExportError("the export was stopped before it finished")

    existing = current_export(request, cache_dir)
    if existing is not None:
        log.info("export %s is up to date for its source, reusing it", request.out_dir)
        return existing
    checkpoint = open_checkpoint(request.source, cache_dir)
    spec = arch_spec_from_config(checkpoint.config)
    ranges = layer_ranges(request, spec)
    context = export_context(request, spec, ranges, attention_window(checkpoint.config))
    check_attention_window(checkpoint.config, context)
    if request.self_draft_layers is not None and not 1 <= request.self_draft_layers < spec.num_layers:
        raise ExportError(f"--self-draft must be between 1 and {spec.num_layers - 1} layers")
    revision = checkpoint.revision()
    existing, replace = reusable(request, revision, ranges, context)
    if existing is not None:
        log.info("export %s is up to date, reusing it", request.out_dir)
        return existing

    out = request.out_dir
    staging = out.with_name(out.name + ".incomplete")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        stages = []
        for index, layers in enumerate(tqdm(ranges, desc="stages", disable=not progress)):
            check_stop()
            has_embeddings, has_head = index == 0, index == len(ranges) - 1
            stages.append(
                _export_graph(
                    checkpoint,
                    spec,
                    f"stage-{index}",
                    layers,
                    has_embeddings,
                    has_head,
                    request.weights,
                    context,
                    staging,
                    progress,
                )
            )
        tokenizer_dir = staging / "tokenizer"
        tokenizer_dir.mkdir()
        write_tokenizer(checkpoint, revision, tokenizer_dir, cache_dir)
        draft = _export_draft(request, checkpoint, spec, context, staging, cache_dir, progress)
        manifest = Manifest(
            source=SourceInfo(id=checkpoint.source_id, kind=checkpoint.kind, revision=revision),
            arch=spec,
            weights=request.weights,
            context_tokens=context,
            stages=tuple(stages),
            tokenizer_files=tuple(FileEntry.of(staging, p) for p in sorted(tokenizer_dir.rglob("*")) if p.is_file()),
            draft=draft,
            producer={"shoal": _version(), "openvino": ov.get_version(), "torch": torch.__version__},
        )
        manifest.save(staging)
        check_stop()
        _replace_dir(staging, out, replace)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return manifest


def _replace_dir(staging: Path, out: Path, force: bool) -> None:
    if out.exists():
        if not force and (out / MANIFEST_NAME).exists():
            raise ExportError(f"{out} already exists")
        trash = out.with_name(out.name + ".old")
        shutil.rmtree(trash, ignore_errors=True)
        out.rename(trash)
        staging.rename(out)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        staging.rename(out)


def _export_draft(
    request: ExportRequest,
    checkpoint: Checkpoint,
    spec: ArchSpec,
    context: int,
    staging: Path,
    cache_dir: Path,
    progress: bool,
) -> DraftEntry | None:
    if request.self_draft_layers:
        graph = _export_graph(
            checkpoint,
            spec,
            "draft",
            range(0, request.self_draft_layers),
            True,
            True,
            request.weights,
            context,
            staging,
            progress,
        )
        return DraftEntry(kind="self", source=request.draft_label or "", arch=spec, graph=graph)
    if request.draft_source:
        draft_checkpoint = open_checkpoint(request.draft_source, cache_dir)
        draft_spec = arch_spec_from_config(draft_checkpoint.config)
        _check_same_vocabulary(staging / "tokenizer", draft_checkpoint, staging, cache_dir)
        graph = _export_graph(
            draft_checkpoint,
            draft_spec,
            "draft",
            range(0, draft_spec.num_layers),
            True,
            True,
            request.weights,
            context,
            staging,
            progress,
        )
        return DraftEntry(kind="model", source=request.draft_source, arch=draft_spec, graph=graph)
    return None


def _check_same_vocabulary(target_tokenizer: Path, draft: Checkpoint, staging: Path, cache_dir: Path) -> None:
    """A draft proposes token ids that the target verifies: both must mean the same by each id."""
    from transformers import AutoTokenizer

    folder = staging / ".vocab-draft"
    folder.mkdir()
    write_tokenizer(draft, draft.revision(), folder, cache_dir)
    draft_vocab = AutoTokenizer.from_pretrained(str(folder)).get_vocab()
    shutil.rmtree(folder)
    target_vocab = AutoTokenizer.from_pretrained(str(target_tokenizer)).get_vocab()
    if target_vocab != draft_vocab:
        differing = len(set(target_vocab.items()) ^ set(draft_vocab.items()))
        raise ExportError(
            f"draft {draft.source_id} does not share the target's tokenizer ({differing} vocabulary entries differ)"
        )


def _export_graph(
    checkpoint: Checkpoint,
    spec: ArchSpec,
    name: str,
    layers: range,
    has_embeddings: bool,
    has_head: bool,
    weights: str,
    context: int,
    staging: Path,
    progress: bool,
) -> GraphEntry:
    folder = staging / name
    folder.mkdir()
    with tqdm(
        total=len(STEPS), desc=f"{name} layers {layers.start}-{layers.stop - 1}", disable=not progress, leave=False
    ) as bar:
        with _step(bar, "load"):
            module = _load_stage_module(checkpoint, spec, layers, has_embeddings, has_head, progress)
        with _step(bar, "trace"):
            try:
                model = trace_stage(module, spec, len(layers))
            except Exception as exc:
                raise ExportError(f"{name}: conversion to OpenVINO failed: {type(exc).__name__}: {exc}") from exc
            del module
            gc.collect()
        with _step(bar, "convert"):
            make_stage_stateful(model, len(layers))
        with _step(bar, "compress"):
            model = compress_weights(model, weights, has_embeddings, has_head)
        with _step(bar, "save"):
            xml = folder / "openvino_model.xml"
            ov.save_model(model, str(xml), compress_to_fp16=weights == "fp16")
            del model
            gc.collect()
    files = tuple(FileEntry.of(staging, p) for p in sorted(folder.iterdir()))
    io = stage_io(has_embeddings, has_head)
    weights_bytes = sum(f.size for f in files if f.path.endswith(".bin"))
    kv_per_token = spec.kv_bytes_per_token(len(layers))
    return GraphEntry(
        name=name,
        xml=xml.relative_to(staging).as_posix(),
        layer_start=layers.start,
        layer_stop=layers.stop,
        embeddings=has_embeddings,
        head=has_head,
        inputs=io.inputs,
        outputs=io.outputs,
        files=files,
        weights_bytes=weights_bytes,
        kv_bytes_per_token=kv_per_token,
        memory_bytes=weights_bytes + kv_per_token * context,
    )


@contextmanager
def _step(bar: tqdm, step: str) -> Iterator[None]:
    bar.set_postfix_str(step)
    yield
    bar.update(1)


def _load_stage_module(
    checkpoint: Checkpoint, spec: ArchSpec, layers: range, has_embeddings: bool, has_head: bool, progress: bool
) -> StageModule:
    """Build the stage module from only the tensors it holds (no random init, no other layers)."""
    inv_freq, scaling = _rope_tables(checkpoint.config)
    with torch.device("meta"):
        module = StageModule(spec, len(layers), has_embeddings, has_head, torch.zeros_like(inv_freq), scaling)
    names = stage_weight_names(spec, layers.start, layers.stop, has_embeddings, has_head)
    state = {
        local: checkpoint.tensor(hf)
        for local, hf in tqdm(names.items(), desc="tensors", leave=False, disable=not progress)
    }
    module.load_state_dict(state, assign=True, strict=True)
    module.inv_freq = inv_freq
    return module.eval()


def _rope_tables(config: object) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and scaling as transformers computes them for this config's RoPE type."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rotary = LlamaRotaryEmbedding(config)  # type: ignore[arg-type]
    return rotary.inv_freq.float().clone(), float(rotary.attention_scaling)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("shoal")
    except PackageNotFoundError:
        return "unknown"
