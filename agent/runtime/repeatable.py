"""Which steps give the same answer whichever way an answer's positions were grouped into steps.

Greedy text is repeatable when the same question gets the same tokens: alone or beside others, with or
without drafting. A stage whose speculation is exact (``Stage.exact_speculation``: f32 throughout, or one
thread cutting its rewinds) computes every position the same in any grouping. Elsewhere (several threads
below f32, masked rewinds, devices not measured) a step that verifies drafted positions or rewinds
rejected ones rounds unlike the single steps plain decoding takes, and since how many positions a head
drafts follows its measured timing, the tokens can change from one asking to the next. A prompt, whole
or in its fixed chunks (``agent.head.prefill``), and a one-position step are computed the same every time.

Each stage marks such a step ``StepFlags.UNREPEATABLE`` and the last one returns the mark with the answer,
so the head knows, per answer, whether it was exact.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.runtime.protocol import Stage


def step_is_repeatable(exact_speculation: bool | None, count: int, rewind: int, last_only: bool) -> bool:
    """Whether a stage computes this step as any other grouping of its positions would: always where its
    speculation is exact; elsewhere only a step that rewinds nothing and is a prompt (``last_only``: its
    last position read out) or a single position."""
    if exact_speculation is True:
        return True
    return rewind == 0 and (last_only or count == 1)


def stages_exact(stages: Iterable[Stage]) -> bool | None:
    """The speculation exactness of stages computed one after the other: False if one is not exact, None if
    one was never measured (another device), else True."""
    claims = [stage.exact_speculation for stage in stages]
    if False in claims:
        return False
    return None if None in claims else True
