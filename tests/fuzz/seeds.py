"""Writes the seed corpus (``tests/fuzz/corpus/<target>/``): valid inputs of every kind each target reads, and a
few broken ones, made with the codecs' own encoders. ``python -m tests.fuzz.seeds`` rewrites it; the files are
committed, so the corpus changes only when this script does (or a finding is added by hand).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from pathlib import Path

import numpy as np

from agent.chat_client.protocol import Alternative, ChatEvent, ChatRequest, TokenLogprob
from agent.fleet import fleet_id_of
from agent.sampling.readout import StepOutput
from agent.wire import Frame, FrameType, StepFlags, encode_frame
from agent.wire.messages import ErrorReport, Hello, SessionOpen
from agent.wire.result import result_frame
from discovery import control
from discovery.announcement import Announcement
from discovery.fleet_document import FleetDocument, ModelSource, Pin, StandbyPolicy
from discovery.placement import Assignment, PinOutcome, Plan
from discovery.plan_codec import PlanRecord
from tests.fuzz.targets import fleet_ca

CORPUS = Path(__file__).parent / "corpus"


def _bytes(frame: Frame) -> bytes:
    return b"".join(bytes(b) for b in encode_frame(frame))


def wire_seeds() -> list[bytes]:
    hello = Hello("0123456789ab", "head", "78a29e567c0daa0c", 0, 10, False, 7).to_frame()
    ids = Frame.tensor(FrameType.STEP, np.array([[1, 2, 3]], dtype=np.int64), session=5, count=3)
    hidden = Frame.tensor(FrameType.STEP, np.ones((1, 2, 4), dtype=np.float32), session=5, step=1, position=3, count=2)
    greedy = result_frame(StepOutput(top1=np.array([4, 9], dtype=np.int32)), 5, 1)
    frames = [
        hello,
        SessionOpen(7, 0.7, 40, 0.9).to_frame(5),
        ids,
        hidden,
        greedy,
        Frame(FrameType.RESULT, session=5, step=0, flags=StepFlags.PART),
        ErrorReport("busy", "fleet busy", "pc1").to_frame(5),
        Frame(FrameType.PARK, session=5),
        Frame(FrameType.CLOSE, session=5),
        Frame(FrameType.PING, step=3),
        Frame(FrameType.STATUS_REQUEST),
        control.to_frame(control.Leave()),
        Frame(FrameType.GOODBYE),
    ]
    seeds = [_bytes(f) for f in frames]
    stream = b"".join(seeds)
    seeds.append(stream)
    seeds.append(stream[: len(stream) // 2])  # cut mid-frame
    seeds.append(b"XX" + seeds[0][2:])  # not a shoal frame
    seeds.append(seeds[0][:2] + b"\x06" + seeds[0][3:])  # an older protocol version
    return seeds


def announcement() -> Announcement:
    fingerprint = "sha256:" + "ab" * 32
    return Announcement("0123456789ab", "pc1", "0123456789abcdef", fingerprint, "0.1.0", 7, 7100, "0a1b2c3d", 1)


def plan_record() -> PlanRecord:
    plan = Plan(
        (
            Assignment(0, "0123456789ab", ("0123456789ac",), "given to pc1"),
            Assignment(1, None, (), "no member can hold it"),
        ),
        (PinOutcome(Pin("pc2", 1, True), False, "pc2 is away"),),
        epoch=3,
        bottleneck=0.5,
        probation=frozenset({"0123456789ad"}),
    )
    return PlanRecord(plan, "0123456789ab", 4, "78a29e567c0daa0c")


def control_seeds() -> list[bytes]:
    a = announcement()
    messages: list[control.ControlMessage] = [
        control.Hello(a, 1.7e9, 2, 3, 12.5, 40.0),
        control.Update(a),
        control.Gossip((control.GossipEntry("10.0.0.2", a),)),
        control.Revocations(b'{"schema": 1}'),
        control.FleetDocumentOffer(b"signed"),
        control.PlanOffer(plan_record().to_json()),
        control.Refused("a copied identity", control.GossipEntry("10.0.0.3", a)),
        control.Leave(),
        control.Ack("taken"),
    ]
    return [control.to_frame(m).body() for m in messages]


def plan_seeds() -> list[bytes]:
    return [json.dumps(plan_record().to_json()).encode()]


def fleet_document_seeds() -> list[bytes]:
    key, cert = fleet_ca()
    now = dt.datetime(2030, 5, 1, 12, 0, tzinfo=dt.UTC)
    hub = ModelSource("owner/model", hashlib.sha1(b"x").hexdigest())
    fleet = fleet_id_of(cert)
    documents = [
        FleetDocument(fleet, 4, now, hub, (Pin("pc2", 1, True), Pin("0123456789ab", 0)), StandbyPolicy(2)),
        FleetDocument(fleet, 1, now, ModelSource(export_dir="/srv/exports/smollm2")),
        FleetDocument.empty("0123456789abcdef", now),  # another fleet's
    ]
    return [d.sign(key) for d in documents] + [d.body() for d in documents]


def chat_line_seeds() -> list[bytes]:
    request = ChatRequest("tok", (("system", "be brief"), ("user", "hi")), 16, 0.7, 0.9, 40, 3, ("\n\n",), None, 2)
    completion = ChatRequest("tok", (), 8, prompt="Once upon a time")
    scored = TokenLogprob("hi", -0.25, (Alternative(5, "hi", -0.25), Alternative(6, "ho", -1.5)))
    events = [
        ChatEvent("token", id=5, text="hi", logprobs=scored),
        ChatEvent.progress(64, 128, 0.5),
        ChatEvent("done", text=".", stats={"tokens": 3, "finish_reason": "stop", "exact": True}),
        ChatEvent.error("fleet_busy", "try again"),
    ]
    return [request.to_line(), completion.to_line(), *(e.to_line() for e in events)]


OPENAI_BODIES = [
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8},
    {
        "messages": [
            {"role": "developer", "content": [{"type": "text", "text": "be brief"}]},
            {"role": "user", "content": "hi", "name": "ann"},
        ],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.5,
        "top_p": 0.9,
        "seed": 3,
        "stop": ["\n"],
        "logprobs": True,
        "top_logprobs": 2,
        "n": 1,
        "tools": [],
        "user": "u",
    },
    {"model": "m", "prompt": "Once upon", "max_tokens": 4, "logprobs": 3, "echo": False},
]


def openai_json_seeds() -> list[bytes]:
    return [json.dumps(b).encode() for b in OPENAI_BODIES]


def openai_http_seeds() -> list[bytes]:
    seeds = []
    paths = ("/v1/chat/completions", "/v1/chat/completions", "/v1/completions")
    for body, path in zip(OPENAI_BODIES, paths, strict=True):
        raw = json.dumps(body).encode()
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer tok\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
        )
        seeds.append(head.encode() + raw)
    raw = json.dumps(OPENAI_BODIES[0]).encode()
    chunked = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(raw):x}\r\n".encode()
        + raw
        + b"\r\n0\r\n\r\n"
    )
    seeds.append(chunked)
    seeds.append(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
    seeds.append(b"GET /metrics HTTP/1.0\r\n\r\n")
    return seeds


SEEDS = {
    "wire": wire_seeds,
    "control": control_seeds,
    "plan": plan_seeds,
    "fleet_document": fleet_document_seeds,
    "chat_line": chat_line_seeds,
    "openai_json": openai_json_seeds,
    "openai_http": openai_http_seeds,
}


def main() -> None:
    for target, make in SEEDS.items():
        folder = CORPUS / target
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.glob("seed-*"):
            old.unlink()
        for data in make():
            (folder / f"seed-{hashlib.sha1(data).hexdigest()[:12]}").write_bytes(data)


if __name__ == "__main__":
    main()
