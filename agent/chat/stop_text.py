"""Stop sequences: text that ends an answer, found even where it spans tokens, and cut off as OpenAI does.

Sans-IO: :meth:`StopText.push` takes each piece of text the answer streams and returns what may be shown
now. Text that could be the beginning of a stop sequence is held back until the next piece settles it;
when a stop sequence appears, the text before it is released and the answer ends (the sequence itself is
never shown). :meth:`StopText.rest` gives what is still held back when the answer ends otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence


class StopText:
    """Finds the first of ``stops`` in a streamed text."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = tuple(stops)
        self._held = ""
        self.stopped = False
        """A stop sequence appeared: nothing more is shown."""

    def push(self, piece: str) -> str:
        """Take the next piece of the answer's text; return the text that can be shown now."""
        if self.stopped:
            return ""
        text = self._held + piece
        found = self._first_found(text)
        keep = self._longest_open_prefix(text)
        if found is not None and found <= len(text) - keep:
            # no longer stop sequence that starts earlier can still complete: this one ends the answer
            self.stopped = True
            self._held = ""
            return text[:found]
        self._held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def rest(self) -> str:
        """What is still held back when the answer ends (cut before a stop sequence it holds: then ``stopped``)."""
        rest, self._held = self._held, ""
        found = self._first_found(rest)
        if found is None:
            return rest
        self.stopped = True  # a stop held back behind a longer one that might have begun earlier
        return rest[:found]

    def _first_found(self, text: str) -> int | None:
        found = [i for i in (text.find(stop) for stop in self.stops) if i >= 0]
        return min(found) if found else None

    def _longest_open_prefix(self, text: str) -> int:
        """The length of the longest end of ``text`` that a stop sequence begins with."""
        best = 0
        for stop in self.stops:
            for length in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:length]):
                    best = length
                    break
        return best
