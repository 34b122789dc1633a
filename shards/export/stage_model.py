"""A contiguous slice of a decoder as a traceable torch module.

Hugging Face's own modeling code builds its rotary tables and cache objects in Python, which
does not trace into a graph that takes arbitrary positions. This module keeps only the maths:
rotary embeddings are computed from ``position_ids`` inside the graph, the KV cache enters as
plain tensors (``past_*``) and leaves as ``present_*`` so that OpenVINO's make-stateful pass can
turn each pair into a variable, and the attention mask is built from the physical
``attention_mask`` so that rejected draft positions can be masked out instead of trimmed (an additive
float mask, the form OpenVINO's attention kernels are fast with).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from shards.architecture import ArchSpec


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


MASKED_SCORE = -65504.0
"""What the attention mask adds to the score of a position a query must not see: the lowest float16, so the
mask holds in every inference precision (f32, bf16, f16), and exp() of it underflows to exactly 0 in all."""


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, spec: ArchSpec) -> None:
        super().__init__()
        h, hd = spec.hidden_size, spec.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, hd
        self.q_proj = nn.Linear(h, spec.num_heads * hd, bias=spec.qkv_bias)
        self.k_proj = nn.Linear(h, spec.num_kv_heads * hd, bias=spec.qkv_bias)
        self.v_proj = nn.Linear(h, spec.num_kv_heads * hd, bias=spec.qkv_bias)
        self.o_proj = nn.Linear(spec.num_heads * hd, h, bias=spec.o_bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        past_key: torch.Tensor,
        past_value: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, q_len, _ = x.shape
        q = self.q_proj(x).view(b, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, q_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, q_len, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        key = torch.cat([past_key, k], dim=2)
        value = torch.cat([past_value, v], dim=2)
        groups = self.num_heads // self.num_kv_heads
        # The expand+reshape form of grouped-query attention is the one OpenVINO's SDPA fusions match.
        key_rep, value_rep = key, value
        if groups > 1:
            kv_len = key.shape[2]
            key_rep = key[:, :, None].expand(b, self.num_kv_heads, groups, kv_len, self.head_dim)
            key_rep = key_rep.reshape(b, self.num_heads, kv_len, self.head_dim)
            value_rep = value[:, :, None].expand(b, self.num_kv_heads, groups, kv_len, self.head_dim)
            value_rep = value_rep.reshape(b, self.num_heads, kv_len, self.head_dim)
        out = F.scaled_dot_product_attention(q, key_rep, value_rep, attn_mask=mask, scale=self.head_dim**-0.5)
        out = out.transpose(1, 2).reshape(b, q_len, self.num_heads * self.head_dim)
        return self.o_proj(out), key, value


class MLP(nn.Module):
    def __init__(self, spec: ArchSpec) -> None:
        super().__init__()
        h, m = spec.hidden_size, spec.intermediate_size
        self.gate_proj = nn.Linear(h, m, bias=spec.mlp_bias)
        self.up_proj = nn.Linear(h, m, bias=spec.mlp_bias)
        self.down_proj = nn.Linear(m, h, bias=spec.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, spec: ArchSpec) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = MLP(spec)

    def forward(self, x, cos, sin, mask, past_key, past_value):  # type: ignore[no-untyped-def]
        attn, key, value = self.self_attn(self.input_layernorm(x), cos, sin, mask, past_key, past_value)
        x = x + attn
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, key, value


class StageModule(nn.Module):
    """Layers ``[start, stop)`` of a decoder, with the embeddings and/or the head where they belong.

    ``forward(inputs, attention_mask, position_ids, *past)`` returns ``(out, *present)`` where
    ``inputs`` is token ids (stage holding the embeddings) or hidden states, ``out`` is logits
    (stage holding the head) or hidden states, and ``past``/``present`` alternate key, value per
    layer with shape ``[batch, kv_heads, length, head_dim]``. A stage holding the head takes one
    more input before ``past``: ``logits_index``, the positions of this step whose logits are
    wanted (a prompt needs only its last; the LM head over a whole prompt dominated the time to
    first token).
    """

    def __init__(
        self,
        spec: ArchSpec,
        num_layers: int,
        has_embeddings: bool,
        has_head: bool,
        inv_freq: torch.Tensor,
        rope_scaling: float,
    ) -> None:
        super().__init__()
        self.has_embeddings, self.has_head = has_embeddings, has_head
        if has_embeddings:
            self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(spec) for _ in range(num_layers))
        if has_head:
            self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
            self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)
        self.register_buffer("inv_freq", inv_freq.float().clone(), persistent=False)
        self.rope_scaling = float(rope_scaling)

    def forward(self, inputs, attention_mask, position_ids, *rest):  # type: ignore[no-untyped-def]
        logits_index, past = (rest[0], rest[1:]) if self.has_head else (None, rest)
        x = self.embed_tokens(inputs) if self.has_embeddings else inputs
        q_len, total = x.shape[1], attention_mask.shape[1]
        # Physical positions: the new tokens sit at the end of the cache. Logical positions
        # (position_ids) skip the masked-out ones, so rotary phases match a trimmed cache.
        key_pos = torch.arange(total, device=x.device)
        query_pos = torch.arange(q_len, device=x.device) + (total - q_len)
        causal = key_pos[None, :] <= query_pos[:, None]
        visible = causal[None, None, :, :] & attention_mask[:, None, None, :].bool()
        # An additive float mask, as Hugging Face's models trace: with a boolean mask, OpenVINO's CPU attention
        # kernel took ~3x (f32) and 13-22x (bf16) as long on a 2,048-token prompt (docs/prefill-profile.md).
        mask = torch.where(visible, 0.0, MASKED_SCORE).to(x.dtype)
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scaling)[:, None]
        sin = (emb.sin() * self.rope_scaling)[:, None]
        present: list[torch.Tensor] = []
        for i, layer in enumerate(self.layers):
            x, key, value = layer(x, cos, sin, mask, past[2 * i], past[2 * i + 1])
            present += [key, value]
        if self.has_head:
            # the norm is per position, so selecting before it gives the same logits as after
            x = self.lm_head(self.norm(torch.index_select(x, 1, logits_index)))
        return (x, *present)


def stage_weight_names(spec: ArchSpec, start: int, stop: int, has_embeddings: bool, has_head: bool) -> dict[str, str]:
    """Map this module's parameter names to the Hugging Face checkpoint's tensor names."""
    names: dict[str, str] = {}
    if has_embeddings:
        names["embed_tokens.weight"] = "model.embed_tokens.weight"
    for local, layer in enumerate(range(start, stop)):
        for suffix in _layer_param_suffixes(spec):
            names[f"layers.{local}.{suffix}"] = f"model.layers.{layer}.{suffix}"
    if has_head:
        names["norm.weight"] = "model.norm.weight"
        names["lm_head.weight"] = "model.embed_tokens.weight" if spec.tie_word_embeddings else "lm_head.weight"
    return names


def _layer_param_suffixes(spec: ArchSpec) -> list[str]:
    suffixes = ["input_layernorm.weight", "post_attention_layernorm.weight"]
    for proj, bias in (
        ("q_proj", spec.qkv_bias),
        ("k_proj", spec.qkv_bias),
        ("v_proj", spec.qkv_bias),
        ("o_proj", spec.o_bias),
    ):
        suffixes.append(f"self_attn.{proj}.weight")
        if bias:
            suffixes.append(f"self_attn.{proj}.bias")
    for proj in ("gate_proj", "up_proj", "down_proj"):
        suffixes.append(f"mlp.{proj}.weight")
        if spec.mlp_bias:
            suffixes.append(f"mlp.{proj}.bias")
    return suffixes
