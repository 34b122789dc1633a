"""The interface every checkpoint reader offers to the exporter."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # the package is imported to tell a current export too, before torch is (shards.export.request)
    import torch


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
