"""A fleet that forms itself on a LAN of network namespaces: real mDNS, a real Hub mirror, a real ``kill -9``.

Host 5 is the office's mirror (olah, in its own virtualenv) serving the export as a Hub repository; hosts 1-4
run agents started with nothing but their identities and ``HF_ENDPOINT``. They find each other over mDNS,
follow one plan, download only their own stages from the mirror, form the ring, and answer a chat headed by
the agent that holds no stage with exactly the greedy tokens of the in-process pipeline. A fifth agent that
joins late stands by; when a stage's agent is killed, the standby takes the stage over and the ring answers
the same again; and with the mirror stopped, a restarted agent comes back from its cache.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.fleet import NodeIdentity, init_fleet, issue_node
from agent.head.chat import ChatTokenizer
from agent.node.launcher import LocalAgent, launch_agent
from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import LocalPipeline
from shards.manifest import Manifest
from tests.integration.local_decode import greedy_tokens
from tests.integration.netlab import NetLab
from tests.support.olah_mirror import OlahMirror

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.timeout(600)]

HOSTS = 5
MIRROR_HOST = 5
PORT = 7100
REPO = "office/smollm2-3stage"
PROMPT = "What is the capital of France?"
MAX_TOKENS = 12
ASK = """
import asyncio, json, sys
from pathlib import Path
from agent.chat.client import ask
from agent.chat.endpoint import ChatEndpoint
from agent.chat.protocol import ChatRequest
endpoint = ChatEndpoint.load(Path(sys.argv[1]))
request = ChatRequest(token=endpoint.token, messages=(("user", sys.argv[2]),), max_tokens=int(sys.argv[3]))
async def main():
    return [json.loads(e.to_line()) async for e in ask(endpoint, request)]
print(json.dumps(asyncio.run(main())))
"""


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


class Fleet:
    """The lab's agents by name; the test process reads their logs and asks their status from inside the lab."""

    def __init__(self, lab: NetLab, root: Path, cache: Path, endpoint: str) -> None:
        self.lab, self.root, self.cache, self.endpoint = lab, root, cache, endpoint
        init_fleet(root / "fleet", "lab")
        self.identities: dict[str, NodeIdentity] = {}
        self.running: dict[str, LocalAgent] = {}
        self.hosts: dict[str, int] = {}

    def identity(self, name: str, host: int) -> NodeIdentity:
        if name not in self.identities:
            self.identities[name] = issue_node(self.root / "fleet", name, ips=[self.lab.ip(host)])
        return self.identities[name]

    def shards(self, name: str) -> Path:
        return self.root / "shards" / name

    def start(self, name: str, host: int, *args: str) -> LocalAgent:
        identity = self.identity(name, host)
        agent = launch_agent(
            None,
            None,
            identity.cert.parent,
            self.cache,
            listen=f"{self.lab.ip(host)}:{PORT}",
            extra_args=["--lost-after", "4", "--threads", "1", "--shards-dir", str(self.shards(name)), *args],
            wrapper=self.lab.command(host, []),
            env={"HF_ENDPOINT": self.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1"},
            log_path=self.root / f"{name}.log",
            timeout=60,
        )
        self.running[name], self.hosts[name] = agent, host
        return agent

    def shoal(self, host: int, *args: str | Path) -> subprocess.CompletedProcess[str]:
        command = self.lab.command(host, [sys.executable, "-m", "agent.cli.main", *map(str, args)])
        return subprocess.run(command, capture_output=True, text=True, timeout=60)

    def plan(self, name: str) -> dict[str, Any]:
        host = self.hosts[name]
        done = self.shoal(
            host, "status", f"{self.lab.ip(host)}:{PORT}", "--identity", self.identities[name].cert.parent
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["plan"]  # type: ignore[no-any-return]

    def agreed(self, names: list[str]) -> str | None:
        """The plan hash every agent of ``names`` follows, once the last one's ring is ready (each status is a
        process started inside the lab: the others are asked only then)."""
        if not self.plan(names[-1]).get("ready"):
            return None
        plans = [self.plan(n) for n in names]
        hashes = {p.get("hash") for p in plans}
        return plans[0]["hash"] if len(hashes) == 1 and all(p.get("ready") for p in plans) else None

    def ask(self, name: str) -> list[int]:
        chat_file = self.root / f"{name}-chat.json"
        command = self.lab.command(
            self.hosts[name], [sys.executable, "-c", ASK, str(chat_file), PROMPT, str(MAX_TOKENS)]
        )
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        events = json.loads(done.stdout)
        assert events[-1]["event"] == "done", events[-1]
        return [e["id"] for e in events if e["event"] == "token"]

    def until(self, check: Callable[[], object], timeout: float, what: str) -> float:
        start = time.monotonic()
        while not check():
            if time.monotonic() - start > timeout:
                logs = "\n".join(f"--- {n}\n" + "\n".join(list(a.log)[-20:]) for n, a in self.running.items())
                raise AssertionError(f"not within {timeout} s: {what}\n{logs}")
            time.sleep(0.25)
        return time.monotonic() - start

    def fetched(self, name: str) -> set[str]:
        """The files of the export in the agent's shard cache (what it downloaded)."""
        found = set()
        for snapshot in self.shards(name).glob("models--*/snapshots/*"):
            found |= {p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()}
        return found

    def stop_all(self) -> None:
        for agent in self.running.values():
            agent.stop(timeout=5)


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
    fleet = Fleet(lab, tmp_path, cache_dir, mirror.endpoint)
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
