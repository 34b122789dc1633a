"""A stage-only agent can be scraped (issue 40 §6): ``--metrics`` gives any agent ``GET /metrics`` of its own,
plain HTTP on loopback, and HTTPS that only a fleet certificate opens elsewhere."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pytest

from agent.chat_client.protocol import ChatRequest
from agent.daemon import Daemon
from agent.errors import ConfigError
from agent.fleet import NodeIdentity, init_fleet, issue_node
from agent.metrics.endpoint import MetricsEndpoint
from agent.metrics.exposition import CONTENT_TYPE, render_metrics
from agent.node.config import AgentConfig
from agent.transport.network import TlsNetwork
from agent.transport.tls import client_context, server_context
from tests.middle.toy_ring import ToyRing, run, stage_address
from tests.support.memory_network import MemoryNetwork
from tests.support.metric_samples import metric_samples
from tests.support.toy_model import ToyStage


def test_a_stage_only_agent_serves_its_metrics_on_loopback(tmp_path: Path) -> None:
    async def main() -> None:
        ring = await ToyRing.start()
        last = len(ring.manifest.stages) - 1
        await ring.servers[last].stop()  # its place goes to an agent with a metrics endpoint and no chat
        config = ring.config(last, metrics=("127.0.0.1", 0))
        network = ring.network.host(stage_address(last)[0])
        stage = Daemon(config, "toy-last", ring.manifest, [ToyStage(ring.manifest.stages[last], ring.weights)], network)
        addresses = await stage.start()
        chat = await ring.chat_agent(tmp_path)
        try:
            assert addresses.metrics is not None and addresses.http is None and stage.chats is None
            url = f"http://{addresses.metrics[0]}:{addresses.metrics[1]}"
            assert chat.chats is not None
            request = ChatRequest(token=chat.chats.token, messages=(("user", "where is the toy"),), max_tokens=12)
            events = [event async for event in chat.chats.answer(request)]
            assert events[-1].event == "done"
            async with httpx.AsyncClient() as http:
                scraped = await http.get(f"{url}/metrics")  # no token: loopback is this PC's
                assert scraped.status_code == 200 and scraped.headers["content-type"].startswith("text/plain")
                assert (await http.get(f"{url}/v1/models")).status_code == 404
                again = metric_samples((await http.get(f"{url}/metrics")).text)
            samples = metric_samples(scraped.text)
            assert samples["shoal_stage_steps_total"] == stage.server.steps_served == events[-1].stats["steps"]
            assert samples["shoal_sessions_open"] == 1  # the chat is kept for its next turn, parked here
            assert samples["shoal_sessions_parked"] == 1
            assert again["shoal_chat_errors_total{code=not_found}"] == 1
            assert stage.server.status()["metrics"]["scrapes"] == 2
        finally:
            await chat.stop()
            await stage.stop()
            await ring.stop()

    run(main)


def test_off_loopback_the_metrics_need_the_fleets_tls(tmp_path: Path) -> None:
    """The daemon refuses a fleet-wide address without TLS; with it, only a certificate of the fleet scrapes."""
    config = AgentConfig(export_dir=None, stages=(), identity_dir=tmp_path, metrics=("10.9.0.3", 9464))
    with pytest.raises(ConfigError, match="needs the fleet's TLS"):
        Daemon(config, "toy", None, [], MemoryNetwork().host("10.9.0.3"))

    init_fleet(tmp_path / "fleet", "ours")
    init_fleet(tmp_path / "other", "theirs")
    agent = issue_node(tmp_path / "fleet", "alpha")
    admin = issue_node(tmp_path / "fleet", "admin")
    stranger = issue_node(tmp_path / "other", "mallory")

    async def main() -> None:
        endpoint = MetricsEndpoint(
            render_metrics(lambda: {"node": "alpha", "steps_served": 3}),
            CONTENT_TYPE,
            ("127.0.0.1", 0),
            "alpha",
            server_context(agent),
        )
        host, port = await endpoint.start()
        url = f"https://{host}:{port}/metrics"
        try:
            async with httpx.AsyncClient(verify=client_context(admin)) as http:
                scraped = await http.get(url)
            assert scraped.status_code == 200
            assert metric_samples(scraped.text)["shoal_stage_steps_total"] == 3
            for refused in (client_context(stranger), _without_certificate(agent)):
                async with httpx.AsyncClient(verify=refused) as http:
                    with pytest.raises((httpx.HTTPError, ssl.SSLError)):
                        await http.get(url)
            assert endpoint.scrapes == 1
        finally:
            await endpoint.stop()

    run(main)


def test_a_revoked_certificate_of_the_fleet_no_longer_scrapes(tmp_path: Path) -> None:
    """The endpoint asks the agent's network whether a scraper's certificate is revoked: once the fleet revokes the
    admin's, its scrapes are dropped (and counted) though the certificate still chains to the fleet's CA."""
    init_fleet(tmp_path / "fleet", "ours")
    agent = issue_node(tmp_path / "fleet", "alpha")
    admin, other = issue_node(tmp_path / "fleet", "admin"), issue_node(tmp_path / "fleet", "prometheus")
    network = TlsNetwork.of(agent)

    async def main() -> None:
        render = render_metrics(lambda: {"node": "alpha", "steps_served": 3})
        context = server_context(agent)
        endpoint = MetricsEndpoint(render, CONTENT_TYPE, ("127.0.0.1", 0), "alpha", context, network.revoked)
        host, port = await endpoint.start()
        url = f"https://{host}:{port}/metrics"
        try:
            async with httpx.AsyncClient(verify=client_context(admin)) as http:
                assert (await http.get(url)).status_code == 200
            network.refuse(frozenset({admin.fingerprint}))
            async with httpx.AsyncClient(verify=client_context(admin)) as http:
                with pytest.raises(httpx.HTTPError):
                    await http.get(url)
            async with httpx.AsyncClient(verify=client_context(other)) as http:
                assert (await http.get(url)).status_code == 200
            assert endpoint.scrapes == 2 and endpoint.status()["refused"] == {"revoked": 1}
        finally:
            await endpoint.stop()

    run(main)


def _without_certificate(fleet_member: NodeIdentity) -> ssl.SSLContext:
    """A client that trusts the fleet's CA but presents no certificate of its own."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.load_verify_locations(str(fleet_member.ca))
    return context
