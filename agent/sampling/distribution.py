"""Sparse sampling distributions and their wire form.

After temperature / top-k / top-p most of a vocabulary has probability zero, so a distribution is
carried as its support: sorted token ids and their probabilities. Speculative sampling needs the
target's full distribution at every drafted position, and this is what the last stage sends back.

Wire layout (all little-endian)::

    u32 count                      number of positions
    count times:
        u32 n                      support size, 1..vocab_size
        n x int32 ids              strictly increasing, each in [0, vocab_size)
        n x float32 probs          finite, >= 0, summing to 1 within 1e-3
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from agent.errors import RemoteProtocolError

_U32 = struct.Struct("<I")
_ID = np.dtype("<i4")
_PROB = np.dtype("<f4")
SUM_TOLERANCE = 1e-3


@dataclass(frozen=True, eq=False)
class SparseDistribution:
    """The nonzero-probability support of a sampling distribution.

    ``ids`` are sorted (the constructor sorts them) and unique; both arrays are read-only.
    Equality is identity (numpy arrays have no single truth value); compare fields explicitly.
    """

    ids: np.ndarray  # int32, strictly increasing
    probs: np.ndarray  # float32, same length

    def __post_init__(self) -> None:
        ids = np.array(self.ids, dtype=np.int32, copy=True).reshape(-1)
        probs = np.array(self.probs, dtype=np.float32, copy=True).reshape(-1)
        if ids.shape != probs.shape:
            raise ValueError(f"{ids.size} ids but {probs.size} probabilities")
        if ids.size > 1 and not np.all(ids[1:] > ids[:-1]):
            order = np.argsort(ids, kind="stable")
            ids, probs = ids[order], probs[order]
            if np.any(ids[1:] == ids[:-1]):
                raise ValueError("token ids of a distribution must be unique")
        ids.setflags(write=False)
        probs.setflags(write=False)
        # Frozen dataclass: the normalised arrays replace the given ones through object.__setattr__.
        object.__setattr__(self, "ids", ids)
        object.__setattr__(self, "probs", probs)

    @classmethod
    def from_probs(cls, dense: np.ndarray) -> SparseDistribution:
        """The support of a dense ``[vocab]`` probability vector (e.g. ``Sampler.probabilities``)."""
        dense = np.asarray(dense, dtype=np.float64).reshape(-1)
        total = dense.sum()
        if not np.isfinite(total) or total <= 0 or np.any(dense < 0):
            raise ValueError("a distribution needs finite, non-negative probabilities with a positive sum")
        # Select after the float32 cast so entries too small for float32 do not become zero-probability support.
        as32 = (dense / total).astype(np.float32)
        ids = np.flatnonzero(as32 > 0)
        return cls(ids, as32[ids])

    def __len__(self) -> int:
        return int(self.ids.size)

    def prob(self, token: int) -> float:
        """The probability of ``token`` (0.0 outside the support)."""
        i = int(np.searchsorted(self.ids, token))
        if i < self.ids.size and int(self.ids[i]) == token:
            return float(self.probs[i])
        return 0.0

    def to_dense(self, vocab: int) -> np.ndarray:
        """A float64 ``[vocab]`` vector (float64 so that arithmetic on it does not lose mass)."""
        if self.ids.size and int(self.ids[-1]) >= vocab:
            raise ValueError(f"token id {int(self.ids[-1])} does not fit a vocabulary of {vocab}")
        dense = np.zeros(vocab, dtype=np.float64)
        dense[self.ids] = self.probs
        return dense


def encode_many(dists: Sequence[SparseDistribution]) -> bytes:
    """The wire form of one distribution per position (layout in the module docstring)."""
    parts = [_U32.pack(len(dists))]
    for d in dists:
        parts.append(_U32.pack(d.ids.size))
        parts.append(d.ids.astype(_ID, copy=False).tobytes())
        parts.append(d.probs.astype(_PROB, copy=False).tobytes())
    return b"".join(parts)


def decode_many(data: bytes, vocab_size: int, max_positions: int) -> list[SparseDistribution]:
    """Parse bytes from a peer; anything malformed raises ``RemoteProtocolError``."""
    if vocab_size < 1 or max_positions < 0:
        raise ValueError("vocab_size must be >= 1 and max_positions >= 0")
    view = memoryview(data).cast("B")
    size = view.nbytes
    if size < 4:
        raise RemoteProtocolError(f"distribution block of {size} bytes is shorter than its 4-byte header")
    (count,) = _U32.unpack_from(view, 0)
    if count > max_positions:
        raise RemoteProtocolError(f"distribution block has {count} positions, at most {max_positions} allowed")
    offset = 4
    # Every position needs at least its 4-byte size: reject an impossible count before looping over it.
    if size - offset < 4 * count:
        raise RemoteProtocolError(f"distribution block of {size} bytes cannot hold {count} positions")
    out: list[SparseDistribution] = []
    for position in range(count):
        if size - offset < 4:
            raise RemoteProtocolError(f"distribution block truncated at the size of position {position}")
        (n,) = _U32.unpack_from(view, offset)
        offset += 4
        if not 1 <= n <= vocab_size:
            raise RemoteProtocolError(f"position {position} has support size {n}, expected 1..{vocab_size}")
        if size - offset < 8 * n:
            raise RemoteProtocolError(
                f"distribution block truncated in position {position}: {8 * n} bytes needed, {size - offset} left"
            )
        ids = np.frombuffer(view, dtype=_ID, count=n, offset=offset)
        probs = np.frombuffer(view, dtype=_PROB, count=n, offset=offset + 4 * n)
        offset += 8 * n
        problem = _problem(ids, probs, vocab_size)
        if problem:
            raise RemoteProtocolError(f"position {position}: {problem}")
        out.append(SparseDistribution(ids, probs))
    if offset != size:
        raise RemoteProtocolError(f"distribution block has {size - offset} trailing bytes")
    return out


def _problem(ids: np.ndarray, probs: np.ndarray, vocab_size: int) -> str | None:
    """Why a decoded support is invalid, or None."""
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        return f"token id out of range [0, {vocab_size})"
    if ids.size > 1 and not np.all(ids[1:] > ids[:-1]):
        return "token ids are not strictly increasing"
    if not np.all(np.isfinite(probs)):
        return "probability is not finite"
    if np.any(probs < 0):
        return "probability is negative"
    total = float(probs.sum(dtype=np.float64))
    if abs(total - 1.0) > SUM_TOLERANCE:
        return f"probabilities sum to {total:.6g}, not 1"
    return None
