"""gguf-py's reader, parsing its header through a plain array view of the memory map.

``GGUFReader`` slices its ``np.memmap`` once per field value, and every slice of a memmap runs
numpy's Python-level ``memmap.__getitem__`` and ``__array_finalize__``: with a 49k-token vocabulary
that is millions of calls, 6 s to open SmolLM2 on a 2-core machine. A plain ``ndarray`` view of the
same map parses the same bytes in 1.5 s; tensor data stays memory-mapped (views share the buffer).
"""

from __future__ import annotations

from typing import Any, Literal

import gguf
import numpy as np
import numpy.typing as npt


class PlainViewGGUFReader(gguf.GGUFReader):
    """A ``gguf.GGUFReader`` whose reads slice an ``ndarray`` view of its memmap."""

    _plain: np.ndarray | None = None

    def _get(
        self,
        offset: int,
        dtype: npt.DTypeLike,
        count: int = 1,
        override_order: Literal["I", "S", "<"] | None = None,
    ) -> npt.NDArray[Any]:
        if self._plain is None:
            self._plain = self.data.view(np.ndarray)
        count = int(count)
        dtype = np.dtype(dtype)
        arr = self._plain[offset : offset + dtype.itemsize * count].view(dtype=dtype)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))
