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

A kept session (``agent.head.resumable``) asks another question of a step: are its positions' numbers
those a fresh prompt of the same tokens gives them, wherever that prompt's steps are cut? Then a later turn
may take them over. What a stage computes alike (``Stage.alike``) is measured (SmolLM2 int4, OpenVINO
2026.4, a 400-position prompt's last logits against one step's):

- ``all``: f32 throughout. Any grouping, a prompt's or decoding's, moves the logits by at most 4.4e-5, the
  rounding f32's exact speculation lives with already.
- ``prompts``: one thread below f32, every prompt step on the paged compilation (``StageSession``): prompts
  cut as 150 + 250, 150 + 7 + 243, 1 + 399 or 150 + k + (250 - k) for k from 2 to 64 give bit-identical
  logits; a prompt step of one position does not (up to 0.94: other kernels), nor does decoding, which runs
  on the SDPA compilation (150 prompt positions decoded one at a time: up to 0.5).
- ``none``: elsewhere (several threads below f32: no two groupings agree; devices not measured). Only a
  prompt cut where a fresh one is cut, at multiples of ``--prefill-chunk``, is computed alike.

Each stage that computes a step's positions otherwise than a fresh prompt might marks it
``StepFlags.UNSETTLED``, and the mark rides the ring to the head as ``UNREPEATABLE`` does.
"""

from __future__ import annotations

from collections.abc import Iterable

from agent.runtime.protocol import Stage

ALIKE = ("none", "prompts", "all")
"""What a stage computes the same however positions are grouped into steps (``Stage.alike``), least first."""

ALIKE_MIN_PROMPT = 2
"""The fewest positions of a prompt step that a ``prompts`` stage computes alike (one position takes other
kernels)."""


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


def step_is_settled(alike: str, count: int, last_only: bool) -> bool:
    """Whether a stage that computes ``alike`` (``ALIKE``) gives this step's ``count`` positions the numbers a
    fresh prompt of the same tokens gives them, however that prompt's steps are cut; ``last_only``: a prompt."""
    return alike == "all" or (alike == "prompts" and last_only and count >= ALIKE_MIN_PROMPT)


def stages_alike(stages: Iterable[Stage]) -> str:
    """What stages computed one after the other compute alike: the least any of them does (``all`` for none)."""
    return min((stage.alike for stage in stages), key=ALIKE.index, default="all")
