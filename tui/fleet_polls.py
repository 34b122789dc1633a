"""The fleet as the app polls it: the local agent's status and the plan's other agents', each a loop for one of
the app's workers, and the fleet report made of the last two documents of each (for recent step latencies).

The loops post :class:`~tui.events.StatusPolled` and :class:`~tui.events.PeersPolled`; the app hands those back
here (:meth:`FleetPolls.status_polled`, :meth:`FleetPolls.peers_polled`) and shows the report they give."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from textual.message import Message

from agent.errors import ShoalError
from tui.events import PeersPolled, StatusPolled
from tui.fleet import FleetReport, fleet_report, peer_addresses, unreachable
from tui.sources import PeerStatusSource, StatusSource

log = logging.getLogger(__name__)

Post = Callable[[Message], object]


class FleetPolls:
    """The local agent's status and the plan's other agents' (``peers``: None, their own figures unknown)."""

    def __init__(self, status: StatusSource, peers: PeerStatusSource | None, poll_seconds: float) -> None:
        self.status = status
        self.peers = peers
        self._poll_seconds = poll_seconds
        self._status_docs: tuple[dict[str, Any] | None, dict[str, Any] | None] = (None, None)
        """The local agent's last status and the one before (for recent step latencies)."""
        self._peer_docs: tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]] = ({}, {})
        """The plan's other agents' last statuses by node id, and the ones before those."""
        self._peer_targets: dict[str, str] = {}
        """The agents to poll besides the local one: node id -> ``host:port``."""

    async def poll_status(self, post: Post) -> None:
        """Post the local agent's status every ``poll_seconds``, or why there is none, until cancelled."""
        while True:
            try:
                status = await self.status.get()
            except ShoalError as exc:
                post(StatusPolled(None, str(exc)))
            except Exception as exc:  # the UI's edge, as for the chat
                log.exception("the status poll failed")
                post(StatusPolled(None, f"the status poll failed: {exc}"))
            else:
                post(StatusPolled(status))
            await asyncio.sleep(self._poll_seconds)

    async def poll_peers(self, peers: PeerStatusSource, post: Post) -> None:
        """Poll the plan's other agents, each on its own: a slow or frozen one delays only its own figures (a real
        link gives up after its timeout), never the others' nor the local status."""

        async def one(node: str, address: str) -> dict[str, Any] | None:
            try:
                return await peers.get(node, address)
            except ShoalError as exc:
                log.info("no status from %s at %s: %s", node, address, exc)
            except Exception:  # the UI's edge, as for the chat
                log.exception("the status of %s at %s failed", node, address)
            return None

        asking: dict[str, asyncio.Task[dict[str, Any] | None]] = {}
        try:
            while True:
                for node, address in self._peer_targets.items():
                    if node not in asking:
                        asking[node] = asyncio.create_task(one(node, address))
                answered = {node: asking.pop(node).result() for node, task in list(asking.items()) if task.done()}
                if answered:
                    post(PeersPolled(answered))
                await asyncio.sleep(self._poll_seconds)
        finally:
            for task in asking.values():
                task.cancel()
            await asyncio.gather(*asking.values(), return_exceptions=True)

    def status_polled(self, message: StatusPolled) -> FleetReport:
        """The report after a status poll (an unreachable agent's, when the poll failed)."""
        if message.status is None:
            self._status_docs = (None, None)
            self._peer_targets = {}
            return unreachable(message.error or "")
        self._status_docs = (message.status, self._status_docs[0])
        self._peer_targets = peer_addresses(message.status)
        return self._report(message.status)

    def peers_polled(self, message: PeersPolled) -> FleetReport | None:
        """The report after the peers answered; None before the local agent's first status."""
        docs, before = self._peer_docs
        for node, doc in message.statuses.items():
            if doc is None:  # no answer: its figures are unknown until it answers again
                docs.pop(node, None)
                before.pop(node, None)
            else:
                if node in docs:
                    before[node] = docs[node]
                docs[node] = doc
        status = self._status_docs[0]
        return self._report(status) if status is not None else None

    def _report(self, status: dict[str, Any]) -> FleetReport:
        """The report of ``status`` and the peers' last documents, each beside the one before it."""
        status_before = self._status_docs[1]
        peers, peers_before = self._peer_docs
        before = dict(peers_before)
        members = status.get("members")
        own = members.get("node") if isinstance(members, dict) else None
        if isinstance(own, str) and status_before is not None:
            before[own] = status_before
        return fleet_report(status, peers, before)

    async def close(self) -> None:
        """Close the status sources (their links)."""
        with contextlib.suppress(ShoalError, OSError):
            await self.status.close()
        if self.peers is not None:
            with contextlib.suppress(ShoalError, OSError):
                await self.peers.close()
