"""``python -m bench plan``: a fleet forming its ring from an office mirror, in a lab of network namespaces.

Host 5 runs the mirror (olah, ``.venv-olah``) with the SmolLM2 3-stage export published into it; hosts 1-4 run
``shoal agent`` with nothing but an identity and ``HF_ENDPOINT`` (host 4 gives no memory: it heads the chat and
holds no stage). A chat client inside host 4 asks again and again from the first launch on, and records when
the first answer ends: that instant, less the first launch, is the time to a ring that answers. Clocks are
``CLOCK_MONOTONIC``, which network namespaces share. Needs root and iproute2.

Figures (the goals of issue 24):

- ``ring_cold_s``: empty shard caches and an empty compile cache, the fleet document pushed once the 4 agents
  listen: discovery, planning, downloads, compiles, the ring, one answer (goal < 10 s);
- ``ring_cached_s``: the same 4 agents started again: shards, compiled blobs and the fleet document kept
  (goal < 10 s);
- ``failover_s``: a fifth agent stands by with its stage compiled; from ``kill -9`` of that stage's agent to
  the re-planned ring's next answer;
- ``mirror_mb_s`` / ``http_mb_s`` / ``download_ratio``: the largest stage file fetched by ``huggingface_hub``
  from olah, against a plain HTTP download of the same file from the same host (goal ratio >= 0.8);
  ``olah_plain_mb_s`` / ``client_ratio``: the same olah URL read plainly, which tells the client's share
  (``huggingface_hub``: its HEAD, its cache) from the server's;
- ``outage_answer_s``: the 4 agents started again with empty shard caches; the mirror is stopped once a stage's
  download is under way and started again ``--outage`` seconds later (``outage_down_s``): seconds from its
  return to the ring's first answer, the agents never restarted (issue 41: before, their fetch loops died).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from agent.errors import BenchError
from bench.report import print_figures

HOSTS = 5
MIRROR_HOST = 5
HEAD_HOST = 4
REPO = "office/smollm2-3stage"
HTTP_PORT = 8091
ASK_UNTIL_ANSWERED = """
import asyncio, json, sys, time
from pathlib import Path
from agent.chat_client.client import ask
from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatRequest
path, deadline, start_at = Path(sys.argv[1]), time.monotonic() + float(sys.argv[2]), float(sys.argv[3])
async def main():
    tries = 0
    await asyncio.sleep(max(0.0, start_at - time.monotonic()))
    while time.monotonic() < deadline:
        if path.is_file():
            endpoint = ChatEndpoint.load(path)
            request = ChatRequest(token=endpoint.token, messages=(("user", "What is 2+2?"),), max_tokens=4)
            tries += 1
            events = [e async for e in ask(endpoint, request)]
            if events[-1].event == "done":
                return {"answered": time.monotonic(), "tries": tries}
        await asyncio.sleep(0.05)
    return {"answered": None, "tries": tries}
print(json.dumps(asyncio.run(main())))
"""
TIMED_DOWNLOAD = """
import json, sys, time, urllib.request
from pathlib import Path
how, out = sys.argv[1], Path(sys.argv[2])
if how == "mirror":
    from huggingface_hub import hf_hub_download
start = time.monotonic()
if how == "mirror":  # huggingface_hub, as an agent fetches
    endpoint, repo, revision, filename = sys.argv[3:7]
    path = Path(hf_hub_download(repo, filename, revision=revision, endpoint=endpoint, cache_dir=out))
else:
    path = out / "file"
    with urllib.request.urlopen(sys.argv[3]) as answer, path.open("wb") as sink:
        while block := answer.read(1 << 20):
            sink.write(block)
print(json.dumps({"seconds": time.monotonic() - start, "bytes": path.stat().st_size}))
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--export", type=Path, default=None, help="a 3-stage export (default: SmolLM2, made once)")
    parser.add_argument("--downloads", type=int, default=3, help="downloads of each kind (median reported)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--work", type=Path, default=None, help="keep the agents' logs and caches here (default: temp)")
    parser.add_argument("--outage", type=float, default=20.0, help="seconds the mirror is down mid-download")


def run_plan_bench(args: argparse.Namespace, cache_dir: Path) -> int:
    from tests.integration.netlab import NetLab
    from tests.support.olah_mirror import OlahMirror

    why = NetLab.available()
    if why is not None:
        print(f"python -m bench plan: {why}", file=sys.stderr)
        return 2
    export = args.export or _default_export(cache_dir)
    report: dict[str, Any] = {"machine": f"{platform.node()} {platform.machine()}", "date": time.strftime("%F %R")}
    with tempfile.TemporaryDirectory() as folder:
        root = Path(args.work or folder)
        root.mkdir(parents=True, exist_ok=True)
        lab = NetLab("shoalpb", HOSTS, net="10.215.0")
        lab.up()
        mirror = OlahMirror(root / "mirror", host=lab.ip(MIRROR_HOST), command_prefix=lab.command(MIRROR_HOST, []))
        try:
            bench = _PlanBench(lab, root, mirror.endpoint)
            commit = bench.publish(export, mirror.mirrors)
            mirror.start()
            report["ring_cold_s"] = bench.form(commit, cold=True)
            report["ring_cached_s"] = bench.form(commit, cold=False)
            report["failover_s"] = bench.failover()
            bench.stop_all()
            report.update(bench.outage(mirror, args.outage))
            report.update(bench.downloads(export, commit, args.downloads))
        finally:
            mirror.stop()
            lab.down()
    print_figures(report, args.json)
    return 0


def _default_export(cache_dir: Path) -> Path:
    from bench.baseline import shoal_export

    return shoal_export("smollm2", 3, cache_dir / "bench" / "plan-smollm2-3stage", cache_dir).path


class _PlanBench:
    def __init__(self, lab: Any, root: Path, endpoint: str) -> None:
        from tests.support.plan_fleet import PORT, LabFleet

        self.lab, self.root = lab, root
        self.fleet = LabFleet(lab, root, root / "cache", endpoint)
        self.chat_file = root / "pc4-chat.json"
        self.port = PORT

    def publish(self, export: Path, mirrors: Path) -> str:
        done = self.fleet.shoal(MIRROR_HOST, "publish", export, REPO, "--mirror", mirrors)
        if done.returncode:
            raise BenchError(f"shoal publish failed: {done.stderr.strip()}")
        return done.stdout.split(f"{REPO}@")[1].split()[0]

    def _asker(self, timeout: float, start_at: float = 0.0) -> subprocess.Popen[str]:
        """A client in the head's host that asks from ``start_at`` (a monotonic time) until an answer ends."""
        command = [sys.executable, "-c", ASK_UNTIL_ANSWERED, str(self.chat_file), str(timeout), str(start_at)]
        return subprocess.Popen(
            self.lab.command(HEAD_HOST, command), stdout=subprocess.PIPE, encoding="utf-8", errors="replace"
        )

    def _answered(self, asker: subprocess.Popen[str], since: float, what: str) -> float:
        out, _ = asker.communicate(timeout=600)
        answered = json.loads(out)["answered"]
        if answered is None:
            logs = "\n".join(f"--- {n}\n" + "\n".join(list(a.log)[-15:]) for n, a in self.fleet.running.items())
            raise BenchError(f"{what}: the ring did not answer in time\n{logs}")
        return round(answered - since, 2)

    def form(self, commit: str, *, cold: bool) -> float:
        """Seconds from launching agents pc1-pc4 at once to the first answer of their ring."""
        self.chat_file.unlink(missing_ok=True)
        asker = self._asker(300)
        began = time.monotonic()
        threads = [threading.Thread(target=self._start, args=(host,)) for host in range(1, HEAD_HOST + 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if cold:
            admin = self.fleet.identity("admin", 1)
            served = self.fleet.shoal(
                1, "fleet", "serve", f"{REPO}@{commit}", "--dir", self.root / "fleet",
                "--push", f"{self.lab.ip(1)}:{self.port}", "--identity", admin.cert.parent,
            )  # fmt: skip
            if served.returncode:
                raise BenchError(f"shoal fleet serve failed: {served.stderr.strip()}")
        took = self._answered(asker, began, "cold start" if cold else "cached start")
        if not cold:
            return took
        for name in list(self.fleet.running):
            self.fleet.running.pop(name).stop(timeout=10)
        return took

    def _start(self, host: int) -> None:
        if host == HEAD_HOST:
            chat = ["--chat", "127.0.0.1:0", "--chat-file", str(self.chat_file)]
            self.fleet.start("pc4", host, "--offer-mb", "0", *chat)
        else:
            self.fleet.start(f"pc{host}", host)

    def failover(self) -> float:
        """Seconds from ``kill -9`` of the agent whose stage a fifth agent stands by for, to the next answer."""
        self.fleet.start("pc5", MIRROR_HOST)
        self.fleet.until(lambda: self._standby() is not None, 180, "pc5 standing by with its stage compiled")
        victim = str(self._standby())
        began = time.monotonic() + 3.0  # the asker's own start (imports) is not the failover's time
        asker = self._asker(60, start_at=began)
        time.sleep(max(0.0, began - time.monotonic()))
        self.fleet.running[victim].process.kill()
        return self._answered(asker, began, f"failover after kill -9 of {victim}")

    def outage(self, mirror: Any, down_for: float) -> dict[str, float]:
        """The ring formed again from empty shard caches, its mirror stopped once a stage's download is under way
        and started again ``down_for`` seconds later: seconds from the mirror's return to the ring's answer."""
        shutil.rmtree(self.root / "shards", ignore_errors=True)
        self.chat_file.unlink(missing_ok=True)
        threads = [threading.Thread(target=self._start, args=(host,)) for host in range(1, HEAD_HOST + 1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.fleet.until(self._downloading, 180, "a stage's download under way")
        mirror.stop()
        time.sleep(down_for)
        back = time.monotonic() + 3.0  # the asker's own start (imports) is not the wait
        asker = self._asker(300, start_at=back)
        time.sleep(max(0.0, back - time.monotonic()))
        mirror.start()
        took = self._answered(asker, back, f"the ring after a {down_for:g} s mirror outage")
        self.stop_all()
        return {"outage_down_s": down_for, "outage_answer_s": took}

    def _downloading(self) -> bool:
        try:
            stages = self.fleet.plan("pc1")["stages"]
        except AssertionError:  # pc1 does not answer its status yet
            return False
        return any(s.get("state") == "downloading" and (s.get("progress") or 0) > 0 for s in stages)

    def _standby(self) -> str | None:
        for stage in self.fleet.plan("pc1")["stages"]:
            if any(b["name"] == "pc5" and b["state"] == "standby" for b in stage["standbys"]):
                return str(stage["name"])
        return None

    def stop_all(self) -> None:
        self.fleet.stop_all()

    def downloads(self, export: Path, commit: str, runs: int) -> dict[str, float]:
        """MB/s of the largest stage file through the mirror and over plain HTTP from the same host."""
        from shards.manifest import Manifest

        manifest = Manifest.load(export)
        largest = max((f for s in manifest.stages for f in s.files), key=lambda f: f.size)
        server = subprocess.Popen(
            self.lab.command(
                MIRROR_HOST,
                [sys.executable, "-m", "http.server", str(HTTP_PORT), "--bind", self.lab.ip(MIRROR_HOST),
                 "--directory", str(export)],
            ),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            time.sleep(1.0)
            url = f"http://{self.lab.ip(MIRROR_HOST)}:{HTTP_PORT}/{largest.path}"
            olah_url = f"{self.fleet.endpoint}/{REPO}/resolve/{commit}/{largest.path}"
            rates: dict[str, list[float]] = {"mirror": [], "olah_plain": [], "http": []}
            for run in range(runs):
                for how in rates:
                    out = self.root / f"download-{how}-{run}"
                    out.mkdir()
                    extra = {
                        "mirror": [self.fleet.endpoint, REPO, commit, largest.path],
                        "olah_plain": [olah_url],
                        "http": [url],
                    }[how]
                    command = [sys.executable, "-c", TIMED_DOWNLOAD, how, str(out), *extra]
                    done = subprocess.run(
                        self.lab.command(1, command),
                        capture_output=True,
                        encoding="utf-8",
                        errors="replace",
                        timeout=300,
                    )
                    if done.returncode:
                        raise BenchError(f"the {how} download failed: {done.stderr.strip()[-2000:]}")
                    timing = json.loads(done.stdout)
                    if timing["bytes"] != largest.size:
                        raise BenchError(f"the {how} download gave {timing['bytes']} bytes, not {largest.size}")
                    rates[how].append(timing["bytes"] / timing["seconds"] / 1e6)
        finally:
            server.terminate()
            server.wait(10)
        mirror, plain, http = (statistics.median(rates[how]) for how in ("mirror", "olah_plain", "http"))
        return {
            "file_mb": round(largest.size / 1e6, 1),
            "mirror_mb_s": round(mirror, 1),
            "olah_plain_mb_s": round(plain, 1),
            "http_mb_s": round(http, 1),
            "download_ratio": round(mirror / http, 2),
            "client_ratio": round(mirror / plain, 2),
        }
