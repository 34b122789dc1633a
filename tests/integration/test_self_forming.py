"""A fleet that forms its ring by itself: four real agents in one process, over mutual TLS on loopback.

The agents start with nothing but their identities and one seed; the admin names the model (an export
folder every agent can read, as in the local demo) and pins a stage. Everything else is the agents' own
doing: the coordinator plans, the others follow its plan (the same hash everywhere), each fetches, checks and
compiles its stage, links to the next stage of the plan, and the agent holding no stage heads a chat through
the plan's ring, answering with exactly the greedy tokens of the in-process pipeline of the same export.
The lab (``tests/lab/test_plan_lab.py``) adds mDNS, a Hub mirror and ``kill -9`` between network namespaces.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from agent.chat_client.client import ask
from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatEvent, ChatRequest
from agent.daemon import Daemon
from agent.errors import FleetError
from agent.fleet import NodeIdentity, init_fleet, issue_node
from agent.head.chat import ChatTokenizer
from agent.node.config import AgentConfig
from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import LocalPipeline
from discovery import control
from discovery.admin import edit_fleet_document, push_document
from discovery.fleet_document import ModelSource, Pin, serving, with_pin
from discovery.placement import Plan
from discovery.plan_service import FleetPlanService
from shards.manifest import Manifest
from tests.integration.local_decode import greedy_tokens
from tests.support.until import until

pytestmark = pytest.mark.timeout(300)

PROMPT = "What is the capital of France?"
MAX_TOKENS = 12
SPEED = 10.0
NAMES = ("alpha", "beta", "gamma", "delta", "epsilon")


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fleet")
    init_fleet(folder, "office")
    return folder


@pytest.fixture(scope="module")
def identities(fleet_dir: Path) -> dict[str, NodeIdentity]:
    return {name: issue_node(fleet_dir, name) for name in (*NAMES, "admin")}


@pytest.fixture(scope="module")
def reference(exported: Callable[..., Path], cache_dir: Path) -> list[int]:
    folder = exported(3, "int4")
    tokenizer = ChatTokenizer(folder / "tokenizer")
    pipeline = LocalPipeline(folder, Manifest.load(folder), RuntimeConfig(threads=1, cache_dir=cache_dir / "ov"))
    ids = tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    return greedy_tokens(pipeline, ids, max_tokens=MAX_TOKENS, stop_ids=tokenizer.stop_ids)


@asynccontextmanager
async def agent(identity: NodeIdentity, cache_dir: Path, seed: Daemon | None, **changes: Any) -> AsyncIterator[Daemon]:
    peers = (seed.addresses.ring,) if seed is not None and seed.addresses is not None else ()
    config = AgentConfig(
        export_dir=None,
        stages=(),
        identity_dir=identity.cert.parent,
        peers=peers,
        runtime=RuntimeConfig(threads=1, cache_dir=cache_dir / "ov"),
        lost_after=3.0,
        **changes,
    )
    daemon = await Daemon.build(config, measure_speed=lambda: SPEED)  # five agents share two cores here
    await daemon.start()
    try:
        yield daemon
    finally:
        await daemon.stop()


def plan_of(daemon: Daemon) -> FleetPlanService:
    return next(p for p in daemon.parts if isinstance(p, FleetPlanService))


def agreed(daemons: list[Daemon]) -> str | None:
    """The plan hash every agent follows, if they all follow one and its ring is ready."""
    hashes = {plan_of(d).status().get("hash") for d in daemons}
    ready = all(plan_of(d).status().get("ready") for d in daemons)
    return next(iter(hashes)) if len(hashes) == 1 and ready and None not in hashes else None


async def chat(daemon: Daemon) -> list[ChatEvent]:
    assert daemon.chats is not None
    endpoint = ChatEndpoint.load(daemon.chats.endpoint_file)
    request = ChatRequest(token=endpoint.token, messages=(("user", PROMPT),), max_tokens=MAX_TOKENS)
    return [event async for event in ask(endpoint, request)]


def tokens(events: list[ChatEvent]) -> list[int]:
    assert events[-1].event == "done", events[-1]
    return [e.id for e in events if e.event == "token"]  # type: ignore[misc]


async def push(fleet_dir: Path, admin: NodeIdentity, target: Daemon, change: Any) -> int:
    """The next fleet document, pushed to ``target``; the one before is kept as ``older.json``."""
    current = fleet_dir / "fleet-document.json"
    if current.exists():
        (fleet_dir / "older.json").write_bytes(current.read_bytes())
    document, signed = edit_fleet_document(fleet_dir, change)
    assert target.addresses is not None
    await push_document(target.addresses.ring, admin, control.FleetDocumentOffer(signed))
    return document.version


def test_agents_with_only_an_identity_form_the_plans_ring_follow_pins_and_fail_over(
    exported: Callable[..., Path],
    cache_dir: Path,
    fleet_dir: Path,
    identities: dict[str, NodeIdentity],
    reference: list[int],
    tmp_path: Path,
) -> None:
    folder = exported(3, "int4")
    admin = identities["admin"]

    async def main() -> None:
        async with AsyncExitStack() as stack:
            first = await stack.enter_async_context(agent(identities["alpha"], cache_dir, None))
            others = [await stack.enter_async_context(agent(identities[n], cache_dir, first)) for n in NAMES[1:3]]
            # the user's PC: it gives no memory to the fleet, so it never holds a stage, and heads chats
            head = await stack.enter_async_context(
                agent(
                    identities["delta"],
                    cache_dir,
                    first,
                    chat=("127.0.0.1", 0),
                    chat_file=tmp_path / "c.json",
                    offer_mb=0,
                )
            )
            daemons = [first, *others, head]
            # before the admin names a model, a chat is refused at once, with the reason
            waiting = await chat(head)
            assert waiting[-1].event == "error" and "serves no model" in (waiting[-1].text or ""), waiting

            version = await push(
                fleet_dir, admin, first, lambda doc, now: serving(doc, ModelSource(export_dir=str(folder)), now)
            )
            took = await until(lambda: agreed(daemons) is not None, 120, "one plan, every stage ready")
            hash_one = agreed(daemons)
            statuses = [plan_of(d).status() for d in daemons]
            assert {s["planned_for"] for s in statuses} == {version}
            placed = [s["name"] for s in statuses[0]["stages"]]
            assert sorted(placed) == ["alpha", "beta", "gamma"], placed  # delta holds no stage
            print(f"ring formed {took:.1f} s after the fleet document; plan {hash_one}")
            assert tokens(await chat(head)) == reference

            # a PC that joins during a chat becomes a standby (its stage fetched and compiled), and the chat
            # is not disturbed
            answer = asyncio.create_task(chat(head))
            late = await stack.enter_async_context(agent(identities["epsilon"], cache_dir, first))
            assert tokens(await answer) == reference
            daemons.append(late)
            await until(
                lambda: (
                    agreed(daemons) is not None and plan_of(late).held_state(_node(late), _standing(late)) == "standby"
                ),
                120,
                "the late PC standing by, its stage compiled",
            )
            in_force = plan_of(first).plan
            assert in_force is not None and [a.node for a in in_force.assignments] == [
                _node(d) for d in sorted(daemons[:3], key=lambda d: placed.index(d.node))
            ], "a PC that joins only stands by: no stage moved"

            # a required pin moves a stage to its node; every agent follows the new plan
            await push(fleet_dir, admin, first, lambda doc, now: with_pin(doc, Pin("epsilon", 1, True), now))
            await until(
                lambda: agreed(daemons) is not None and _plan(first).node_of(1) == _node(late),
                120,
                "stage 1 on the pinned PC, on every agent",
            )
            assert tokens(await chat(head)) == reference

            # a preferred pin on a PC too small falls back to placement, with the reason
            await push(fleet_dir, admin, first, lambda doc, now: with_pin(doc, Pin("delta", 0, False), now))
            await until(lambda: len(_plan(head).pins) == 2, 30, "the plan of the second pin")
            outcome = next(o for o in _plan(head).pins if o.pin.node == "delta")
            assert not outcome.honoured and "offers 0 MiB" in outcome.reason and "automatically" in outcome.reason
            assert _plan(head).node_of(0) not in (None, _node(head))

            # a document signed by another fleet's CA, or an older one, is refused
            forged_dir = tmp_path / "forged"
            init_fleet(forged_dir, "office")
            _, forged = edit_fleet_document(forged_dir, lambda doc, now: serving(doc, None, now))
            with pytest.raises(FleetError, match="refused the fleet document"):
                await push_document(_ring(first), admin, control.FleetDocumentOffer(forged))
            older = (fleet_dir / "older.json").read_bytes()
            assert "not newer" in await push_document(_ring(first), admin, control.FleetDocumentOffer(older))

            # a stage's agent leaves: its standby takes the stage over, and the ring answers the same
            stage = next(a.stage for a in _plan(first).assignments if a.standbys)
            leaving = next(d for d in daemons if _node(d) == _plan(first).node_of(stage))
            standby = _plan(first).standbys_of(stage)[0]
            # a chat in flight as the agent leaves is replayed through the new plan's ring, and ends the same
            answer = asyncio.create_task(chat(head))
            await until(lambda: head.chats is not None and head.chats.status()["running"] > 0, 30, "a chat running")
            await leaving.stop()
            daemons.remove(leaving)
            took = await until(
                lambda: (
                    agreed(daemons) is not None
                    and _plan(first if leaving is not first else head).node_of(stage) == standby
                ),
                10,
                "the standby serving the stage",
            )
            print(f"stage {stage} failed over to its standby in {took:.1f} s")
            assert tokens(await answer) == reference
            assert tokens(await chat(head)) == reference

    asyncio.run(main())


def _plan(daemon: Daemon) -> Plan:
    found = plan_of(daemon).plan
    assert found is not None
    return found


def _node(daemon: Daemon) -> str:
    return plan_of(daemon).me


def _ring(daemon: Daemon) -> tuple[str, int]:
    assert daemon.addresses is not None
    return daemon.addresses.ring


def _standing(daemon: Daemon) -> int:
    plan = plan_of(daemon).plan
    if plan is None:
        return -1
    return next((a.stage for a in plan.assignments if _node(daemon) in a.standbys), -1)
