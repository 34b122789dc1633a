"""Turn what the user typed as SOURCE into a checkpoint reader."""

from __future__ import annotations

import logging
from pathlib import Path

from agent.errors import SourceError
from shards.checkpoint.base import Checkpoint
from shards.checkpoint.fingerprint import FingerprintStore
from shards.checkpoint.known_models import KNOWN_MODELS, qwen_coder_gguf, smollm2_gguf

log = logging.getLogger(__name__)

HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]


def open_checkpoint(source: str, cache_dir: Path) -> Checkpoint:
    """Open ``source``: a short name (``smollm2``), a GGUF file, a model folder or a Hub model id. A local
    checkpoint's digest is remembered in ``cache_dir`` (``shards.checkpoint.fingerprint``)."""
    # the readers import torch and transformers: this module is also imported to tell a current export without
    from shards.checkpoint.gguf_file import GgufCheckpoint
    from shards.checkpoint.safetensors_dir import SafetensorsCheckpoint

    path = local_source(source, cache_dir)
    if path is None:
        return _from_hub(source)
    fingerprints = FingerprintStore.in_cache(cache_dir)
    if path.is_dir():
        return SafetensorsCheckpoint(path, fingerprints=fingerprints)
    checkpoint = GgufCheckpoint(path, fingerprints)
    if source in KNOWN_MODELS:
        checkpoint.source_id = source
    return checkpoint


def local_source(source: str, cache_dir: Path) -> Path | None:
    """The GGUF file or model folder ``source`` names on this PC; None: a Hub model id (downloaded when opened)."""
    if source in KNOWN_MODELS:
        return smollm2_gguf() if source == "smollm2" else qwen_coder_gguf(cache_dir)
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix != ".gguf":
            raise SourceError(f"{path}: a single file must be a .gguf checkpoint")
        return path
    if path.is_dir():
        return path
    if source.count("/") == 1 and not source.startswith((".", "/")):
        return None
    known = ", ".join(KNOWN_MODELS)
    raise SourceError(f"{source}: no such file or folder, and not a Hub id or a known name ({known})")


def _from_hub(repo_id: str) -> Checkpoint:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        raise SourceError(f"{repo_id}: cannot download from the Hub ({type(exc).__name__}: {exc})") from exc
    from shards.checkpoint.safetensors_dir import SafetensorsCheckpoint

    # snapshot folders are named after the commit they hold
    return SafetensorsCheckpoint(folder, source_id=repo_id, hub_revision=folder.name)
