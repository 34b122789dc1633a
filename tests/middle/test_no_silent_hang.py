"""Nothing hangs without a word (issue 22 §1): an answer that can never come fails at once with the stage and
the reason; a step whose answer never comes fails at its deadline; ring flags that contradict the agent's
stages are refused before it starts."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.daemon import Daemon
from agent.errors import ConfigError, PeerUnavailableError, SessionFailedError
from agent.head.ring_client import RingClient, StepDeadline
from agent.node.server import StageServer
from tests.middle.toy_ring import GREEDY, ToyRing, run, stage_address
from tests.support.toy_model import ToyStage, ToyTokenizer, ToyWeights, toy_manifest

PROMPT = [1, 3, 9, 14, 22, 2, 4]


def test_a_head_that_names_the_wrong_last_stage_is_told_at_once_by_the_real_one() -> None:
    async def main() -> None:
        ring = await ToyRing.start()
        # a second agent serving the last stage, outside the ring's path: the head takes it for the last
        stray_config = ring.config(2, listen=("10.9.0.9", 7000))
        stray_stage = ToyStage(ring.manifest.stages[2], ring.weights)
        stray = StageServer(stray_config, ring.manifest, [stray_stage], "stray", ring.network.host("10.9.0.9"))
        await stray.start()
        client = RingClient(ring.manifest, stage_address(0), ("10.9.0.9", 7000), ring.network.host("10.9.0.100"), "h")
        await client.connect()
        try:
            session = await client.open_session(GREEDY)
            with pytest.raises(SessionFailedError, match="head_unreachable: toy2 is the last stage, and head"):
                await asyncio.wait_for(session.step(PROMPT, 0, last_only=True), 2.0)
            await ring.until(lambda: ring.held() == [0, 0, 0])
            assert stray_stage.positions_computed == 0 and ring.stages[2].positions_computed == 0
        finally:
            await client.close()
            await stray.stop()
            await ring.stop()

    run(main)


def test_a_step_whose_answer_never_comes_fails_at_its_deadline_and_the_stages_free_it() -> None:
    async def main() -> None:
        ring = await ToyRing.start()
        black_hole = ring.servers[1]

        async def swallow(running: object, output: object) -> None:  # a stage that drops steps without a word
            return None

        black_hole._deliver = swallow  # type: ignore[method-assign]
        first, last = ring.servers[0].address, ring.servers[-1].address
        network = ring.network.host("10.9.0.100")
        client = RingClient(ring.manifest, first, last, network, "h", deadline=StepDeadline(0.3, 0.0))
        await client.connect()
        try:
            session = await client.open_session(GREEDY)
            started = asyncio.get_running_loop().time()
            with pytest.raises(PeerUnavailableError, match="no answer to step 0 within 0 s, though every link"):
                await session.step(PROMPT, 0, last_only=True)
            assert asyncio.get_running_loop().time() - started < 1.0
            await session.close()
            await ring.until(lambda: ring.held() == [0, 0, 0])
        finally:
            await client.close()
            await ring.stop()

    run(main)


@pytest.mark.parametrize(
    ("stage", "changes", "message"),
    [
        (
            2,
            {"ring_last": stage_address(2), "ring_first": stage_address(0)},
            "serves the last stage .2., so it answers",
        ),
        (0, {"ring_first": stage_address(0)}, "serves stage 0, so its chats start on it"),
        (2, {"next": stage_address(0), "ring_first": stage_address(0)}, "serves the last stage .2.: it has no next"),
        (1, {"next": None, "ring_first": stage_address(0)}, "the next stage's address is needed"),
    ],
)
def test_ring_flags_that_contradict_the_agents_stages_are_refused(
    tmp_path: Path, stage: int, changes: dict[str, object], message: str
) -> None:
    async def main() -> None:
        manifest = toy_manifest(3)
        ring = ToyRing(manifest, ToyWeights.make(manifest.arch.num_layers))
        config = ring.config(stage, chat=("127.0.0.1", 0), chat_file=tmp_path / "chat.json", **changes)
        toy = ToyStage(ring.manifest.stages[stage], ring.weights)
        with pytest.raises(ConfigError, match=message):
            Daemon(config, "n", ring.manifest, [toy], ring.network.host("10.9.0.1"), load_tokenizer=ToyTokenizer)

    run(main)
