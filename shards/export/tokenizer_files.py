"""The tokenizer files of an export, built once per checkpoint revision and kept in the cache.

Building them from a GGUF parses its vocabulary twice inside transformers (about 20 s for
SmolLM2's 49k tokens on a 2-core machine); an admin re-exporting the same model in another
cut or weight format should not pay that again.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from importlib.metadata import version
from pathlib import Path

from shards.checkpoint.base import Checkpoint

log = logging.getLogger(__name__)

CACHE_LAYOUT = 1
"""Bumped when ``save_tokenizer`` writes different files for the same checkpoint."""


def write_tokenizer(checkpoint: Checkpoint, revision: str, out_dir: Path, cache_dir: Path) -> None:
    """Fill ``out_dir`` with the checkpoint's tokenizer files, from the cache where it has them."""
    key = f"{revision}-tf{version('transformers')}-v{CACHE_LAYOUT}"
    cached = cache_dir / "tokenizers" / key
    if not cached.is_dir():
        # built beside and renamed into place: a cut-off build never looks finished
        building = cached.with_name(f"{key}.{uuid.uuid4().hex}.incomplete")
        building.mkdir(parents=True)
        try:
            checkpoint.save_tokenizer(building)
            building.rename(cached)
        except OSError:
            if not cached.is_dir():  # not a concurrent export that finished first
                raise
        finally:
            shutil.rmtree(building, ignore_errors=True)
        log.info("tokenizer of %s (revision %s) cached in %s", checkpoint.source_id, revision[:12], cached)
    shutil.copytree(cached, out_dir, dirs_exist_ok=True)
