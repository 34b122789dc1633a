"""The interface every checkpoint reader offers to the exporter."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Protocol

import torch
from tqdm.auto import tqdm

from shards.manifest import hash_file_into


class Checkpoint(Protocol):
    """A model checkpoint read lazily, tensor by tensor, under Hugging Face tensor names."""

    source_id: str
    """What the user named: a Hub id, a folder or a GGUF file."""
    kind: str
    """``gguf``, ``safetensors`` or ``hub``."""
    config: Any
    """The transformers ``PretrainedConfig``."""

    def tensor(self, name: str) -> torch.Tensor:
        """One float32 tensor, by its Hugging Face name (``model.layers.3.mlp.up_proj.weight``)."""
        ...

    def revision(self) -> str:
        """A Hub commit, or a content fingerprint of local files."""
        ...

    def save_tokenizer(self, out_dir: Path) -> None:
        """Write the tokenizer and chat-template files a head needs into ``out_dir``."""
        ...


def sha256_files(paths: list[Path], desc: str = "fingerprint") -> str:
    """sha256 over the bytes of several files in order, with a progress bar."""
    digest = hashlib.sha256()
    total = sum(p.stat().st_size for p in paths)
    with tqdm(total=total, unit="B", unit_scale=True, desc=desc, leave=False) as bar:
        for path in paths:
            hash_file_into(digest, path, bar.update)
    return "sha256:" + digest.hexdigest()
