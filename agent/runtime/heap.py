"""Giving back the memory the C heap keeps: a donor's PC's memory that shoal does not use is its owner's.

glibc's malloc keeps freed memory in its heap for the next allocation rather than returning it to the system, and a
stage frees a lot of it: OpenVINO's buffers for a prompt grow with its length, so prompts of other lengths leave
the heap in pieces it keeps. ``malloc_trim(0)`` returns those pieces; measured after a soak's 175 requests (issue 46
§2, /tmp/hC) it gave back 104, 52 and 128 MB of three SmolLM2 stage agents' 533, 491 and 542 MB. Elsewhere (macOS,
Windows, musl) there is no such call and nothing is done.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from collections.abc import Callable

log = logging.getLogger(__name__)


def _no_trim(pad: int) -> int:
    """``malloc_trim``'s signature, for a C library without it: nothing released."""
    return 0


def _malloc_trim() -> Callable[[int], int]:
    if not sys.platform.startswith("linux"):
        return _no_trim
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):  # a C library without it (musl)
        return _no_trim
    trim.argtypes, trim.restype = (ctypes.c_size_t,), ctypes.c_int
    return trim  # type: ignore[no-any-return]


def give_back_heap() -> bool:
    """Return the free memory of this process's C heap to the system (glibc's ``malloc_trim(0)``); whether any was
    returned. It walks the whole heap holding its locks (milliseconds to tens of them on hundreds of MB): call it
    off the event loop, and when no step is computing."""
    return bool(_malloc_trim()(0))
