"""Fleet membership between real agents on a LAN of network namespaces: real mDNS, real mutual TLS, real kills.

Every agent runs inside a lab host (``ip netns exec``); the test process reads their logs (one line per
membership event) and asks their status from inside the lab, never opening a socket to a lab address itself.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from agent.fleet import NodeIdentity, init_fleet, issue_node
from agent.fleet.enrollment import JoinToken, create_token
from agent.node.launcher import LocalAgent, launch_agent
from tests.integration.netlab import NetLab

pytestmark = [pytest.mark.processes, pytest.mark.timeout(300)]

HOSTS = 5
PORT = 7100
LOST_AFTER = 4.0
EVENT = re.compile(r"member (\w+) \(([\w.-]+)\): (\w+) -> (\w+)")


@pytest.fixture(scope="module")
def lab() -> Iterator[NetLab]:
    why = NetLab.available()
    if why is not None:
        pytest.skip(why)
    net = NetLab("shoalfleet" + os.environ.get("PYTEST_XDIST_WORKER", ""), HOSTS, net="10.212.0")
    net.up()
    try:
        yield net
    finally:
        net.down()


@pytest.fixture(scope="module")
def identities(lab: NetLab, tmp_path_factory: pytest.TempPathFactory) -> dict[str, NodeIdentity]:
    root = tmp_path_factory.mktemp("lab-fleet")
    init_fleet(root / "fleet", "lab")
    init_fleet(root / "other", "other")
    found = {f"pc{i}": issue_node(root / "fleet", f"pc{i}", ips=[lab.ip(i)]) for i in range(1, HOSTS + 1)}
    found["stranger"] = issue_node(root / "other", "stranger", ips=[lab.ip(HOSTS)])
    found["expired"] = _expired_copy(found[f"pc{HOSTS}"], root / "fleet", root / "expired")
    return found


def _expired_copy(identity: NodeIdentity, fleet: Path, out: Path) -> NodeIdentity:
    """``identity`` with its certificate re-signed by the fleet CA to have expired yesterday."""
    ca_key = serialization.load_pem_private_key((fleet / "ca.key").read_bytes(), password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    cert = identity.certificate()
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(cert.subject)
        .issuer_name(cert.issuer)
        .public_key(cert.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=30))
        .not_valid_after(now - dt.timedelta(days=1))
    )
    for extension in cert.extensions:
        builder = builder.add_extension(extension.value, extension.critical)
    out.mkdir()
    shutil.copy(identity.key, out / "key.pem")
    shutil.copy(identity.ca, out / "ca.pem")
    expired = builder.sign(ca_key, hashes.SHA256())
    (out / "cert.pem").write_bytes(expired.public_bytes(serialization.Encoding.PEM))
    return NodeIdentity.load(out)


class Agents:
    """The lab's agents by host; all stopped at the end of each test."""

    def __init__(self, lab: NetLab, identities: dict[str, NodeIdentity], cache: Path) -> None:
        self.lab, self.identities, self.cache = lab, identities, cache
        self.running: dict[int, LocalAgent] = {}
        self.started: dict[int, float] = {}

    def start(self, host: int, *args: str, identity: str | None = None) -> LocalAgent:
        name = identity or f"pc{host}"
        self.started[host] = time.monotonic()
        agent = launch_agent(
            None,
            None,
            self.identities[name].cert.parent,
            self.cache,
            listen=f"{self.lab.ip(host)}:{PORT}",
            extra_args=["--lost-after", str(LOST_AFTER), *args],
            wrapper=self.lab.command(host, []),
            timeout=60,
        )
        self.running[host] = agent
        return agent

    def states(self, host: int) -> dict[str, str]:
        """The last state host's agent logged for each peer (one log line per membership event)."""
        found = {}
        for line in list(self.running[host].log):
            match = EVENT.search(line)
            if match:
                found[match.group(2)] = match.group(4)
        return found

    def until(self, check: object, timeout: float, what: str) -> float:
        start = time.monotonic()
        while not check():  # type: ignore[operator]
            if time.monotonic() - start > timeout:
                logs = "\n".join(f"--- pc{h}\n" + "\n".join(list(a.log)[-15:]) for h, a in self.running.items())
                raise AssertionError(f"not within {timeout} s: {what}\n{logs}")
            time.sleep(0.05)
        return time.monotonic() - start

    def shoal(self, host: int, *args: str | Path) -> subprocess.CompletedProcess[str]:
        """``shoal ARGS`` run inside ``host``."""
        command = self.lab.command(host, [sys.executable, "-m", "agent.cli.main", *map(str, args)])
        return subprocess.run(command, capture_output=True, encoding="utf-8", errors="replace", timeout=60)

    def status(self, host: int) -> dict[str, object]:
        identity = self.identities[f"pc{host}"].cert.parent
        done = self.shoal(host, "status", f"{self.lab.ip(host)}:{PORT}", "--identity", identity, "--json")
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    def doctor(self, host: int, identity: str) -> subprocess.CompletedProcess[str]:
        return self.shoal(host, "doctor", "--identity", self.identities[identity].cert.parent, "--probe-seconds", "2")

    def stop_all(self) -> None:
        for agent in self.running.values():
            if agent.process.poll() is None:
                agent.process.kill()
                agent.process.wait(5)
        self.running.clear()


@pytest.fixture
def agents(lab: NetLab, identities: dict[str, NodeIdentity], tmp_path: Path) -> Iterator[Agents]:
    found = Agents(lab, identities, tmp_path / "cache")
    try:
        yield found
    finally:
        found.stop_all()
        for host in range(1, HOSTS + 1):
            lab.restore(host)
            _multicast(lab, host, on=True)


def _multicast(lab: NetLab, host: int, on: bool) -> None:
    """Let (or stop) the bridge flood multicast to host's port: off, mDNS from the others never reaches it."""
    port = ["ip", "-n", f"{lab.prefix}-br", "link", "set", "dev", f"h{host}", "type", "bridge_slave"]
    subprocess.run(
        [*port, "mcast_flood", "on" if on else "off"],
        check=True,
        capture_output=True,
    )


def everyone_lists_everyone(agents: Agents, hosts: list[int]) -> bool:
    names = {f"pc{h}" for h in hosts}
    return all({p for p, s in agents.states(h).items() if s == "member"} >= names - {f"pc{h}"} for h in hosts)


def test_four_agents_with_only_their_identity_find_each_other_over_mdns(agents: Agents) -> None:
    began = time.monotonic()
    for host in (1, 2, 3, 4):
        agents.start(host)
    took = agents.until(lambda: everyone_lists_everyone(agents, [1, 2, 3, 4]), 15, "every agent lists every other")
    print(
        f"lab: 4 agents over mDNS: every agent lists every other {took:.2f} s after the last was ready, "
        f"{time.monotonic() - began:.2f} s after the first was launched"
    )
    status = agents.status(1)["members"]
    assert isinstance(status, dict)
    listed = {m["name"]: m for m in status["members"]}
    assert set(listed) == {"pc2", "pc3", "pc4"}
    for member in listed.values():
        assert member["state"] == "member"
        assert "mdns" in member["found"] or "inbound" in member["found"]
        assert member["address"].startswith("10.212.0.")

    def found_over_mdns() -> bool:  # the peers that dialled pc1 first may be listed before its browser hears them
        members = agents.status(1)["members"]["members"]  # type: ignore[index]
        return any("mdns" in m["found"] for m in members)

    agents.until(found_over_mdns, 10, "pc1 finding a peer over mDNS")


def test_with_multicast_blocked_one_seed_is_enough_through_gossip(agents: Agents) -> None:
    for host in (1, 2, 3, 4):
        _multicast(agents.lab, host, on=False)
    agents.start(1)
    seed = f"{agents.lab.ip(1)}:{PORT}"
    for host in (2, 3, 4):
        agents.start(host, "--peer", seed)
    took = agents.until(lambda: everyone_lists_everyone(agents, [1, 2, 3, 4]), 15, "every agent lists every other")
    print(f"lab: 4 agents, multicast blocked, one seed: every agent lists every other {took:.2f} s after the last")
    listed = {m["name"]: m for m in agents.status(3)["members"]["members"]}  # type: ignore[index]
    assert "gossip" in listed["pc2"]["found"] or "inbound" in listed["pc2"]["found"]
    assert not any("mdns" in m["found"] for m in listed.values())


def test_a_killed_agent_is_lost_a_stopped_one_gone_and_a_cut_host_comes_back(agents: Agents) -> None:
    for host in (1, 2, 3, 4):
        agents.start(host)
    agents.until(lambda: everyone_lists_everyone(agents, [1, 2, 3, 4]), 15, "every agent lists every other")

    agents.running[4].process.send_signal(signal.SIGKILL)
    killed = time.monotonic()
    agents.until(lambda: all(agents.states(h).get("pc4") == "lost" for h in (1, 2, 3)), LOST_AFTER + 3, "pc4 lost")
    print(f"lab: a killed agent was lost everywhere {time.monotonic() - killed:.2f} s after kill -9")

    agents.running[3].process.send_signal(signal.SIGTERM)
    stopped = time.monotonic()
    agents.until(lambda: all(agents.states(h).get("pc3") == "gone" for h in (1, 2)), 3, "pc3 gone")
    assert time.monotonic() - stopped < 2.0
    assert agents.running[3].process.wait(10) == 0

    agents.lab.cut(2)
    cut = time.monotonic()
    agents.until(lambda: agents.states(1).get("pc2") == "lost", LOST_AFTER + 4, "pc2 lost after the cut")
    print(f"lab: a cut host was lost {time.monotonic() - cut:.2f} s after the cut")
    agents.lab.restore(2)
    back = agents.until(lambda: agents.states(1).get("pc2") == "member", 20, "pc2 a member again after restore")
    assert agents.states(2).get("pc1") == "member"
    assert agents.running[2].process.poll() is None  # no restart
    print(f"lab: a restored host was a member again {back:.2f} s after restore")


def test_a_foreign_fleet_is_listed_apart_and_a_copied_identity_is_refused(agents: Agents) -> None:
    agents.start(1)
    agents.start(5, identity="stranger")
    agents.until(lambda: agents.states(1).get("stranger") == "foreign", 10, "the stranger listed as foreign")
    agents.until(lambda: agents.states(5).get("pc1") == "foreign", 10, "the stranger lists pc1 as foreign")
    time.sleep(1.0)  # neither dials the other: never a member, and no refused handshake in either log
    assert agents.states(1) == {"stranger": "foreign"} and agents.states(5) == {"pc1": "foreign"}
    assert "TLS handshake failed" not in agents.running[1].log_text()

    time.sleep(1.1)  # the copy starts later: it is the one to yield
    copy = agents.start(2, "--peer", f"{agents.lab.ip(1)}:{PORT}", identity="pc1")
    assert copy.process.wait(15) == 1
    agents.until(lambda: "this identity folder was copied" in copy.log_text(), 5, "the copy says why")
    assert "shoal join" in copy.log_text()
    assert agents.running[1].process.poll() is None
    agents.until(
        lambda: "refused a second agent with this node's identity" in agents.running[1].log_text(), 5, "pc1 refuses"
    )


def test_doctor_finds_a_healthy_host_healthy_and_says_what_is_wrong_elsewhere(agents: Agents) -> None:
    for host in (1, 2, 3):
        agents.start(host)
    _multicast(agents.lab, 4, on=False)
    agents.start(4, "--peer", f"{agents.lab.ip(1)}:{PORT}")
    agents.until(lambda: everyone_lists_everyone(agents, [1, 2, 3, 4]), 15, "every agent lists every other")

    healthy = agents.doctor(1, "pc1")
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "shoal doctor: healthy" in healthy.stdout
    assert "mDNS works on 10.212.0.1" in healthy.stdout

    blocked = agents.doctor(4, "pc4")
    assert blocked.returncode == 1, blocked.stdout + blocked.stderr
    assert "is heard over mDNS here" in blocked.stdout and "--peer HOST:PORT" in blocked.stdout

    expired = agents.doctor(5, "expired")
    assert expired.returncode == 1, expired.stdout + expired.stderr
    assert "the node certificate expired on" in expired.stdout
    assert "shoal fleet issue" in expired.stdout
    assert "no agent runs with this identity" in expired.stdout


def test_a_fresh_host_joins_with_a_token_bad_tokens_are_refused_and_a_revoked_node_is_shut_out(
    agents: Agents, tmp_path: Path
) -> None:
    lab, fleet = agents.lab, agents.identities["pc1"].cert.parents[2]
    enrollment = f"{lab.ip(1)}:7300"
    serve = [sys.executable, "-m", "agent.cli.main", "fleet", "serve-enrollment", "--dir", str(fleet)]
    server = subprocess.Popen(
        lab.command(1, [*serve, "--listen", enrollment]),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        encoding="utf-8",
        errors="replace",
    )
    try:
        assert server.stdout is not None and "ready" in server.stdout.readline()
        agents.start(1)
        agents.start(2)

        def join(token: JoinToken, name: str) -> subprocess.CompletedProcess[str]:
            return agents.shoal(5, "join", f"{token}@{enrollment}", "--name", name, "--out", tmp_path / name)

        token = create_token(fleet)
        began = time.monotonic()
        joined = join(token, "fresh")
        print(f"lab: shoal join (a process, token to certificate stored) {time.monotonic() - began:.2f} s")
        assert joined.returncode == 0, joined.stderr
        assert (tmp_path / "fresh" / "key.pem").stat().st_mode & 0o077 == 0
        again = join(token, "fresh2")
        assert again.returncode == 1 and "used" in again.stderr, again.stderr
        short = create_token(fleet, ttl=dt.timedelta(seconds=1))
        time.sleep(1.5)
        expired = join(short, "late")
        assert expired.returncode == 1 and "expired" in expired.stderr, expired.stderr
        good = create_token(fleet)
        forged = join(JoinToken(good.token_id, "0" * 32, good.ca_hash), "forger")
        assert forged.returncode == 1 and "refused" in forged.stderr, forged.stderr
        wrong = join(JoinToken(good.token_id, good.secret, "ab" * 32), "misled")
        assert wrong.returncode == 1 and "CA fingerprint mismatch" in wrong.stderr, wrong.stderr

        agents.identities["fresh"] = NodeIdentity.load(tmp_path / "fresh")
        fresh = agents.start(5, identity="fresh")
        agents.until(lambda: all(agents.states(h).get("fresh") == "member" for h in (1, 2)), 15, "fresh a member")

        admin = agents.identities["pc1"].cert.parent
        push: list[str | Path] = ["--push", f"{lab.ip(1)}:{PORT}", "--identity", admin]
        revoke = agents.shoal(1, "fleet", "revoke", "fresh", "--dir", fleet, *push)
        assert revoke.returncode == 0 and "taken" in revoke.stdout, revoke.stdout + revoke.stderr
        agents.until(lambda: all(agents.states(h).get("fresh") == "revoked" for h in (1, 2)), 10, "fresh revoked")
        refused = "its certificate is on the fleet's revocation list"
        agents.until(lambda: refused in agents.running[2].log_text(), 15, "pc2 refuses fresh's next handshake")
        assert fresh.process.poll() is None  # it runs on, alone: nobody admits it
        status = agents.shoal(5, "status", f"{lab.ip(2)}:{PORT}", "--identity", tmp_path / "fresh")
        assert status.returncode == 1, status.stdout
    finally:
        server.terminate()
        server.wait(10)
