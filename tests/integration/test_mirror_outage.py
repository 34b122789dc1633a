"""An agent whose mirror drops out in the middle of its stage's download, and comes back (issue 41 §1).

A real agent (the ``Daemon``, in this process) with nothing but its identity is told to serve a model published
on a real olah mirror, through a proxy that cuts every connection halfway through the stage's weights and then
refuses connections. The agent must say what failed, keep trying with growing pauses, and, once the mirror is
back, fetch the rest of its stage (resuming the part it has) and serve it, all without a restart. Before the
fix the fetch loop died of huggingface_hub's RuntimeError and the agent showed "downloading 0 %" for good.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.daemon import Daemon
from agent.fleet import NodeIdentity, init_fleet, issue_node
from agent.node.config import AgentConfig
from agent.node.ring_former import RingFormer
from agent.runtime.config import RuntimeConfig
from discovery import control
from discovery.admin import edit_fleet_document, push_document
from discovery.fleet_document import ModelSource, serving
from discovery.plan_service import FleetPlanService
from shards.hub.publish import publish_to_mirror
from shards.manifest import Manifest
from tests.support.flaky_proxy import FlakyProxy
from tests.support.olah_mirror import OlahMirror
from tests.support.until import until

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300), pytest.mark.usefixtures("hub_connections_dropped")]

REPO_ID = "shoal-test/outage"


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OlahMirror]:
    with OlahMirror(tmp_path_factory.mktemp("olah")) as server:
        yield server


def test_an_agent_fetches_its_stage_once_the_mirror_is_back_without_a_restart(
    exported: Callable[..., Path], cache_dir: Path, mirror: OlahMirror, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    export = exported(1, "int4")
    commit = publish_to_mirror(export, mirror.mirrors, REPO_ID)
    weights = max(Manifest.load(export).stages[0].files, key=lambda f: f.size)
    fleet_dir = tmp_path / "fleet"
    init_fleet(fleet_dir, "office")
    pc: NodeIdentity = issue_node(fleet_dir, "pc1")
    admin = issue_node(fleet_dir, "admin")

    async def main(proxy: FlakyProxy) -> None:
        config = AgentConfig(
            export_dir=None,
            stages=(),
            identity_dir=pc.cert.parent,
            runtime=RuntimeConfig(threads=1, cache_dir=cache_dir / "ov"),
            shards_dir=tmp_path / "shards",
        )
        daemon = await Daemon.build(config, measure_speed=lambda: 10.0)
        await daemon.start()
        try:
            ring = next(p for p in daemon.parts if isinstance(p, RingFormer))
            status: Callable[[], dict[str, Any]] = ring.status
            _, signed = edit_fleet_document(
                fleet_dir, lambda doc, now: serving(doc, ModelSource(repo_id=REPO_ID, revision=commit), now)
            )
            assert daemon.addresses is not None
            await push_document(daemon.addresses.ring, admin, control.FleetDocumentOffer(signed))

            # the mirror goes away halfway through the weights: the agent says so and keeps trying
            await until(lambda: status()["tries"] >= 2, 150, "two failed fetches, noted in the status")
            assert "cannot" in (status()["error"] or ""), status()
            assert status()["serving"] is None
            # and a chat waiting for the ring is told why, not only "downloading"
            plan = next(p for p in daemon.parts if isinstance(p, FleetPlanService))
            await until(lambda: "its last try failed" in (plan.status()["waiting"] or ""), 10, "the reason told")
            assert "cannot" in plan.status()["waiting"], plan.status()["waiting"]

            proxy.up()
            took = await until(lambda: status()["serving"] == 0, 120, "the stage served after the mirror returned")
            print(f"serving {took:.1f} s after the mirror came back; {proxy.ranges()}")
            assert status()["error"] is None and status()["tries"] == 0
            # the weights were resumed from the part that arrived before the cut, not fetched again from zero
            assert any(int(r.removeprefix("bytes=").removesuffix("-")) >= 10_000_000 for r in proxy.ranges())
        finally:
            await daemon.stop()

    with FlakyProxy(("127.0.0.1", mirror.port)) as proxy:
        # enough for the manifest and the tokenizer-free stage request to start, and half of the weights
        proxy.cut_after(weights.size // 2)
        monkeypatch.setenv("HF_ENDPOINT", proxy.endpoint)
        asyncio.run(main(proxy))
