"""Donors on a LAN of network namespaces (issue 43, acceptance 3): a user comes back mid-answer, nothing is lost.

Hosts 1-4 run ``shoal agent --donor`` (one inference thread each), every one with an X display of its own (a
fresh Xvfb: the agent's X11 idle source reads it), found over mDNS; host 5 heads the chats and gives no memory.
Three donors serve the stages of the SmolLM2 int4 export, the fourth stands by. While an answer streams, a key is
pressed on the display of a stage holder that has a standby (real XTEST input): that PC drains, its stage goes to
the standby, the head replays the answer there, and the answer has exactly the tokens of the undisturbed one.
Within 5 s of the key press the PC says it is away and holds no stage; once its display has been idle for the idle
time again it serves (stands by) again. The pause the user saw is printed.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from tests.integration.netlab import NetLab
from tests.support.plan_fleet import PORT, LabFleet
from tests.support.xvfb import press_key, xvfb

pytestmark = [pytest.mark.lab, pytest.mark.slow, pytest.mark.desktop, pytest.mark.timeout(600)]

HOSTS = 5
HEAD = 5
DONORS = ("pc1", "pc2", "pc3", "pc4")
IDLE_SECONDS = 6.0
PROMPT = "Write a short story about a lighthouse keeper."
MAX_TOKENS = 48
ASK_TIMED = """
import asyncio, json, sys, time
from pathlib import Path
from agent.chat_client.client import ask
from agent.chat_client.endpoint import ChatEndpoint
from agent.chat_client.protocol import ChatRequest
endpoint = ChatEndpoint.load(Path(sys.argv[1]))
request = ChatRequest(token=endpoint.token, messages=(("user", sys.argv[2]),), max_tokens=int(sys.argv[3]))
async def main():
    out = []
    async for e in ask(endpoint, request):
        out.append({**json.loads(e.to_line()), "at": time.monotonic()})
        if len(out) == 1:
            print("started", flush=True)
    return out
print(json.dumps(asyncio.run(main())), flush=True)
"""


@pytest.fixture(scope="module")
def lab() -> Iterator[NetLab]:
    why = NetLab.available()
    if why is not None:
        pytest.skip(why)
    for program, package in (("Xvfb", "xvfb"), ("xdotool", "xdotool")):
        if shutil.which(program) is None:
            pytest.skip(f"{program} is not installed (Debian package {package})")
    net = NetLab("shoaldonor" + os.environ.get("PYTEST_XDIST_WORKER", ""), HOSTS, net="10.217.0")
    net.up()
    try:
        yield net
    finally:
        net.down()


def test_a_donor_whose_user_returns_mid_answer_hands_its_stage_to_the_standby_and_the_answer_is_unchanged(
    lab: NetLab, exported: Callable[..., Path], cache_dir: Path, tmp_path: Path
) -> None:
    folder = exported(3, "int4")
    config = tmp_path / "donor.toml"
    # the suite runs beside it: other programs' load must not send a donor off meanwhile
    config.write_text(f"[donor]\nidle_minutes = {IDLE_SECONDS / 60}\nmax_other_load = 1.0\n")
    fleet = LabFleet(lab, tmp_path, cache_dir, "http://127.0.0.1:9")  # the model is a folder: no mirror
    chat_file = tmp_path / "head-chat.json"
    with ExitStack() as stack:
        displays = {name: stack.enter_context(xvfb()) for name in DONORS}
        stack.callback(fleet.stop_all)
        for host, name in enumerate(DONORS, start=1):
            fleet.start(name, host, "--donor", "--config", str(config), env={"DISPLAY": displays[name]})
        fleet.start("head", HEAD, "--offer-mb", "0", "--chat", "127.0.0.1:0", "--chat-file", str(chat_file))
        admin = fleet.identity("admin", 1)
        served = fleet.shoal(
            1, "fleet", "serve", str(folder), "--dir", tmp_path / "fleet", "--push", f"{lab.ip(1)}:{PORT}",
            "--identity", admin.cert.parent,
        )  # fmt: skip
        assert served.returncode == 0, served.stderr

        def standby_ready() -> dict[str, Any] | None:
            plan = fleet.plan("head")
            if not plan.get("ready"):
                return None
            return next((s for s in plan["stages"] if any(b["state"] == "standby" for b in s["standbys"])), None)

        fleet.until(lambda: standby_ready() is not None, 240, "the ring ready, a standby compiled")
        stage = standby_ready()
        assert stage is not None
        holder = str(stage["name"])

        def ask(press_after: float | None = None) -> tuple[list[dict[str, Any]], float]:
            command = [sys.executable, "-c", ASK_TIMED, str(chat_file), PROMPT, str(MAX_TOKENS)]
            process = subprocess.Popen(lab.command(HEAD, command), stdout=subprocess.PIPE, text=True)
            assert process.stdout is not None
            assert process.stdout.readline().strip() == "started"
            pressed = 0.0
            if press_after is not None:
                time.sleep(press_after)
                press_key(displays[holder])
                pressed = time.monotonic()
            out, _ = process.communicate(timeout=180)
            return json.loads(out), pressed

        undisturbed, _ = ask()
        assert undisturbed[-1]["event"] == "done", undisturbed[-1]
        reference = [e["id"] for e in undisturbed if e["event"] == "token"]
        took = undisturbed[-1]["at"] - undisturbed[0]["at"]

        events, pressed = ask(press_after=took / 4)
        done = events[-1]
        assert done["event"] == "done", done
        assert [e["id"] for e in events if e["event"] == "token"] == reference
        tokens_at = [e["at"] for e in events if e["event"] == "token"]
        assert tokens_at[-1] > pressed, "the answer ended before the key was pressed"
        pause = max(b - a for a, b in itertools.pairwise(tokens_at))
        print(f"lab: stage {stage['stage']} left {holder}; replays {done.get('replays')}; longest pause {pause:.2f} s")

        def stepped_aside() -> bool:
            status = fleet.status(holder)
            return (status.get("donor") or {}).get("state") == "away" and not status.get("stages")

        fleet.until(stepped_aside, 10, f"{holder} away, serving no stage")
        away_after = time.monotonic() - pressed
        print(f"lab: {holder} away and serving nothing {away_after:.2f} s after the key press")
        assert away_after <= 5.0 + 1.0  # one status poll is a process started inside the lab (about 1 s)
        assert fleet.plan("head")["stages"][stage["stage"]]["name"] != holder
        # idle again for the idle time: it serves again, standing by (a PC that just left a stage gets none back)
        fleet.until(
            lambda: (fleet.status(holder).get("donor") or {}).get("state") == "serving", 60, f"{holder} serving again"
        )
        ring_after = [e["id"] for e in ask()[0] if e["event"] == "token"]
        assert ring_after == reference
