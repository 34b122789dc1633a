"""A toy decoder in numpy that stands in for OpenVINO stages in the middle test tier.

:class:`ToyStage` satisfies ``agent.runtime.protocol.Stage`` and its sessions ``KVSession``: each layer
keeps the running sum of the inputs of the kept positions (its "KV cache") and mixes each new position with
their mean up to it, so a token's output depends on every token before it, on its position, and on
rewinds being honoured. Every row is computed on its own (vector-matrix products only), so a position's
value is bit-identical however the steps were cut: a ring of toy stages must give exactly the tokens of
one toy stage holding every layer, as real stages must give the in-process pipeline's.
"""

from __future__ import annotations

import hashlib
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from agent.errors import FleetBusyError, RuntimeStageError
from agent.runtime.kv_blocks import BlockAllocator, BlockTable
from agent.runtime.repeatable import ALIKE_MIN_PROMPT
from shards.architecture import ArchSpec
from shards.manifest import FileEntry, GraphEntry, Manifest, SourceInfo

VOCAB = 67
HIDDEN = 8
BOS, END, USER, ASSISTANT = 1, 2, 3, 4
FIRST_TEXT_ID = 5


@dataclass(frozen=True)
class ToyWeights:
    """The whole toy model's parameters, from a seed."""

    embed: np.ndarray
    mix: tuple[np.ndarray, ...]
    context: tuple[np.ndarray, ...]

    @classmethod
    def make(cls, layers: int, seed: int = 7) -> ToyWeights:
        rng = np.random.default_rng(seed)
        embed = rng.normal(0, 1.0, (VOCAB, HIDDEN)).astype(np.float32)
        mix = tuple(rng.normal(0, 0.6, (HIDDEN, HIDDEN)).astype(np.float32) for _ in range(layers))
        context = tuple(rng.normal(0, 0.6, (HIDDEN, HIDDEN)).astype(np.float32) for _ in range(layers))
        return cls(embed, mix, context)


def toy_manifest(stages: int = 3, layers: int = 6, context_tokens: int = 256) -> Manifest:
    """A valid manifest of ``stages`` stages over ``layers`` toy layers (its files exist nowhere)."""
    bounds = np.linspace(0, layers, stages + 1).round().astype(int)
    graphs = []
    for index in range(stages):
        name = f"stage{index}"
        xml = f"{name}/model.xml"
        digest = hashlib.sha256(f"toy {name} of {stages}".encode()).hexdigest()
        graphs.append(
            GraphEntry(
                name=name,
                xml=xml,
                layer_start=int(bounds[index]),
                layer_stop=int(bounds[index + 1]),
                embeddings=index == 0,
                head=index == stages - 1,
                inputs=("input_ids" if index == 0 else "hidden_states", "attention_mask", "position_ids", "beam_idx"),
                outputs=("logits" if index == stages - 1 else "hidden_states",),
                files=(FileEntry(xml, digest, 1),),
                weights_bytes=1,
                kv_bytes_per_token=1,
                memory_bytes=1,
            )
        )
    arch = ArchSpec(
        model_type="llama",
        family="llama",
        num_layers=layers,
        hidden_size=HIDDEN,
        intermediate_size=HIDDEN,
        num_heads=1,
        num_kv_heads=1,
        head_dim=HIDDEN,
        vocab_size=VOCAB,
        rms_norm_eps=1e-5,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        tie_word_embeddings=True,
        max_position_embeddings=context_tokens,
    )
    return Manifest(
        source=SourceInfo(id="toy/decoder", kind="toy", revision="1"),
        arch=arch,
        weights="fp32",
        context_tokens=context_tokens,
        stages=tuple(graphs),
        tokenizer_files=(),
    )


def whole_model(manifest: Manifest) -> GraphEntry:
    """One graph holding every layer of ``manifest``'s model (the reference the ring must match)."""
    first, last = manifest.stages[0], manifest.stages[-1]
    return GraphEntry(
        name="whole",
        xml=first.xml,
        layer_start=0,
        layer_stop=manifest.arch.num_layers,
        embeddings=True,
        head=True,
        inputs=first.inputs,
        outputs=last.outputs,
        files=first.files,
        weights_bytes=1,
        kv_bytes_per_token=1,
        memory_bytes=1,
    )


@dataclass
class ToyStage:
    """A ``Stage`` computing ``graph``'s layers of the toy model."""

    graph: GraphEntry
    weights: ToyWeights
    device: str = "TOY"
    compact_rewind: bool = False
    exact_speculation: bool | None = True
    wire_dtype: str = "f32"
    decode_precision: str = "f32"
    kv: str = "paged"
    """Says it packs (``agent.runtime.packed.PackingStage``), so that a stage server's packing path runs on toy
    stages; their sessions' steps are computed one by one, which leaves each session's numbers as alone."""
    packs_alike: bool = True
    pool: ToyPool | None = None
    """Where its sessions' positions take KV blocks (None: anywhere, without limit)."""
    sessions_made: int = 0
    positions_computed: int = 0
    """Positions run through this stage, all sessions told (a resumed turn computes only its new part)."""
    steps: list[int] = field(default_factory=list)
    """The length of every step computed, in order."""
    prefill_seconds: float = 0.0
    """Each step of more than one position also takes this long (a long prompt's prefill, on the worker
    thread as a real stage computes)."""
    rounds_prompts_by_step: bool = False
    """A prompt's step (``last_only``) shifts its rows by an amount that grows with the step's length, as the
    CPU's int4 default precision rounds a prompt's positions by how they are grouped into steps (one thread:
    40 positions in one step and 39 + 1 give other logits). Drafts' steps stay exact, as there."""
    rounds_decoding: bool = False
    """Every step but a prompt's of at least two positions shifts its rows by a fixed amount, as a one-thread
    stage below f32 computes decoding (on its SDPA compilation) unlike a prompt (on its paged one), and a
    one-position prompt step unlike longer ones; prompts are computed alike however they are cut, as there."""

    @property
    def kv_pool(self) -> ToyPool | None:
        return self.pool

    @property
    def alike(self) -> str:
        """What it computes the same however positions are grouped into steps (``agent.runtime.repeatable``)."""
        if self.rounds_prompts_by_step:
            return "none"
        return "prompts" if self.rounds_decoding else "all"

    def new_session(self) -> ToySession:
        self.sessions_made += 1
        return ToySession(self) if self.pool is None else PooledToySession(self, self.pool)


class ToyPool:
    """A toy stage's pool of KV blocks: the bookkeeping of a paged stage's pool (``PagedKV``) without its arrays."""

    def __init__(self, blocks: int, block_size: int = 4) -> None:
        self.allocator = BlockAllocator(blocks, block_size)

    def available_blocks(self) -> int:
        return self.allocator.free_blocks


class ToySession:
    """One conversation's toy KV state: per layer, the running sums of the kept positions' inputs."""

    def __init__(self, stage: ToyStage) -> None:
        self._stage = stage
        self._cache: list[list[np.ndarray]] = [[] for _ in stage.graph.layers]
        self._logical = 0
        self.kv_cut_seconds = 0.0

    @property
    def logical_length(self) -> int:
        return self._logical

    def step(self, inputs: np.ndarray, positions: np.ndarray | None = None, last_only: bool = False) -> np.ndarray:
        stage, weights = self._stage, self._stage.weights
        n = inputs.shape[1]
        if n < 1:
            raise RuntimeStageError("step needs at least one position")
        if n > 1 and stage.prefill_seconds:
            time.sleep(stage.prefill_seconds)
        if positions is None:
            positions = np.arange(self._logical, self._logical + n, dtype=np.int64)[None]
        if stage.graph.embeddings:
            x = weights.embed[np.asarray(inputs[0], dtype=np.int64)]
        else:
            x = np.asarray(inputs[0], dtype=np.float32)
        shift: np.ndarray | np.float32 = np.float32(0)
        if last_only and stage.rounds_prompts_by_step:
            shift = np.float32(0.3 * n)
        elif stage.rounds_decoding and not (last_only and n >= ALIKE_MIN_PROMPT):
            shift = np.float32(0.4) * np.cos(np.arange(HIDDEN, dtype=np.float32) * np.float32(2.1))
        for sums, layer in zip(self._cache, stage.graph.layers, strict=True):
            rows = []
            for row, position in zip(x, positions[0], strict=True):
                # a running sum per kept position: the same additions in the same order however the
                # positions were grouped into steps, and a rewind only drops the last sums
                sums.append(row.copy() if not sums else sums[-1] + row)
                attended = sums[-1] / np.float32(len(sums))
                turn = np.sin(np.float32(position) * np.float32(0.37) + np.arange(HIDDEN, dtype=np.float32))
                rows.append(row + np.tanh(row @ weights.mix[layer] + attended @ weights.context[layer] + turn) + shift)
            x = np.stack(rows).astype(np.float32)
        self._logical += n
        stage.positions_computed += n
        stage.steps.append(n)
        if not stage.graph.head:
            return x[None]
        out = x[-1:] if last_only else x
        return np.stack([row @ weights.embed.T for row in out]).astype(np.float32)[None]

    def rewind(self, n: int) -> None:
        if n < 0 or n > self._logical:
            raise RuntimeStageError(f"cannot rewind {n} of {self._logical} positions")
        if n:
            for cache in self._cache:
                del cache[-n:]
            self._logical -= n

    def reset(self) -> None:
        for cache in self._cache:
            cache.clear()
        self._logical = 0


class PooledToySession(ToySession):
    """A toy session whose positions take blocks of its stage's pool (``agent.runtime.kv_blocks.PooledSession``): a
    step without room raises ``FleetBusyError``, as a paged stage's does."""

    def __init__(self, stage: ToyStage, pool: ToyPool) -> None:
        super().__init__(stage)
        self._pool = pool
        self.table = BlockTable()
        weakref.finalize(self, pool.allocator.free, self.table)

    @property
    def pool(self) -> ToyPool:
        return self._pool

    def step(self, inputs: np.ndarray, positions: np.ndarray | None = None, last_only: bool = False) -> np.ndarray:
        if not self._pool.allocator.reserve(self.table, self.logical_length + inputs.shape[1]):
            raise FleetBusyError(f"fleet busy: {self._pool.allocator.free_blocks} free toy KV blocks")
        out = super().step(inputs, positions, last_only)
        self.table.length = self.logical_length
        return out

    def rewind(self, n: int) -> None:
        super().rewind(n)
        self._pool.allocator.truncate(self.table, self.logical_length)

    def reset(self) -> None:
        super().reset()
        self._pool.allocator.free(self.table)

    def release(self) -> None:
        self._pool.allocator.free(self.table)


def toy_stages(manifest: Manifest, weights: ToyWeights | None = None) -> list[ToyStage]:
    """One toy stage per stage of ``manifest``, sharing one set of weights."""
    weights = weights or ToyWeights.make(manifest.arch.num_layers)
    return [ToyStage(graph, weights) for graph in manifest.stages]


class ToyTokenizer:
    """Stands in for ``ChatTokenizer``: bytes of each message to ids, roles and turns marked."""

    stop_ids = frozenset({END})

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        ids = [BOS]
        for message in messages:
            ids.append(ASSISTANT if message["role"] == "assistant" else USER)
            ids.extend(FIRST_TEXT_ID + byte % (VOCAB - FIRST_TEXT_ID) for byte in message["content"].encode())
            ids.append(END)
        ids.append(ASSISTANT)
        return ids

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = [FIRST_TEXT_ID + byte % (VOCAB - FIRST_TEXT_ID) for byte in text.encode()]
        return [BOS, *ids] if add_special_tokens else ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + (i - FIRST_TEXT_ID) % 26) for i in ids if i >= FIRST_TEXT_ID)
