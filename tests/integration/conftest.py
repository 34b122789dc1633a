"""Fixtures of the ring tests: a fleet and a 3-agent ring over the fp32 3-stage export."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.integration.netlab import NetLab
from tests.integration.ring_lab import AgentProcess, Fleet, start_ring

RING_MAX_SESSIONS = 3


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    return Fleet(tmp_path_factory.mktemp("fleet"))


@pytest.fixture(scope="session")
def ring3(exported: Callable[..., Path], fleet: Fleet, cache_dir: Path) -> Iterator[list[AgentProcess]]:
    """Three agents (one per stage of the fp32 3-stage export), each holding at most 3 sessions."""
    agents = start_ring(
        exported(3, "fp32"), fleet, cache_dir, 3, extra=["--max-sessions", str(RING_MAX_SESSIONS), "--precision", "f32"]
    )
    yield agents
    for agent in agents:
        agent.stop()


@pytest.fixture(scope="module")
def ring3_int4(exported: Callable[..., Path], fleet: Fleet, cache_dir: Path) -> Iterator[list[AgentProcess]]:
    """Three one-thread agents over the int4 3-stage export, every other runtime setting at its default."""
    agents = start_ring(exported(3, "int4"), fleet, cache_dir, 3, prefix="int4-node", extra=["--threads", "1"])
    yield agents
    for agent in agents:
        agent.stop()


@pytest.fixture(scope="session")
def netlab() -> Iterator[NetLab]:
    """Three network namespaces on one bridge (hosts 1-3), torn down at the end; skipped without root."""
    why = NetLab.available()
    if why is not None:
        pytest.skip(why)
    lab = NetLab("shoaltest" + os.environ.get("PYTEST_XDIST_WORKER", ""), 3)
    lab.up()
    try:
        yield lab
    finally:
        lab.down()


@pytest.fixture
def hub_connections_dropped() -> Iterator[None]:
    """After the test, drop the keep-alive connections that huggingface_hub's shared client pools (to the test's
    mirror): the client lives as long as the process, its connections should not outlive the test's mirror."""
    yield
    from huggingface_hub import get_session

    get_session().close()  # shoal's ReopeningClient (shards.hub.http_client): closes the connections, stays usable
