"""Stop sequences over streamed text (``agent.chat.stop_text``): what is shown equals the whole text cut
before the first stop sequence, however the text was split into pieces."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from agent.chat.stop_text import StopText


def _shown(pieces: list[str], stops: list[str]) -> tuple[str, bool]:
    filter_ = StopText(stops)
    shown = "".join(filter_.push(piece) for piece in pieces)
    if not filter_.stopped:
        shown += filter_.rest()
    return shown, filter_.stopped


def _reference(text: str, stops: list[str]) -> tuple[str, bool]:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return (text[: min(found)], True) if found else (text, False)


def test_a_stop_sequence_across_pieces_is_cut_with_what_follows() -> None:
    assert _shown(["Hello. Wor", "ld", ". More"], ["."]) == ("Hello", True)
    assert _shown(["one ##", "# two"], ["###"]) == ("one ", True)
    assert _shown(["a<", "/", "b>c"], ["</b>"]) == ("a", True)
    assert _shown(["a<", "x"], ["</b>"]) == ("a<x", False)
    # "a" is held behind ".aa", which began earlier, until the answer ends: then it is found, and ends the answer
    assert _shown([".a"], ["a", ".aa"]) == (".", True)


def test_text_that_might_begin_a_stop_is_held_back_then_released() -> None:
    stops = StopText(["END"])
    assert stops.push("the E") == "the "
    assert stops.push("N") == ""
    assert stops.push("D?") == ""
    assert stops.stopped
    stops = StopText(["END"])
    assert stops.push("the EN") == "the "
    assert stops.push("ough") == "ENough"
    assert stops.rest() == ""


@given(
    text=st.text(alphabet="ab.\n ", max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=8),
    stops=st.lists(st.text(alphabet="ab.\n", min_size=1, max_size=4), min_size=1, max_size=4),
)
def test_any_split_shows_the_text_cut_before_the_first_stop(text: str, cuts: list[int], stops: list[str]) -> None:
    bounds = sorted({0, len(text), *(min(c, len(text)) for c in cuts)})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    assert _shown(pieces, stops) == _reference(text, stops)


def test_a_longer_stop_that_starts_earlier_wins_over_one_found_first() -> None:
    """Found by hypothesis on a fresh clone's CI run: '.' completes first, but 'a.a' starts earlier."""
    stops = StopText([".", "a.a"])
    assert stops.push("a.") == ""
    assert stops.push("a") == "" and stops.stopped
    ending = StopText([".", "a.a"])
    assert ending.push("a.") == "" and ending.rest() == "a"  # the answer ended: cut before the '.'
