"""The control links of one agent (``discovery.service``): one it dialled to each peer, any it accepted, and
sending on all of them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from agent.transport.connection import FrameConnection, send_quietly
from agent.transport.tasks import OwnedTasks
from agent.wire import Frame
from discovery.membership import Source


@dataclass
class Link:
    """A control link to a peer's process, from its handshake until it ends."""

    node: str
    instance: str
    """The peer's process (its announcement's ``instance``): what it says on this link is about that process."""
    host: str
    connection: FrameConnection
    outbound: bool
    via: Source
    skew: float = 0.0
    """Peer's wall clock minus ours at the handshake (seconds)."""
    dialled: tuple[str, int] | None = None
    """The address this agent dialled (outbound links): where to wait before dialling again if refused."""
    accepted: bool = False
    """Whether the peer accepted this agent on it (it sent anything but a refusal)."""


class Links:
    """Every control link of this agent: at most one dialled per peer (``dialled``), any number it accepted."""

    def __init__(self) -> None:
        self.dialled: dict[str, Link] = {}
        self._accepted: dict[str, list[Link]] = {}

    def __iter__(self) -> Iterator[Link]:
        """Every link, a copy: links may end while the caller goes through them."""
        return iter(list(self.dialled.values()) + [link for group in self._accepted.values() for link in group])

    def add(self, link: Link) -> None:
        if link.outbound:
            self.dialled[link.node] = link
        else:
            self._accepted.setdefault(link.node, []).append(link)

    def forget(self, link: Link) -> None:
        if link.outbound:
            if self.dialled.get(link.node) is link:
                del self.dialled[link.node]
        else:
            group = self._accepted.get(link.node, [])
            if link in group:
                group.remove(link)

    def linked(self, node: str) -> bool:
        """Whether any link to ``node`` is open."""
        return node in self.dialled or bool(self._accepted.get(node))

    def send_all(self, frame: Frame, tasks: OwnedTasks, but: str | None = None) -> None:
        """Send ``frame`` on every link (but those to the node ``but``), each in the background: a slow peer holds
        up nobody."""
        for link in self:
            if link.node != but:
                tasks.spawn(send_quietly(link.connection, frame))
