"""Log-probabilities of the target model's tokens, for clients that ask for them (OpenAI's ``logprobs``).

They are the model's own: ``log_softmax`` of the last stage's logits at each position, before temperature,
top-k or top-p (as vLLM and llama-server report them by default). The last stage, which alone has the logits,
reads out at each position the ``k`` most likely tokens and their log-probabilities (``k`` the alternatives the
client asked for, at least 1). The head picks the tokens, so it finds the chosen token's log-probability
there; a sampled token outside those ``k`` is found through the sampling distribution the stage sent anyway:
for every token ``i`` it gives a probability ``p(i)``, ``log_softmax(logits)[i] = T·ln p(i) + offset`` (``T``
the temperature; top-k and top-p renormalise every kept token by one factor), so one ``offset`` per position
completes it. What that costs on the wire: ``8·k + 4`` bytes a position.

Wire layout of a :class:`Logprobs` block (little-endian)::

    u32 count                      positions
    u32 k                          alternatives at each, 1..MAX_TOP_LOGPROBS
    count x k int32 ids            the most likely first
    count x k float32 logprobs     finite, <= 0
    count float32 offsets          finite (0 for greedy sessions)
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np

from agent.errors import RemoteProtocolError
from agent.sampling.distribution import SparseDistribution
from agent.sampling.params import MAX_TOP_LOGPROBS

_HEADER = struct.Struct("<II")
_ID = np.dtype("<i4")
_F32 = np.dtype("<f4")
LOGPROB_TOLERANCE = 1e-3
"""How far above 0 a log-probability from a peer may be (float32 rounding of a near-certain token)."""


@dataclass(frozen=True)
class TokenScore:
    """A chosen token's log-probability and the most likely tokens at its position (id, log-probability)."""

    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass(frozen=True, eq=False)
class Logprobs:
    """The ``k`` most likely tokens at each position of a step and their log-probabilities, and the offsets
    that give a sampled token's (module docstring). Equality is identity (numpy arrays)."""

    ids: np.ndarray
    """int32 ``[n, k]``, the most likely first."""
    values: np.ndarray
    """float32 ``[n, k]``."""
    offsets: np.ndarray
    """float32 ``[n]``."""

    def __len__(self) -> int:
        return int(self.offsets.shape[0])

    def rows(self, start: int, stop: int | None = None) -> Logprobs:
        """Positions ``start`` to ``stop`` (Python slice bounds)."""
        return Logprobs(self.ids[start:stop], self.values[start:stop], self.offsets[start:stop])

    def after(self, earlier: Logprobs) -> Logprobs:
        """``earlier``'s positions followed by these."""
        return Logprobs(
            np.concatenate([earlier.ids, self.ids]),
            np.concatenate([earlier.values, self.values]),
            np.concatenate([earlier.offsets, self.offsets]),
        )

    def score(
        self, row: int, token: int, wanted: int, temperature: float, dist: SparseDistribution | None
    ) -> TokenScore:
        """The score of ``token`` chosen at position ``row`` and the ``wanted`` most likely tokens there; ``dist``:
        the distribution it was sampled from (None: greedy, where it is the most likely, whose log-probability
        every token tied with it shares)."""
        ids, values = self.ids[row], self.values[row]
        hit = np.flatnonzero(ids == token)
        if hit.size:
            logprob = float(values[hit[0]])
        elif dist is None:
            logprob = float(values[0])
        else:
            # a sampled token has a probability: floored only so that a peer's odd answer cannot raise here
            logprob = temperature * math.log(max(dist.prob(token), 1e-45)) + float(self.offsets[row])
        top = tuple(zip(ids[:wanted].tolist(), values[:wanted].tolist(), strict=True))
        return TokenScore(logprob, top)


def read_logprobs(
    rows: np.ndarray, wanted: int, temperature: float, dists: list[SparseDistribution] | None
) -> Logprobs:
    """The :class:`Logprobs` of ``[n, vocab]`` logits: the ``max(wanted, 1)`` most likely tokens at each row, and
    (``dists``: the sampling distributions read out of the same rows) each row's offset."""
    z = rows.astype(np.float64)
    peak = z.max(axis=-1, keepdims=True)
    log_softmax = z - (peak + np.log(np.exp(z - peak).sum(axis=-1, keepdims=True)))
    k = min(max(wanted, 1), z.shape[-1])
    top = np.argpartition(-log_softmax, k - 1, axis=-1)[:, :k]
    values = np.take_along_axis(log_softmax, top, axis=-1)
    order = np.argsort(-values, axis=-1, kind="stable")
    ids = np.take_along_axis(top, order, axis=-1).astype(np.int32)
    values = np.take_along_axis(values, order, axis=-1)
    offsets = np.zeros(len(z), dtype=np.float64)
    if dists is not None:
        for i, dist in enumerate(dists):
            best = int(ids[i, 0])  # the most likely token is in every sampling distribution's support
            offsets[i] = log_softmax[i, best] - temperature * math.log(dist.prob(best))
    return Logprobs(ids, values.astype(np.float32), offsets.astype(np.float32))


def encode_logprobs(block: Logprobs) -> bytes:
    """The wire form of ``block`` (layout in the module docstring)."""
    n, k = block.ids.shape
    return b"".join(
        (
            _HEADER.pack(n, k),
            block.ids.astype(_ID, copy=False).tobytes(),
            block.values.astype(_F32, copy=False).tobytes(),
            block.offsets.astype(_F32, copy=False).tobytes(),
        )
    )


def decode_logprobs(data: memoryview, vocab_size: int, positions: int) -> tuple[Logprobs, int]:
    """A block from a peer at the start of ``data``, for a step of ``positions`` positions, and the bytes it took;
    anything malformed raises ``RemoteProtocolError``."""
    if data.nbytes < _HEADER.size:
        raise RemoteProtocolError("log-probability block shorter than its header")
    count, k = _HEADER.unpack_from(data, 0)
    if count != positions or not 1 <= k <= min(MAX_TOP_LOGPROBS, vocab_size):
        raise RemoteProtocolError(
            f"log-probability block of {count} positions x {k} for a step of {positions} (at most "
            f"{MAX_TOP_LOGPROBS} alternatives)"
        )
    size = _HEADER.size + 8 * count * k + 4 * count
    if data.nbytes < size:
        raise RemoteProtocolError(f"log-probability block truncated: {size} bytes needed, {data.nbytes} given")
    offset = _HEADER.size
    ids = np.frombuffer(data, dtype=_ID, count=count * k, offset=offset).reshape(count, k)
    values = np.frombuffer(data, dtype=_F32, count=count * k, offset=offset + 4 * count * k).reshape(count, k)
    offsets = np.frombuffer(data, dtype=_F32, count=count, offset=offset + 8 * count * k)
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise RemoteProtocolError("log-probability block holds token ids outside the vocabulary")
    if not (np.all(np.isfinite(values)) and np.all(np.isfinite(offsets))) or np.any(values > LOGPROB_TOLERANCE):
        raise RemoteProtocolError("log-probability block holds values that are not finite log-probabilities")
    return Logprobs(ids.copy(), values.copy(), offsets.copy()), size
