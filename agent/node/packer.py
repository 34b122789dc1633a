"""The stage server's packing decision: it lives in ``agent.runtime.packer``, where a head's own stages use it too."""

from agent.runtime.packer import (
    DEFAULT_BUDGET,
    FORGET_AFTER,
    Pack,
    PackPolicy,
    ReadyStep,
    Slice,
    Turns,
    Wait,
    in_turn,
    next_chunk,
    plan,
)

__all__ = [
    "DEFAULT_BUDGET",
    "FORGET_AFTER",
    "Pack",
    "PackPolicy",
    "ReadyStep",
    "Slice",
    "Turns",
    "Wait",
    "in_turn",
    "next_chunk",
    "plan",
]
