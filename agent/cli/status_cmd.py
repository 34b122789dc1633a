"""``shoal status ADDR``: ask an agent what it holds (sessions, load, its link to the next stage)."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from agent.cli.common import identity_dir
from agent.errors import RingError
from agent.fleet import NodeIdentity
from agent.node.config import parse_address
from agent.transport.connection import dial, expect
from agent.transport.tls import client_context
from agent.wire import Frame, FrameType
from agent.wire.messages import Hello


async def fetch_status(address: tuple[str, int], identity: NodeIdentity, timeout: float = 10.0) -> dict[str, object]:
    """One agent's status document."""
    connection = await dial(*address, client_context(identity), timeout=timeout)
    try:
        await connection.send(Hello(node=identity.name, role="status").to_frame())
        await expect(connection, FrameType.HELLO, timeout)
        await connection.send(Frame(FrameType.STATUS_REQUEST))
        frame = await expect(connection, FrameType.STATUS, timeout)
    finally:
        await connection.close()
    data = json.loads(frame.body())
    if not isinstance(data, dict):
        raise RingError("the agent's status is not a JSON object")
    return data


def run_status(args: argparse.Namespace, data_dir: Path) -> int:
    identity = NodeIdentity.load(identity_dir(args.identity, data_dir))
    for text in args.address:
        print(json.dumps(asyncio.run(fetch_status(parse_address(text), identity)), indent=1))
    return 0
