"""The soak with a host cut off the network (issue 46 §3): ``python -m bench soak --lab``'s short version.

The soak's fleet (three stages of SmolLM2 int4, a warm standby, a spare, a head with the chat endpoint and the
OpenAI API) runs with every agent in its own host of a lab of network namespaces, and its clients inside the
head's host. While it answers 30 requests, a stage agent's host is cut off for 3-8 seconds (its bridge port
down: its peers get no FIN and no RST, as when a cable is pulled) and plugged back. Every request must end
whole or with a clear error, none hang, every greedy answer be the undisturbed run's, and the fleet follow one
plan hash afterwards with no session left on any agent.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from bench.soak_bench import markdown
from tests.integration.netlab import NetLab
from tests.integration.test_soak_short import SETTINGS as SHORT
from tests.support.soak_lab import soak_in_lab

pytestmark = [pytest.mark.processes, pytest.mark.timeout(400)]

SETTINGS = replace(SHORT, requests=30, faults=1, fault_kinds=("cut",), max_hold=8.0)
"""The loopback short soak's, with one cut instead of its kill and coordinator restart."""


def test_a_soak_with_a_stage_host_cut_off_the_network_ends_every_request_and_returns_to_one_plan(
    exported: Callable[..., Path], cache_dir: Path, tmp_path: Path
) -> None:
    if (why := NetLab.available()) is not None:
        pytest.skip(why)
    prefix = "shoalsoak" + os.environ.get("PYTEST_XDIST_WORKER", "")
    export = exported(3, "int4")
    began = time.monotonic()
    report = soak_in_lab(SETTINGS, export, cache_dir, tmp_path, prefix=prefix)
    print(f"lab soak: {time.monotonic() - began:.1f} s from the lab's start to its end")
    print(markdown(report))
    print(json.dumps({k: report[k] for k in ("errors", "mismatches")}, indent=1))
    left = subprocess.run(["ip", "netns", "list"], capture_output=True, encoding="utf-8", check=True).stdout
    assert f"{prefix}-" not in left, f"the lab was left up: {left}"
    counts = report["outcomes"]
    assert counts["hung"] == 0 and counts["unclear"] == 0, report["errors"]
    assert sum(counts.values()) == SETTINGS.requests
    assert counts["whole"] >= SETTINGS.requests // 2, counts  # the fleet served, not only refused
    assert report["greedy_checked"] > 0 and report["greedy_mismatched"] == [], report["mismatches"]
    (cut,) = report["chaos"]["faults"]
    assert cut["kind"] == "cut" and cut["target"] and not cut["note"].startswith("not injected"), cut
    assert 3.0 <= cut["ended"] - cut["injected"] <= 8.0 + 2.0, cut  # held 3-8 s (and the ip calls)
    assert report["chaos"]["answers_affected"] > 0, "the cut came while answers were in flight"
    assert cut["one_plan_s"] is not None, report["chaos"]
    # where a standby stood by, nothing is lost: the plan the cut host made alone, without a quorum, never wins
    # over the fleet's when it comes back (discovery.plan_service; before, 14 of 51 affected answers were lost)
    assert report["chaos"]["answers_lost"] == 0, report["chaos"]
    assert sum(report["sessions_left"].values()) == 0, report["sessions_left"]
