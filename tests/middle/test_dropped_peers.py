"""What a stage server keeps of a peer once it is gone: nothing. Over TLS a connection holds its transport and a
256 KiB buffer, so anything that outlives a dropped peer grows the agent by that much (issue 46)."""

from __future__ import annotations

import asyncio
import gc
import weakref

import numpy as np

from agent.transport.connection import expect
from agent.wire import Frame, FrameType
from agent.wire.codec import DEFAULT_MAX_PAYLOAD
from agent.wire.messages import ErrorReport, Hello, parse
from tests.middle.toy_ring import ToyRing, run
from tests.support.memory_network import _Pipe
from tests.support.until import until


def test_a_peer_that_left_is_freed_once_its_last_frame_is_handled() -> None:
    """The stage's worker kept the last frame it handled, and with it that frame's connection, until the next frame
    came: an intruder's step of an unknown session, then a goodbye, left its connection alive."""

    async def main() -> None:
        ring = await ToyRing.start(stages=2)
        server = ring.servers[0]
        try:
            # a connection of its own, not dialled through the memory network (which keeps every pipe it made)
            pipe = _Pipe(("10.9.0.66", 40000), server.address, DEFAULT_MAX_PAYLOAD, "intruder")
            served = asyncio.create_task(server._accept(pipe.server))
            peer = pipe.client
            await peer.send(Hello("intruder", "head", ring.manifest.export_id, head_id=0x1D).to_frame())
            await expect(peer, FrameType.HELLO, 5.0)
            ids = np.asarray([[1]], dtype=np.int64)
            await peer.send(Frame.tensor(FrameType.STEP, ids, session=0x77, count=1))
            assert parse(await expect(peer, FrameType.ERROR, 5.0), ErrorReport).code == "unknown_session"
            await peer.close(goodbye=True)  # a goodbye: no warning whose record would hold the connection
            await served
            left = weakref.ref(pipe.server)
            del pipe, peer, served

            def freed() -> bool:
                gc.collect()  # the fast tier pauses the collector: what only a cycle refers to is not kept
                return left() is None

            # the worker frees the session downstream after the ERROR, then waits for the next frame: forever here
            await until(freed, 2.0, "the stage server let go of the connection of a peer that left")
        finally:
            await ring.stop()

    # collections inside the loop scan only this test's objects: a full one over the whole suite's heap took 1.04 s
    # in a full run, which the loop watch counts as a blocked loop
    gc.freeze()
    try:
        run(main)
    finally:
        gc.unfreeze()
