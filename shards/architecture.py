"""The decoder architectures shoal exports, described by one typed record.

A checkpoint's Hugging Face config is read once into an :class:`ArchSpec`; the stage graphs, the
manifest and the runtime only ever see that record. Adding a family means teaching
:func:`arch_spec_from_config` its config and :mod:`shards.export.stage_model` its layer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from agent.errors import UnsupportedModelError

# model_type -> family. Mistral and the Llama family share one layer; Qwen2 adds q/k/v biases.
SUPPORTED_MODEL_TYPES: dict[str, str] = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}
SUPPORTED_NAMES = "Llama 2/3.x, SmolLM2, Mistral (model_type llama/mistral) and Qwen2/2.5 (qwen2)"


@dataclass(frozen=True)
class ArchSpec:
    """What a stage graph needs to know about the decoder it slices."""

    model_type: str
    family: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool
    max_position_embeddings: int
    rope_parameters: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_layers < 1 or self.hidden_size < 1 or self.vocab_size < 1:
            raise UnsupportedModelError(f"config has no layers, width or vocabulary: {self}")
        if self.num_heads % self.num_kv_heads:
            raise UnsupportedModelError(
                f"{self.num_heads} attention heads are not a multiple of {self.num_kv_heads} KV heads"
            )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ArchSpec:
        return cls(**data)

    def kv_bytes_per_token(self, num_layers: int) -> int:
        """Bytes one position of the KV cache takes in ``num_layers`` layers: a key and a value per KV head, of
        two bytes an element (the CPU plugin keeps the cache in its inference precision, bf16 or f16, by
        default; f32 doubles it)."""
        return 2 * num_layers * self.num_kv_heads * self.head_dim * 2

    def layer_param_count(self) -> int:
        """Parameters of one decoder layer (for memory estimates)."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = h * self.num_heads * self.head_dim * 2 + h * kv * 2
        return attn + 3 * h * self.intermediate_size + 2 * h


def attention_window(config: Any) -> int | None:
    """The sliding window a model's attention keeps to, in tokens (None: it attends to the whole context)."""
    window = getattr(config, "sliding_window", None)
    # Qwen2 configs carry a window they use only with use_sliding_window; Mistral's is always in force
    in_force = getattr(config, "model_type", None) == "mistral" or getattr(config, "use_sliding_window", False)
    return int(window) if in_force and window is not None else None


def check_attention_window(config: Any, context_tokens: int) -> None:
    """Refuse a model whose sliding-window attention the export's context could exceed: shoal's stage graphs
    attend to the whole context, so beyond the window their answers would not be the model's. A window at
    least as long as the context changes nothing and is accepted (Mistral 7B v0.1: 4096 tokens)."""
    window = attention_window(config)
    if window is not None and window < context_tokens:
        raise UnsupportedModelError(
            f"{config.model_type} with sliding-window attention over {window} tokens is not supported with a "
            f"{context_tokens}-token context: shoal's stage graphs attend to the whole context (beyond the window "
            f"their answers would differ from the model's); export with --context {window} or less"
        )


def arch_spec_from_config(config: Any) -> ArchSpec:
    """Read a transformers ``PretrainedConfig`` into an :class:`ArchSpec`, refusing what we cannot export."""
    model_type = getattr(config, "model_type", None)
    family = SUPPORTED_MODEL_TYPES.get(str(model_type))
    if family is None:
        raise UnsupportedModelError(f"unsupported architecture {model_type!r}: shoal exports {SUPPORTED_NAMES}")
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if not rope:  # transformers < 5 keeps these as loose attributes
        rope = {"rope_type": "default", "rope_theta": getattr(config, "rope_theta", 10000.0)}
        scaling = getattr(config, "rope_scaling", None)
        if scaling:
            rope.update(scaling)
            rope["rope_type"] = scaling.get("rope_type", scaling.get("type", "default"))
    if rope.get("rope_type") == "dynamic":
        raise UnsupportedModelError("dynamic RoPE scaling changes with sequence length and cannot be traced")
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    llama_bias = bool(getattr(config, "attention_bias", False))
    return ArchSpec(
        model_type=str(model_type),
        family=family,
        num_layers=int(config.num_hidden_layers),
        hidden_size=int(config.hidden_size),
        intermediate_size=int(config.intermediate_size),
        num_heads=heads,
        num_kv_heads=int(getattr(config, "num_key_value_heads", None) or heads),
        head_dim=head_dim,
        vocab_size=int(config.vocab_size),
        rms_norm_eps=float(config.rms_norm_eps),
        qkv_bias=True if family == "qwen2" else llama_bias,
        o_bias=False if family == "qwen2" else llama_bias,
        mlp_bias=bool(getattr(config, "mlp_bias", False)),
        tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
        max_position_embeddings=int(getattr(config, "max_position_embeddings", 4096)),
        rope_parameters=rope,
    )
