"""Where the TUI's data comes from, behind two small Protocols: a chat source and a status source.

The app sees nothing else of the agent, so tests hand it fakes (and a fixed clock). The real ones:

- :class:`EndpointChatSource` reads the agent's endpoint file (``chat.json``) at each answer, so an agent
  restarted on another port is found again, and streams through ``agent.chat_client.client.ask``. Leaving an
  answer's iteration early closes its connection, which cancels the answer on the agent: Esc does that.
- :class:`LinkStatusSource` keeps one status link open (``StatusLink`` of ``shoal status``, handed in by the
  command line as a ``connect`` function, so that this package never imports the agent's runtime) and dials
  again after a failure.

- :class:`LinkPeerStatus` does the same for the plan's other agents (a link to each, dialled with this PC's
  identity by a ``connect(address)`` of the command line): their own status holds what the local one cannot
  know, each stage's step latency, sessions and memory.

Failures arrive as :class:`~agent.errors.ShoalError`: a chat's as an ``error`` event, a status's raised.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from agent.chat_client.client import ask
from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatEvent, ChatRequest
from agent.errors import ChatEndpointError, PeerUnavailableError, ShoalError
from tui.generation import GenerationSettings, Turn

Clock = Callable[[], float]
"""Seconds (``time.time`` in the app; tests pass a fixed or stepping one)."""


class ChatSource(Protocol):
    def answer(self, messages: Sequence[Turn], settings: GenerationSettings) -> AsyncGenerator[ChatEvent, None]:
        """The events of one answer to ``messages`` (the user's last): ``token`` events, then one ``done`` or
        one ``error``. Closing the iterator before its end (``aclose``, a cancellation) stops the answer."""
        ...


class StatusSource(Protocol):
    async def get(self) -> dict[str, Any]:
        """The local agent's status document now; raises :class:`ShoalError` when it cannot be had."""
        ...

    async def close(self) -> None: ...


class PeerStatusSource(Protocol):
    async def get(self, node: str, address: str) -> dict[str, Any]:
        """The status document of the agent ``node`` (a node id) heard at ``address`` (``host:port``); raises
        :class:`ShoalError` when it cannot be had."""
        ...

    async def close(self) -> None: ...


class EndpointChatSource:
    """Answers from the agent whose chat endpoint file is ``endpoint_file``."""

    def __init__(
        self,
        endpoint_file: Path,
        stream: Callable[[ChatEndpoint, ChatRequest], AsyncIterator[ChatEvent]] = ask,
    ) -> None:
        self.endpoint_file = endpoint_file
        self._stream = stream

    async def answer(self, messages: Sequence[Turn], settings: GenerationSettings) -> AsyncGenerator[ChatEvent, None]:
        try:
            endpoint = await asyncio.to_thread(ChatEndpoint.load, self.endpoint_file)
        except ChatEndpointError as exc:
            yield ChatEvent.error("agent_unavailable", str(exc))
            return
        events = self._stream(endpoint, settings.request(endpoint.token, messages))
        async with contextlib.aclosing(events):  # type: ignore[type-var]  # ask() is an async generator
            async for event in events:
                yield event


class StatusLinkLike(Protocol):
    """What ``agent.cli.status_link.StatusLink`` offers."""

    async def get(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class LinkStatusSource:
    """The status of one agent through a link held open; a link that fails is closed, and dialled again at the
    next :meth:`get` (by then the agent may be back, on another port: ``connect`` looks it up each time)."""

    def __init__(self, connect: Callable[[], Awaitable[StatusLinkLike]]) -> None:
        self._connect = connect
        self._link: StatusLinkLike | None = None

    async def get(self) -> dict[str, Any]:
        try:
            if self._link is None:
                self._link = await self._connect()
            return await self._link.get()
        except (ShoalError, OSError, ValueError) as exc:
            await self.close()
            if isinstance(exc, ShoalError):
                raise
            raise PeerUnavailableError(f"the agent's status failed: {exc}") from exc

    async def close(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            with contextlib.suppress(ShoalError, OSError):
                await link.close()


class LinkPeerStatus:
    """The status of other agents, a :class:`LinkStatusSource` for each node (a node heard at a new address is
    dialled there, its old link closed)."""

    def __init__(self, connect: Callable[[str], Awaitable[StatusLinkLike]]) -> None:
        """``connect(address)``: a status link to the agent at ``host:port``."""
        self._connect = connect
        self._links: dict[str, tuple[str, LinkStatusSource]] = {}

    async def get(self, node: str, address: str) -> dict[str, Any]:
        held = self._links.get(node)
        if held is None or held[0] != address:
            if held is not None:
                await held[1].close()
            held = (address, LinkStatusSource(lambda: self._connect(address)))
            self._links[node] = held
        return await held[1].get()

    async def close(self) -> None:
        links, self._links = self._links, {}
        for _, source in links.values():
            await source.close()


class NoStatus:
    """The status source of a TUI that cannot ask its agent (no identity to dial it with): says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    async def get(self) -> dict[str, Any]:
        raise PeerUnavailableError(self.reason)

    async def close(self) -> None:
        return None
