"""A Hugging Face model folder (config.json + *.safetensors), read one tensor at a time."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from agent.errors import CorruptCheckpointError, SourceError, UnsupportedModelError
from shards.checkpoint.fingerprint import FingerprintStore, local_revision


class SafetensorsCheckpoint:
    """A local folder in the Hugging Face layout."""

    kind = "safetensors"

    def __init__(
        self,
        folder: Path,
        source_id: str | None = None,
        hub_revision: str | None = None,
        fingerprints: FingerprintStore | None = None,
    ) -> None:
        """``hub_revision``: the Hub commit the folder holds (else its files' digest is the revision);
        ``fingerprints``: where that digest is remembered between runs (None: hashed at each :meth:`revision`)."""
        from safetensors import safe_open
        from transformers import AutoConfig

        self.folder = folder
        self.source_id = source_id or str(folder)
        self._hub_revision = hub_revision
        self._fingerprints = fingerprints
        if not (folder / "config.json").is_file():
            raise SourceError(f"{folder}: no config.json (expected a Hugging Face model folder)")
        try:
            self.config = AutoConfig.from_pretrained(str(folder))
        except (ValueError, KeyError) as exc:
            raise UnsupportedModelError(f"{folder}: {exc}") from exc
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise SourceError(f"{folder}: no *.safetensors weights (.bin checkpoints are not read)")
        self._files = files
        self._where: dict[str, Path] = {}
        for file in files:
            try:
                with safe_open(str(file), framework="pt") as f:
                    for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                        self._where[key] = file
            except Exception as exc:
                raise CorruptCheckpointError(f"{file}: not a readable safetensors file ({exc})") from exc

    def tensor(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        file = self._where.get(name)
        if file is None:
            raise CorruptCheckpointError(f"{self.folder}: tensor {name} is missing")
        with safe_open(str(file), framework="pt") as f:
            return f.get_tensor(name).float()

    def revision(self) -> str:
        if self._hub_revision:
            return self._hub_revision
        return local_revision(self.folder, self._fingerprints)

    def save_tokenizer(self, out_dir: Path) -> None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(str(self.folder)).save_pretrained(str(out_dir))
        gen = self.folder / "generation_config.json"
        if gen.is_file():
            (out_dir / "generation_config.json").write_text(json.dumps(json.loads(gen.read_text()), indent=1))
