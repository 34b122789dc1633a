"""Throughput: tokens/s of the answer streaming now, and a sparkline of the last minutes with their fastest answer."""

from __future__ import annotations

from collections import deque

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Label, Sparkline


class RateHistory:
    """Tokens received, counted in ``bucket`` -second buckets over the last ``window`` seconds, and the rates of
    the answers finished in that window."""

    def __init__(self, window: float = 180.0, bucket: float = 2.0) -> None:
        self.window = window
        self.bucket = bucket
        self._counts: deque[tuple[int, int]] = deque()  # (bucket index, tokens), oldest first
        self._answers: deque[tuple[float, float]] = deque()  # (when it finished, tokens/s), oldest first

    def answered(self, rate: float, at: float) -> None:
        """An answer finished at ``at`` with ``rate`` tokens/s (as its ``done`` event counts them)."""
        self._answers.append((at, rate))

    def fastest(self, now: float) -> float | None:
        """The highest rate of the answers finished in the window (None: none).

        Not the plot's highest bucket: a bucket averages over its whole time, also before an answer's first
        token and after its last, so a short answer's buckets stay below its own rate (issue 40 §7: "peak
        14.0 tok/s" beside "last answer: 20.1 tok/s")."""
        while self._answers and self._answers[0][0] <= now - self.window:
            self._answers.popleft()
        return max((rate for _, rate in self._answers), default=None)

    def add(self, tokens: int, at: float) -> None:
        index = int(at // self.bucket)
        if self._counts and self._counts[-1][0] == index:
            self._counts[-1] = (index, self._counts[-1][1] + tokens)
        else:
            self._counts.append((index, tokens))

    def series(self, now: float) -> list[float]:
        """Tokens/s of each bucket of the window, oldest first, the current (partial) bucket last."""
        last = int(now // self.bucket)
        first = last - int(self.window // self.bucket) + 1
        while self._counts and self._counts[0][0] < first:
            self._counts.popleft()
        counts = dict(self._counts)
        return [counts.get(index, 0) / self.bucket for index in range(first, last + 1)]


class ThroughputPanel(Vertical):
    """The rate and time to first token of the current (or last) answer, and the sparkline."""

    rate: reactive[float | None] = reactive(None)
    """Tokens/s of the answer streaming now, or of the last one (None: no answer yet)."""
    ttft: reactive[float | None] = reactive(None)
    """Seconds to the first token of that answer."""
    series: reactive[tuple[float, ...]] = reactive(())
    """Tokens/s over the last minutes (``RateHistory.series``)."""
    fastest: reactive[float | None] = reactive(None)
    """The fastest answer of those minutes, tokens/s (``RateHistory.fastest``; None: none)."""
    streaming: reactive[bool] = reactive(False)

    def __init__(self, minutes: float, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.minutes = minutes
        self.border_title = "Throughput"
        self._now = Label(id="throughput-now", markup=False)
        self._plot = Sparkline([], id="throughput-plot")
        self._scale = Label(id="throughput-scale", markup=False)

    def compose(self) -> ComposeResult:
        yield self._now
        yield self._plot
        yield self._scale

    def _show_now(self) -> None:
        if self.rate is None and self.ttft is None:
            text = "no answer yet" if not self.streaming else "waiting for the first token…"
        else:
            which = "this answer" if self.streaming else "last answer"
            rate = "—" if self.rate is None else f"{self.rate:.1f} tok/s"
            first = "" if self.ttft is None else f" · first token {self.ttft:.2f} s"
            text = f"{which}: {rate}{first}"
        self._now.update(text)

    watch_rate = watch_ttft = watch_streaming = _show_now

    def _show_series(self) -> None:
        self._plot.data = list(self.series)

    def _show_scale(self) -> None:
        fastest = "" if self.fastest is None else f" · fastest answer {self.fastest:.1f} tok/s"
        self._scale.update(f"last {self.minutes:g} min{fastest}")

    watch_series = _show_series
    watch_fastest = _show_scale

    def on_mount(self) -> None:
        self._show_scale()
