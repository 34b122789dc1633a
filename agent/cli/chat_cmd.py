"""``shoal chat``: the terminal UI (``tui``): chat through this PC's agent and watch the fleet answer.

The chat goes to the agent's chat endpoint (``<data dir>/chat.json``, written by ``shoal agent ... --chat``);
the fleet view polls the same agent's status over mutual TLS with this PC's node identity, found as
``shoal status`` finds it, and the status of each agent serving a stage of the plan (its step latency, sessions
and memory). Without an identity the chat still works and the fleet view says what is missing. Where this PC
holds the fleet's CA key (``--fleet-dir``, default ``<data dir>/fleet``), the admin screen is there too
(``agent.cli.chat_admin``). Textual is imported only when the command runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from agent.addresses import parse_address
from agent.chat_client.endpoint import ChatEndpoint
from agent.cli.common import Subcommands, identity_dir
from agent.cli.status_link import StatusLink
from agent.errors import FleetError, PeerUnavailableError
from agent.fleet import NodeIdentity
from agent.node.running import running_agent

if TYPE_CHECKING:
    from tui.admin import AdminSource
    from tui.sources import PeerStatusSource, StatusSource

STATUS_TIMEOUT = 3.0
"""Seconds a status poll waits for the agent: a frozen agent shows as unreachable this soon."""


def add_parser(sub: Subcommands) -> None:
    """Register ``shoal chat``."""
    p = sub.add_parser("chat", help="chat with the fleet in a terminal UI, and watch its stages")
    p.add_argument(
        "--identity",
        default=None,
        metavar="NAME|DIR",
        help="the identity of this PC's agent (the one started with --chat), to show the fleet: its folder, or a "
        "node name under <data dir>/fleet/nodes (default: the only one there)",
    )
    p.add_argument(
        "--chat-file", type=Path, default=None, help="the agent's chat endpoint file (default: <data dir>/chat.json)"
    )
    p.add_argument(
        "--data-dir", type=Path, default=None, help="shoal's data folder (default: $SHOAL_DATA_DIR or the platform's)"
    )
    p.add_argument(
        "--fleet-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="the fleet folder with the CA key: its holder gets the admin screen (default: <data dir>/fleet)",
    )
    p.add_argument(
        "--conversations",
        type=Path,
        default=None,
        metavar="FILE",
        help="the SQLite file of past conversations (default: <data dir>/conversations.sqlite)",
    )


def run_chat(args: argparse.Namespace, data_dir: Path) -> int:
    data_dir = args.data_dir or data_dir
    return open_chat(
        args.chat_file or data_dir / "chat.json", args.identity, data_dir, args.conversations, args.fleet_dir
    )


def open_chat(
    chat_file: Path,
    identity: str | None,
    data_dir: Path,
    conversations: Path | None = None,
    fleet_dir: Path | None = None,
) -> int:
    """Run the TUI on the agent whose chat endpoint file is ``chat_file`` until the user quits (``shoal chat``,
    and ``shoal demo`` in a terminal); returns the exit status."""
    ChatEndpoint.load(chat_file)  # no agent heads chats here: say so now, with what to start, not inside the UI
    from tui.app import ChatApp
    from tui.sources import EndpointChatSource
    from tui.store import ConversationStore

    app = ChatApp(
        EndpointChatSource(chat_file),
        status_source(identity, data_dir),
        ConversationStore(conversations or data_dir / "conversations.sqlite"),
        peers=peer_source(identity, data_dir),
        admin=admin_source(fleet_dir or data_dir / "fleet", identity, data_dir),
    )
    with _logging_to(data_dir / "chat.log"):
        app.run()
    return app.return_code or 0


def status_source(identity: str | None, data_dir: Path) -> StatusSource:
    """The status of the agent running with this PC's identity, through a link held open (re-dialled, and the
    agent looked up again, after a failure)."""
    from tui.sources import LinkStatusSource, NoStatus

    try:
        folder = identity_folder(identity, data_dir)
        node = NodeIdentity.load(folder)
    except FleetError as exc:
        return NoStatus(f"the fleet cannot be shown: {exc}")

    async def connect() -> StatusLink:
        address = await asyncio.to_thread(running_agent, folder)
        if address is None:
            start = f"shoal agent --identity {folder} --chat 127.0.0.1:0"
            raise PeerUnavailableError(
                f"no agent runs with the identity in {folder}: --identity names the identity of this PC's agent, "
                f"the one started with --chat; or start `{start}`"
            )
        return await StatusLink.open(parse_address(address), node, timeout=STATUS_TIMEOUT)

    return LinkStatusSource(connect)


def peer_source(identity: str | None, data_dir: Path) -> PeerStatusSource | None:
    """The status of the plan's other agents, dialled with this PC's identity (None without one: the fleet view
    then shows their figures as unknown)."""
    from tui.sources import LinkPeerStatus

    try:
        node = NodeIdentity.load(identity_folder(identity, data_dir))
    except FleetError:
        return None

    async def connect(address: str) -> StatusLink:
        return await StatusLink.open(parse_address(address), node, timeout=STATUS_TIMEOUT)

    return LinkPeerStatus(connect)


def admin_source(fleet_dir: Path, identity: str | None, data_dir: Path) -> AdminSource | None:
    """The admin screen's source where this PC holds the fleet key in ``fleet_dir``, else None (no admin screen).
    Changes go to the agent running with this PC's identity, if it has one."""
    from agent.cli.chat_admin import FleetAdmin, holds_fleet_key

    if not holds_fleet_key(fleet_dir):
        return None
    try:
        node: NodeIdentity | None = NodeIdentity.load(identity_folder(identity, data_dir))
    except FleetError:
        node = None
    return FleetAdmin(fleet_dir, node)


def identity_folder(identity: str | None, data_dir: Path) -> Path:
    """``--identity``: a folder, or a node name issued under the data dir (``shoal fleet issue NAME``)."""
    if identity is not None and "/" not in identity and not Path(identity).is_dir():
        named = data_dir / "fleet" / "nodes" / identity
        if named.is_dir():
            return named
    return identity_dir(Path(identity) if identity is not None else None, data_dir)


@contextlib.contextmanager
def _logging_to(path: Path) -> Iterator[None]:
    """While the UI owns the terminal, log lines go to ``path`` instead of stderr (they would tear the screen)."""
    root = logging.getLogger()
    kept = root.handlers[:]
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.handlers[:] = [handler]
    try:
        yield
    finally:
        root.handlers[:] = kept
        handler.close()
