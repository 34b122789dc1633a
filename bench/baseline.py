"""Exports the benchmark needs, made once and reused: the monolithic baseline and shoal's stages.

The baseline is what a user would run instead of shoal: ``openvino_genai.LLMPipeline`` on the
same checkpoint exported whole by optimum-intel, with the compression shoal applies per stage
(``--weight-format int4 --sym --group-size 128 --ratio 1.0 --group-size-fallback adjust``).
optimum-intel reads Hugging Face folders only, so a GGUF checkpoint is first dequantized into one
(float32 safetensors and tokenizer); that folder is deleted once the OpenVINO export is in place, unless a
benchmark keeps it (:func:`hf_folder`: ``python -m bench prefill`` runs transformers on it).

Every export runs in a child process of its own (through :mod:`bench.peak`), so this
process stays small and each step's peak resident memory is recorded: the figures that
docs/benchmarks.md compares for whole-model and per-stage exports.

``python -m bench.baseline gguf-to-hf GGUF OUT`` is the child that dequantizes a GGUF.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.errors import ExportError, ShoalError
from bench import BenchError

log = logging.getLogger(__name__)

OPTIMUM_INT4_ARGS = (
    "--task",
    "text-generation-with-past",
    "--weight-format",
    "int4",
    "--sym",
    "--group-size",
    "128",
    "--ratio",
    "1.0",
    "--group-size-fallback",
    "adjust",
)
STAMP_NAME = "shoal-bench.json"
"""Written last into a finished baseline export: what it was made from."""


@dataclass(frozen=True)
class Measured:
    """How a child process went: exit status, wall time and peak resident memory."""

    returncode: int
    seconds: float
    peak_rss_bytes: int


@dataclass(frozen=True)
class PreparedExport:
    """An export folder ready for benchmarking, and what making it cost (None when reused)."""

    path: Path
    reused: bool
    steps: dict[str, Measured]

    def to_json(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "reused": self.reused,
            "steps": {name: asdict(m) for name, m in self.steps.items()},
        }


def run_measured(module: str, args: list[str], env: dict[str, str] | None = None) -> Measured:
    """``python -m MODULE ARGS`` with its stdout sent to our stderr; its wall time and peak RSS."""
    with tempfile.TemporaryDirectory(prefix="shoal-peak-") as tmp:
        peak_file = Path(tmp) / "peak"
        start = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "bench.peak", str(peak_file), module, *args],
            stdout=sys.stderr.fileno(),
            env=env,
        )
        seconds = time.perf_counter() - start
        peak = int(peak_file.read_text()) if peak_file.is_file() else 0
    return Measured(returncode=proc.returncode, seconds=seconds, peak_rss_bytes=peak)


def shoal_export(
    source: str, stages: int, out: Path, cache_dir: Path, layers: tuple[int, ...] | None = None
) -> PreparedExport:
    """``shoal export SOURCE --stages N [--layers ...] --out OUT`` in a child process (reused when up to date)."""
    manifest = out / "manifest.json"
    before = manifest.stat().st_mtime_ns if manifest.is_file() else None
    pinned = ["--layers", ",".join(map(str, layers))] if layers else []
    measured = run_measured(
        "agent.cli.main",
        ["--cache-dir", str(cache_dir), "export", source, "--stages", str(stages), *pinned, "--out", str(out)],
    )
    if measured.returncode:
        raise BenchError(
            f"`shoal export {source} --stages {stages}` failed (exit {measured.returncode}, see above);"
            f" if {out} is stale, delete it and run again"
        )
    reused = before is not None and manifest.stat().st_mtime_ns == before
    return PreparedExport(path=out, reused=reused, steps={} if reused else {"shoal-export": measured})


def hf_folder(source: str, out: Path, cache_dir: Path) -> PreparedExport:
    """``source`` as a Hugging Face folder, what transformers and optimum-intel read: a model folder as it is, a
    GGUF dequantized into ``out`` (float32 weights and its tokenizer), kept there and reused while up to date."""
    from shards.checkpoint import open_checkpoint

    checkpoint = open_checkpoint(source, cache_dir)
    return _hf_folder(checkpoint, checkpoint.revision() if checkpoint.kind == "gguf" else "", out)


def _hf_folder(checkpoint: Any, revision: str, out: Path) -> PreparedExport:
    if checkpoint.kind != "gguf":
        return PreparedExport(path=Path(checkpoint.folder), reused=True, steps={})
    stamp = {"source": checkpoint.source_id, "revision": revision}
    if _up_to_date(out, stamp):
        return PreparedExport(path=out, reused=True, steps={})
    gguf = Path(checkpoint.path)
    print(f"bench: dequantizing {gguf.name} into a Hugging Face folder", file=sys.stderr)
    with _staged(out) as staging:
        steps = {
            "gguf-to-hf": _checked(
                "bench.baseline",
                ["gguf-to-hf", str(gguf), str(staging)],
                "converting the GGUF into a Hugging Face folder",
            )
        }
        _write_stamp(staging, stamp, steps)
    return PreparedExport(path=out, reused=False, steps=steps)


def optimum_export(source: str, out: Path, cache_dir: Path, hf: Path | None = None) -> PreparedExport:
    """The whole-model optimum-intel int4 export of ``source`` in ``out`` (reused when up to date).

    A GGUF checkpoint is first dequantized into a Hugging Face folder: into ``hf``, kept there (as
    :func:`hf_folder` makes it, and reused from there), or without ``hf`` beside ``out``, deleted afterwards."""
    from importlib.metadata import version

    from shards.checkpoint import open_checkpoint

    checkpoint = open_checkpoint(source, cache_dir)
    revision = checkpoint.revision()
    stamp: dict[str, Any] = {
        "source": checkpoint.source_id,
        "revision": revision,
        "optimum_args": list(OPTIMUM_INT4_ARGS),
        "optimum_intel": version("optimum-intel"),
    }
    if _up_to_date(out, stamp):
        return PreparedExport(path=out, reused=True, steps={})
    scratch = out.with_name(out.name + ".hf.incomplete")
    try:
        with _staged(out) as staging:
            model = _hf_folder(checkpoint, revision, hf or scratch)
            steps = dict(model.steps)
            print("bench: exporting the whole model with optimum-intel (int4 sym, group 128)", file=sys.stderr)
            steps["optimum-export"] = _checked(
                "optimum.commands.optimum_cli",
                ["export", "openvino", "-m", str(model.path), *OPTIMUM_INT4_ARGS, str(staging)],
                "optimum-cli export openvino",
            )
            if not (staging / "openvino_tokenizer.xml").is_file():
                raise BenchError(
                    "optimum-intel wrote no openvino_tokenizer.xml, which LLMPipeline needs "
                    "(is openvino-tokenizers installed?)"
                )
            _write_stamp(staging, stamp, steps)
    finally:
        if hf is None:
            shutil.rmtree(scratch, ignore_errors=True)
    return PreparedExport(path=out, reused=False, steps=steps)


def _up_to_date(out: Path, stamp: dict[str, Any]) -> bool:
    """Whether ``out`` holds a finished folder made from what ``stamp`` records (its stamp also records what making
    it cost: only the keys of ``stamp`` are compared)."""
    stamp_path = out / STAMP_NAME
    if not stamp_path.is_file():
        return False
    try:
        recorded = json.loads(stamp_path.read_text())
        if isinstance(recorded, dict) and {key: recorded.get(key) for key in stamp} == stamp:
            return True
    except (OSError, json.JSONDecodeError):
        pass
    log.info("%s is out of date, making it again", out)
    return False


def _write_stamp(folder: Path, stamp: dict[str, Any], steps: dict[str, Measured]) -> None:
    (folder / STAMP_NAME).write_text(
        json.dumps({**stamp, "steps": {name: asdict(m) for name, m in steps.items()}}, indent=1) + "\n"
    )


@contextlib.contextmanager
def _staged(out: Path) -> Iterator[Path]:
    """A folder to make ``out`` in: it replaces ``out`` once the block ends without an error, else it is deleted."""
    staging = out.with_name(out.name + ".incomplete")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        yield staging
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def recorded_steps(export: Path) -> dict[str, Measured]:
    """What making a baseline export cost, as recorded in its stamp when it was made."""
    try:
        steps = json.loads((export / STAMP_NAME).read_text()).get("steps", {})
        return {name: Measured(**m) for name, m in steps.items()}
    except (OSError, json.JSONDecodeError, TypeError):
        return {}


def _checked(module: str, args: list[str], what: str) -> Measured:
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    measured = run_measured(module, args, env=env)
    if measured.returncode:
        raise BenchError(f"{what} failed (exit {measured.returncode}, see above)")
    log.info("%s: %.0f s, peak RSS %.0f MB", what, measured.seconds, measured.peak_rss_bytes / 1e6)
    return measured


def gguf_to_hf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF into a float32 Hugging Face folder (weights, config, tokenizer).

    transformers loads a GGUF whole and then refuses ``save_pretrained`` while the model still
    carries its GGUF quantizer; dropping it (the weights are already float) makes it savable.
    The tokenizer keeps the class transformers' GGUF converter gives it: optimum-intel converts
    that one into ``openvino_tokenizer.xml``, which LLMPipeline loads (the benchmark feeds token ids,
    so only its presence matters). Saved as ``PreTrainedTokenizerFast``, as shoal's export saves it,
    openvino-tokenizers 2026.4 fails on the decoder (``Fuse`` step of a ByteFallback/ByteLevel mix).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except Exception as exc:
        raise ExportError(f"{gguf.name}: transformers cannot load it ({type(exc).__name__}: {exc})") from exc
    model.hf_quantizer = None  # type: ignore[assignment]  # the weights are float already
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # the converter takes the wrong special token for eos: use the ids the GGUF metadata gives
    for role in ("bos", "eos"):
        token_id = getattr(model.config, f"{role}_token_id", None)
        if isinstance(token_id, int):
            setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
    del model
    tokenizer.save_pretrained(str(out))


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[0] != "gguf-to-hf":
        print("usage: python -m bench.baseline gguf-to-hf GGUF OUT", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    try:
        gguf_to_hf(Path(argv[1]), Path(argv[2]))
    except ShoalError as exc:
        print(f"shoal: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
