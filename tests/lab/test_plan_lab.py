"""A fleet that forms itself on a LAN of network namespaces: real mDNS, a real Hub mirror, a real ``kill -9``.

Host 5 is the office's mirror (olah, in its own virtualenv) serving the export as a Hub repository; hosts 1-4
run agents started with nothing but their identities and ``HF_ENDPOINT``. They find each other over mDNS,
follow one plan, download only their own stages from the mirror, form the ring, and answer a chat headed by
the agent that holds no stage with exactly the greedy tokens of the in-process pipeline. A fifth agent that
joins late stands by; when a stage's agent is killed, the standby takes the stage over and the ring answers
the same again; and with the mirror stopped, a restarted agent comes back from its cache.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agent.head.chat import ChatTokenizer
from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import LocalPipeline
from shards.manifest import Manifest
from tests.integration.local_decode import greedy_tokens
from tests.integration.netlab import NetLab
from tests.support.olah_mirror import OlahMirror
from tests.support.plan_fleet import MAX_TOKENS, PORT, PROMPT, LabFleet

pytestmark = [pytest.mark.processes, pytest.mark.timeout(600)]

HOSTS = 5
MIRROR_HOST = 5
REPO = "office/smollm2-3stage"


@pytest.fixture(scope="module")
def lab() -> Iterator[NetLab]:
    why = NetLab.available()
    if why is not None:
        pytest.skip(why)
    net = NetLab("shoalplan" + os.environ.get("PYTEST_XDIST_WORKER", ""), HOSTS, net="10.213.0")
    net.up()
    try:
        yield net
    finally:
        net.down()


def test_four_agents_with_only_an_identity_form_the_ring_from_a_mirror_and_fail_over(
    lab: NetLab, exported: Callable[..., Path], cache_dir: Path, tmp_path: Path
) -> None:
    folder = exported(3, "int4")
    manifest = Manifest.load(folder)
    tokenizer = ChatTokenizer(folder / "tokenizer")
    pipeline = LocalPipeline(folder, manifest, RuntimeConfig(threads=1, cache_dir=cache_dir / "ov"))
    ids = tokenizer.encode_chat([{"role": "user", "content": PROMPT}])
    reference = greedy_tokens(pipeline, ids, max_tokens=MAX_TOKENS, stop_ids=tokenizer.stop_ids)

    mirror = OlahMirror(tmp_path / "mirror", host=lab.ip(MIRROR_HOST), command_prefix=lab.command(MIRROR_HOST, []))
    fleet = LabFleet(lab, tmp_path, cache_dir, mirror.endpoint)
    published = fleet.shoal(MIRROR_HOST, "publish", folder, REPO, "--mirror", mirror.root / "mirrors")
    assert published.returncode == 0, published.stderr
    commit = published.stdout.split(f"{REPO}@")[1].split()[0]
    mirror.start()
    try:
        began = time.monotonic()
        for host in (1, 2, 3):
            fleet.start(f"pc{host}", host)
        # the user's PC gives no memory to the fleet: it holds no stage, and heads its user's chats
        fleet.start(
            "pc4", 4, "--offer-mb", "0", "--chat", "127.0.0.1:0", "--chat-file", str(tmp_path / "pc4-chat.json")
        )
        names = ["pc1", "pc2", "pc3", "pc4"]
        admin = fleet.identity("admin", 1)
        served = fleet.shoal(
            1, "fleet", "serve", f"{REPO}@{commit}", "--dir", tmp_path / "fleet", "--push", f"{lab.ip(1)}:{PORT}",
            "--identity", admin.cert.parent,
        )  # fmt: skip
        assert served.returncode == 0, served.stderr
        took = fleet.until(lambda: fleet.agreed(names), 180, "one plan on every agent, every stage ready")
        print(f"lab: 4 agents formed the ring from the mirror {time.monotonic() - began:.1f} s after the first start")
        plan = fleet.plan("pc4")
        holders = {s["name"]: s["stage"] for s in plan["stages"]}
        assert sorted(holders) == ["pc1", "pc2", "pc3"] and "pc4" not in holders, plan
        # each agent downloaded only its own stage; the head only the tokenizer and the draft model
        for name, stage in holders.items():
            own = {f.path for f in manifest.stages[stage].files} | {"manifest.json"}
            assert fleet.fetched(name) == own, (name, fleet.fetched(name))
        draft = [f.path for f in manifest.draft.graph.files] if manifest.draft is not None else []
        assert fleet.fetched("pc4") == {f.path for f in manifest.tokenizer_files} | {"manifest.json", *draft}
        assert fleet.ask("pc4") == reference
        del took

        # a PC that joins late stands by, its stage downloaded and compiled; a chat across the join is the same
        fleet.start("pc5", MIRROR_HOST)
        names.append("pc5")
        assert fleet.ask("pc4") == reference
        fleet.until(
            lambda: any(
                b["name"] == "pc5" and b["state"] == "standby"
                for s in fleet.plan("pc1")["stages"]
                for b in s["standbys"]
            ),
            120,
            "pc5 standing by with its stage compiled",
        )
        stage = next(s for s in fleet.plan("pc1")["stages"] if any(b["name"] == "pc5" for b in s["standbys"]))
        # kill -9 of that stage's agent: within 10 s the standby serves the stage, and the ring answers the same
        victim = fleet.running[stage["name"]]
        victim.process.kill()
        victim.process.wait(5)
        names.remove(stage["name"])
        took = fleet.until(
            lambda: fleet.agreed(names) and fleet.plan("pc4")["stages"][stage["stage"]]["name"] == "pc5",
            10,
            "the standby serving the stage of the killed agent",
        )
        print(f"lab: stage {stage['stage']} on its standby {took:.1f} s after kill -9 of {stage['name']}")
        assert fleet.ask("pc4") == reference

        # with the mirror stopped, an agent restarts from its cache
        mirror.stop()
        restarted = next(n for n in names if n not in ("pc4", "pc5"))
        fleet.running[restarted].stop()
        fleet.start(restarted, fleet.hosts[restarted])
        fleet.until(lambda: fleet.agreed(names), 60, "the ring again, with the mirror down")
        assert fleet.ask("pc4") == reference
    finally:
        fleet.stop_all()
        mirror.stop()
