"""A donor's user comes back in the middle of an answer (issue 43, acceptance 3): nothing is lost.

Five real agents in this process, over mutual TLS on loopback, one inference thread each: three serve the
stages of the SmolLM2 int4 export, one stands by, one (the user's PC, no memory offered) heads the chat. Every
agent but the head is a donor whose PC the test moves (an injected reading: no input for an hour). While an
answer streams, the owner of a stage's PC touches the keyboard. That PC drains: the plan gives its stage to the
standby, the head replays the session there, and the answer ends with exactly the tokens of an undisturbed run.
Within 5 s of the input the PC says it is away and holds no stage; once its owner has been gone for the idle
time again, it stands by again. The pause the user saw is printed.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from agent.chat_client.client import ask
from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatRequest
from agent.daemon import Daemon
from agent.donor.policy import DonorSettings, Readings
from agent.fleet import NodeIdentity, init_fleet, issue_node
from agent.head.chat import ChatTokenizer
from agent.node.config import AgentConfig
from agent.node.donor_watch import DonorWatch
from agent.node.ring_former import RingFormer
from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import LocalPipeline
from discovery import control
from discovery.admin import edit_fleet_document, push_document
from discovery.fleet_document import ModelSource, serving
from discovery.plan_service import FleetPlanService
from shards.manifest import Manifest
from tests.integration.local_decode import greedy_tokens
from tests.support.until import until

pytestmark = pytest.mark.timeout(300)

PROMPT = "Write a short story about a lighthouse keeper."
MAX_TOKENS = 48
IDLE_MINUTES = 0.1
"""Six seconds without input and a PC serves again (the default is three minutes)."""
DONORS = ("alpha", "beta", "gamma", "delta")


class PC:
    """A donor's PC whose owner the test moves: the seconds since the last input, on the real clock."""

    def __init__(self) -> None:
        self.last_input = time.monotonic() - 3600.0

    def touch(self) -> None:
        self.last_input = time.monotonic()

    def read(self) -> Readings:
        now = time.monotonic()
        return Readings(now, now - self.last_input, None, 0.0, 16000, None)


def part(daemon: Daemon, kind: type[Any]) -> Any:
    return next(p for p in daemon.parts if isinstance(p, kind))


def test_a_donor_whose_user_returns_mid_answer_hands_its_stage_over_and_the_answer_is_unchanged(
    exported: Callable[..., Path], cache_dir: Path, tmp_path: Path
) -> None:
    folder = exported(3, "int4")
    tokenizer = ChatTokenizer(folder / "tokenizer")
    pipeline = LocalPipeline(folder, Manifest.load(folder), RuntimeConfig(threads=1, cache_dir=cache_dir / "ov"))
    prompt_ids = tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    reference = greedy_tokens(pipeline, prompt_ids, max_tokens=MAX_TOKENS, stop_ids=tokenizer.stop_ids)
    fleet_dir = tmp_path / "fleet"
    init_fleet(fleet_dir, "office")
    identities = {name: issue_node(fleet_dir, name) for name in (*DONORS, "head", "admin")}
    pcs = {name: PC() for name in DONORS}

    @asynccontextmanager
    async def agent(identity: NodeIdentity, seed: Daemon | None, **changes: Any) -> AsyncIterator[Daemon]:
        config = AgentConfig(
            export_dir=None,
            stages=(),
            identity_dir=identity.cert.parent,
            peers=(seed.addresses.ring,) if seed is not None and seed.addresses is not None else (),
            runtime=RuntimeConfig(threads=1, cache_dir=cache_dir / "ov"),
            lost_after=3.0,
            **changes,
        )
        pc = pcs.get(identity.name)
        daemon = await Daemon.build(config, measure_speed=lambda: 10.0, donor_sense=pc.read if pc else None)
        await daemon.start()
        try:
            yield daemon
        finally:
            await daemon.stop()

    async def main() -> None:
        settings = DonorSettings(idle_minutes=IDLE_MINUTES)
        async with AsyncExitStack() as stack:
            first = await stack.enter_async_context(agent(identities["alpha"], None, donor=settings))
            donors = {"alpha": first}
            for name in DONORS[1:]:
                donors[name] = await stack.enter_async_context(agent(identities[name], first, donor=settings))
            head = await stack.enter_async_context(
                agent(identities["head"], first, chat=("127.0.0.1", 0), chat_file=tmp_path / "c.json", offer_mb=0)
            )
            _, signed = edit_fleet_document(
                fleet_dir, lambda doc, now: serving(doc, ModelSource(export_dir=str(folder)), now)
            )
            assert first.addresses is not None
            await push_document(first.addresses.ring, identities["admin"], control.FleetDocumentOffer(signed))
            plan: FleetPlanService = part(head, FleetPlanService)

            def standby_ready() -> bool:
                record = plan.record
                return (
                    record is not None
                    and plan.status().get("ready") is True
                    and any(
                        plan.held_state(n, a.stage) == "standby" for a in record.plan.assignments for n in a.standbys
                    )
                )

            await until(standby_ready, 180, "the ring ready, a standby compiled")
            assert plan.record is not None
            stage = next(a for a in plan.record.plan.assignments if a.standbys)
            holder = next(name for name, d in donors.items() if plan.record.plan.node_of(stage.stage) == _node(d))

            assert head.chats is not None
            endpoint = ChatEndpoint.load(head.chats.endpoint_file)
            request = ChatRequest(token=endpoint.token, messages=(("user", PROMPT),), max_tokens=MAX_TOKENS)
            arrivals: list[float] = []
            ids: list[int] = []
            touched = 0.0
            async for event in ask(endpoint, request):
                if event.event == "token":
                    ids.append(event.id)  # type: ignore[arg-type]
                    arrivals.append(time.monotonic())
                    if len(ids) == 6:  # the owner of the stage's PC is back, mid-answer
                        pcs[holder].touch()
                        touched = time.monotonic()
                elif event.event == "error":
                    raise AssertionError(f"the answer failed: {event}")
            assert touched > 0, "the answer ended before the owner came back"
            assert ids == reference, "the answer changed when its stage moved"
            gaps = [b - a for a, b in itertools.pairwise(arrivals)]
            print(f"stage {stage.stage} left {holder}; the longest pause between two tokens: {max(gaps):.2f} s")

            donor = donors[holder]
            watch: DonorWatch = part(donor, DonorWatch)
            former: RingFormer = part(donor, RingFormer)
            await until(
                lambda: watch.status()["state"] == "away" and not former.holds_stage(), 10, "the donor away, no stage"
            )
            away_after = time.monotonic() - touched
            print(f"{holder} away and holding no stage {away_after:.2f} s after the input")
            assert away_after <= 5.0
            assert plan.record is not None and plan.record.plan.node_of(stage.stage) != _node(donor)
            # its owner gone again for the idle time: it stands by (it does not pull its stage back: probation)
            await until(lambda: watch.status()["state"] == "serving", 3 * 60 * IDLE_MINUTES + 10, "serving again")
            await until(lambda: former.holds_stage(), 120, "standing by again")
            assert [e.id for e in [e async for e in ask(endpoint, request)] if e.event == "token"] == reference  # type: ignore[attr-defined]

    asyncio.run(main())


def _node(daemon: Daemon) -> str:
    return part(daemon, FleetPlanService).me  # type: ignore[no-any-return]
