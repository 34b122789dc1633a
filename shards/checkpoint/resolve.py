"""Turn what the user typed as SOURCE into a checkpoint reader."""

from __future__ import annotations

import logging
from pathlib import Path

from agent.errors import SourceError
from shards.checkpoint.base import Checkpoint
from shards.checkpoint.gguf_file import GgufCheckpoint
from shards.checkpoint.known_models import KNOWN_MODELS, qwen_coder_gguf, smollm2_gguf
from shards.checkpoint.safetensors_dir import SafetensorsCheckpoint

log = logging.getLogger(__name__)

HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


def open_checkpoint(source: str, cache_dir: Path) -> Checkpoint:
    """Open ``source``: a short name (``smollm2``), a GGUF file, a model folder or a Hub model id."""
    if source in KNOWN_MODELS:
        path = smollm2_gguf() if source == "smollm2" else qwen_coder_gguf(cache_dir)
        checkpoint = GgufCheckpoint(path)
        checkpoint.source_id = source
        return checkpoint
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise SourceError(f"{path}: a single file must be a .gguf checkpoint")
        return GgufCheckpoint(path)
    if path.is_dir():
        return SafetensorsCheckpoint(path)
    if source.count("/") == 1 and not source.startswith((".", "/")):
        return _from_hub(source)
    known = ", ".join(KNOWN_MODELS)
    raise SourceError(f"{source}: no such file or folder, and not a Hub id or a known name ({known})")


def _from_hub(repo_id: str) -> Checkpoint:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise SourceError(f"{repo_id}: cannot download from the Hub ({type(exc).__name__}: {exc})") from exc
    # snapshot folders are named after the commit they hold
    return SafetensorsCheckpoint(folder, source_id=repo_id, hub_revision=folder.name)
