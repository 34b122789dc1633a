"""What every idle source shares: a reading that may fail, and the one-line reason it failed, logged once."""

from __future__ import annotations

import logging

from agent.errors import IdleSourceError

log = logging.getLogger(__name__)


class PolledSource:
    """An idle source read by one call that may fail. Subclasses set ``name`` and implement ``_read`` (seconds
    since the last input, raising :class:`IdleSourceError` with the reason) and ``_close`` (drop a connection, so
    that the next read opens a new one). Not thread-safe: one caller at a time."""

    name = "?"

    def __init__(self) -> None:
        self._problem: str | None = None

    def seconds_since_input(self) -> float | None:
        """Seconds since the last keyboard or mouse input; None when the source does not work now."""
        try:
            seconds = self._read()
        except IdleSourceError as exc:
            if self._problem != str(exc):
                log.info("idle source %s does not work: %s", self.name, exc)
            self._problem = str(exc)
            self._close()
            return None
        if self._problem is not None:
            log.info("idle source %s works again", self.name)
            self._problem = None
        return max(0.0, seconds)

    def problem(self) -> str | None:
        """Why this source does not work here (tried now); None when it does."""
        return None if self.seconds_since_input() is not None else self._problem

    def close(self) -> None:
        """Drop any connection the source holds."""
        self._close()

    def _read(self) -> float:
        raise NotImplementedError

    def _close(self) -> None:
        """Nothing to drop by default."""
