"""GGUF checkpoints (llama.cpp's format), dequantized one tensor at a time.

transformers can load a GGUF, but only whole; here its name mapping and tensor fix-ups (the
Q/K head permutation llama.cpp applies to Llama weights) are reused per tensor, over gguf-py's
memory-mapped reader.
"""

from __future__ import annotations

import functools
import json
import logging
from pathlib import Path
from typing import Any, cast

import gguf
import numpy as np
import torch

from agent.errors import CorruptCheckpointError, UnsupportedModelError
from shards.architecture import SUPPORTED_MODEL_TYPES, SUPPORTED_NAMES
from shards.checkpoint.fingerprint import FingerprintStore, local_revision
from shards.checkpoint.gguf_reader import PlainViewGGUFReader

log = logging.getLogger(__name__)


class GgufCheckpoint:
    """A GGUF file read lazily under Hugging Face tensor names."""

    kind = "gguf"

    def __init__(self, path: Path, fingerprints: FingerprintStore | None = None) -> None:
        """``fingerprints``: where the file's digest is remembered between runs (None: hashed at each
        :meth:`revision`)."""
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

        self.path = path
        self.source_id = path.name
        self._fingerprints = fingerprints
        try:
            self._reader = PlainViewGGUFReader(str(path))
        except Exception as exc:  # gguf raises ValueError, struct.error, IndexError... on bad files
            raise CorruptCheckpointError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from exc
        arch_field = self._reader.fields.get("general.architecture")
        if arch_field is None:
            raise CorruptCheckpointError(f"{path}: GGUF header has no general.architecture")
        self.gguf_arch = bytes(arch_field.parts[arch_field.data[0]]).decode()
        self._tensors = {t.name: t for t in self._reader.tensors}
        self.config = self._config()
        processor_cls = TENSOR_PROCESSORS.get(self.gguf_arch, TensorProcessor)
        self._processor = processor_cls(config=self.config.to_dict())

    def _field(self, key: str) -> Any:
        field = self._reader.fields.get(key)
        if field is None or not field.data:
            return None
        value = field.parts[field.data[0]]
        if field.types and field.types[0] == gguf.GGUFValueType.STRING:
            return bytes(value).decode("utf-8", "replace")
        return value.tolist()[0]

    def _config(self) -> Any:
        """The transformers config, from the GGUF's model keys only.

        ``AutoConfig.from_pretrained(gguf_file=...)`` parses the whole file again, tokenizer
        arrays included (seconds for a 49k vocabulary); the mapping it uses is the same.
        """
        from transformers import AutoConfig
        from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

        arch = self.gguf_arch
        model_type = arch
        name = self._field("general.name") or ""
        if arch == "llama" and "mistral" in name.lower():
            model_type = "mistral"
        mapping = cast("dict[str, str | None] | None", GGUF_CONFIG_MAPPING.get(arch))  # untyped in transformers
        if mapping is None or model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"{self.path.name}: unsupported architecture {arch!r}: shoal exports {SUPPORTED_NAMES}"
            )
        values: dict[str, Any] = {}
        for key, config_key in mapping.items():
            value = self._field(f"{arch}.{key}")
            if config_key and value is not None:
                values[config_key] = value
        if "vocab_size" not in values:
            tokens = self._reader.fields.get("tokenizer.ggml.tokens")
            if tokens is None:
                raise CorruptCheckpointError(f"{self.path.name}: no vocabulary size and no token list")
            values["vocab_size"] = len(tokens.data)
        for gguf_role, role in (("bos", "bos"), ("eos", "eos"), ("unknown", "unk"), ("padding", "pad")):
            token_id = self._field(f"tokenizer.ggml.{gguf_role}_token_id")
            if token_id is not None:
                values[f"{role}_token_id"] = token_id
        values["tie_word_embeddings"] = "output.weight" not in self._tensors
        theta = values.pop("rope_theta", 10000.0)
        values["rope_parameters"] = {"rope_type": "default", "rope_theta": float(theta)}
        try:
            return AutoConfig.for_model(model_type, **values)
        except (ValueError, TypeError) as exc:
            raise CorruptCheckpointError(f"{self.path.name}: inconsistent model metadata ({exc})") from exc

    @functools.cached_property
    def _name_map(self) -> Any:
        arch = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == self.gguf_arch), None)
        if arch is None:
            raise UnsupportedModelError(f"gguf-py does not know the architecture {self.gguf_arch!r}")
        return gguf.get_tensor_name_map(arch, self.config.num_hidden_layers)

    def tensor(self, name: str) -> torch.Tensor:
        from gguf import dequantize

        base, suffix = name.rsplit(".", 1)
        mapped = self._name_map.get_name(base)
        gguf_name = f"{mapped}.{suffix}" if mapped else name
        tensor = self._tensors.get(gguf_name)
        if tensor is None:
            raise CorruptCheckpointError(f"{self.path.name}: tensor {gguf_name} ({name}) is missing")
        try:
            weights = dequantize(tensor.data, tensor.tensor_type)
        except Exception as exc:
            raise CorruptCheckpointError(f"{self.path.name}: cannot dequantize {gguf_name} ({exc})") from exc
        weights = self._processor.process(weights=weights, name=gguf_name).weights
        return torch.from_numpy(np.ascontiguousarray(weights, dtype=np.float32))

    def revision(self) -> str:
        return local_revision(self.path, self._fingerprints)

    def save_tokenizer(self, out_dir: Path) -> None:
        from unittest import mock

        import gguf
        from transformers import AutoTokenizer

        # transformers parses the GGUF's header twice with gguf-py's reader (17 s for SmolLM2's vocabulary on
        # 2 cores); the plain-view reader parses the same bytes to the same fields in a fraction of that
        with mock.patch.object(gguf, "GGUFReader", PlainViewGGUFReader):
            tokenizer = AutoTokenizer.from_pretrained(str(self.path.parent), gguf_file=self.path.name)
        # transformers' GGUF tokenizer converter (5.x) takes the wrong special token for eos and
        # saves a slow-tokenizer class that rebuilds a different pre-tokenizer on reload: set the
        # ids from the GGUF's own metadata and reload from tokenizer.json as it is.
        for role in ("bos", "eos"):
            token_id = getattr(self.config, f"{role}_token_id", None)
            if token_id is not None:
                setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(int(token_id)))
        tokenizer.save_pretrained(str(out_dir))
        config_path = out_dir / "tokenizer_config.json"
        tokenizer_config = json.loads(config_path.read_text())
        tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config_path.write_text(json.dumps(tokenizer_config, indent=1, ensure_ascii=False))
        generation = {
            k: getattr(self.config, k)
            for k in ("bos_token_id", "eos_token_id")
            if getattr(self.config, k, None) is not None
        }
        (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=1))
