"""The fuzz targets: one function of ``bytes`` per decoder that a peer (or a client) feeds.

Each holds h11's invariant (``h11/fuzz/afl-server.py``), and nothing else: whatever the bytes, the decoder either
decodes them or raises shoal's own error (:class:`~agent.errors.ShoalError`'s tree, which the receive paths catch
to drop the peer); and where the decoder is incremental, feeding the bytes whole or one at a time gives the same
frames and the same error. Any other exception escapes the target: that is a finding (atheris saves the input,
``tests/fuzz/run.py`` reports it, and it becomes a plain regression test in ``tests/fuzz/test_findings.py``).

The seed corpus of each target is ``tests/fuzz/corpus/<target>/``; ``tests/fuzz/test_seed_corpus.py`` replays it
in the ordinary suite.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Callable, Coroutine
from typing import Any

import h11

from agent.chat.openai_request import parse_openai
from agent.chat_client.protocol import MAX_LINE_BYTES, ChatEvent, ChatRequest
from agent.errors import ShoalError
from agent.transport.http import read_request
from agent.wire import HEADER_SIZE, Frame, FrameDecoder, FrameType
from agent.wire.messages import ErrorReport, Hello, SessionOpen, parse
from agent.wire.result import parse_result
from discovery import control
from discovery.fleet_document import FleetDocument
from discovery.plan_codec import PlanRecord

MAX_PAYLOAD = 4096
"""The frame decoder's cap under fuzzing: small, so that the fuzzer reaches both sides of it."""
VOCAB = 64
"""The vocabulary a RESULT's token ids are checked against."""
TOKEN = "fuzz-token"


class FuzzFinding(AssertionError):
    """The invariant broke in a way that raised nothing: two ways of feeding the same bytes disagreed."""


Outcome = tuple[list[tuple[Any, ...]], str | None]
"""What a decoder made of a stream: the frames (as comparable tuples), then the error that ended it (None: none)."""


# -- the ring's frames -------------------------------------------------------------------------------
def wire(data: bytes) -> None:
    """``agent.wire``: the frame decoder, whole and byte by byte, then each frame's body by its type's parser."""
    whole = _frames([data])
    bytewise = _frames([data[i : i + 1] for i in range(len(data))])
    if whole != bytewise:
        raise FuzzFinding(f"whole: {whole}\nbyte by byte: {bytewise}")


def _frames(chunks: list[bytes]) -> Outcome:
    decoder = FrameDecoder(MAX_PAYLOAD)
    frames: list[tuple[Any, ...]] = []
    try:
        for chunk in chunks:
            decoder.receive_data(chunk)
            while (frame := decoder.next_frame()) is not None:
                frames.append(_read_body(frame))
    except ShoalError as exc:
        return frames, f"{type(exc).__name__}: {exc}"
    if decoder.buffered > MAX_PAYLOAD + HEADER_SIZE:
        raise FuzzFinding(f"the decoder holds {decoder.buffered} bytes, over its cap")
    return frames, None


def _read_body(frame: Frame) -> tuple[Any, ...]:
    """The frame, and what its type's parser made of its body (or the shoal error it raised)."""
    parsers: dict[FrameType, Callable[[Frame], object]] = {
        FrameType.HELLO: lambda f: parse(f, Hello),
        FrameType.OPEN: lambda f: parse(f, SessionOpen),
        FrameType.ERROR: lambda f: parse(f, ErrorReport),
        FrameType.RESULT: lambda f: parse_result(f, VOCAB, 8),
        FrameType.STEP: lambda f: f.array(),
        FrameType.MEMBERS: control.from_frame,
    }
    parser = parsers.get(frame.type)
    try:
        body = repr(parser(frame)) if parser is not None else None
    except ShoalError as exc:
        body = f"{type(exc).__name__}: {exc}"
    fields = (frame.type, frame.session, frame.step, frame.position, frame.count, frame.rewind, frame.flags)
    return (*fields, frame.dtype, frame.shape, bytes(frame.payload), body)


# -- the control channel, the plan, the fleet document -----------------------------------------------
def control_message(data: bytes) -> None:
    """``discovery.control``: a MEMBERS frame's body; a plan it offers is read as ``discovery.plan_codec`` does."""
    try:
        message = control.from_frame(Frame.message(FrameType.MEMBERS, data))
        if isinstance(message, control.PlanOffer):
            PlanRecord.from_json(message.plan)
    except ShoalError:
        pass


def plan(data: bytes) -> None:
    """``discovery.plan_codec``: a plan record as JSON (what is no JSON object is the control message's to refuse)."""
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return
    if not isinstance(record, dict):
        return
    with contextlib.suppress(ShoalError):
        PlanRecord.from_json(record)


def fleet_document(data: bytes) -> None:
    """``discovery.fleet_document``: a signed document checked against the fleet CA, and a body read as if signed (a
    body the CA signed is read field by field all the same)."""
    with contextlib.suppress(ShoalError):
        FleetDocument.verify(data, fleet_ca()[1])
    with contextlib.suppress(ShoalError):
        FleetDocument._from_body(data)


_CA: list[Any] = []


def fleet_ca() -> tuple[Any, Any]:
    """The fuzzing fleet's CA key and certificate: the same in every process (a fixed key, so the seed corpus holds
    documents it signed), made once."""
    if not _CA:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.derive_private_key(0x5EED, ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fuzz fleet CA")])
        start = dt.datetime(2020, 1, 1, tzinfo=dt.UTC)
        builder = x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        builder = builder.serial_number(1).not_valid_before(start).not_valid_after(start + dt.timedelta(days=36500))
        _CA.extend((key, builder.sign(key, hashes.SHA256())))
    return _CA[0], _CA[1]


# -- the chat endpoint and the OpenAI-style API -------------------------------------------------------
def chat_line(data: bytes) -> None:
    """``agent.chat_client.protocol``: one line as a request (what the agent reads) and as an event (what clients
    read)."""
    for read in (ChatRequest.from_line, ChatEvent.from_line):
        with contextlib.suppress(ShoalError):
            read(data)


def openai_json(data: bytes) -> None:
    """``agent.chat.openai_request``: a request body, as a chat completion and as a (legacy) completion."""
    for completion in (False, True):
        with contextlib.suppress(ShoalError):
            parse_openai(data, TOKEN, completion=completion)


def openai_http(data: bytes) -> None:
    """The OpenAI-style API's request reading (h11 and ``agent.transport.http``), whole and byte by byte, then the
    body as its path says. h11's own ``RemoteProtocolError`` is the endpoint's to map (it answers 400)."""
    whole = _http([data])
    bytewise = _http([data[i : i + 1] for i in range(len(data))])
    if whole != bytewise:
        raise FuzzFinding(f"whole: {whole}\nbyte by byte: {bytewise}")


class _Chunks:
    """The part of ``asyncio.StreamReader`` that ``read_request`` uses: each read gives the next chunk, then b""."""

    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = iter(chunks)

    async def read(self, n: int) -> bytes:
        return next(self._chunks, b"")


def _completed(coro: Coroutine[Any, Any, Any]) -> Any:
    """The result of a coroutine that never waits (``read_request`` on ``_Chunks``), run without an event loop:
    no loop to keep open between inputs (a module-level one was a loop and 3 descriptors no test closed)."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("read_request waited on something other than its chunks")


def _http(chunks: list[bytes]) -> tuple[Any, ...]:
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=16 * 1024)
    try:
        request, body = _completed(read_request(connection, _Chunks(chunks), MAX_LINE_BYTES))  # type: ignore[arg-type]
    except ShoalError as exc:
        return (type(exc).__name__, str(exc))
    except (h11.RemoteProtocolError, ConnectionError) as exc:  # h11's messages quote what it had buffered
        return (type(exc).__name__,)
    path = request.target.decode("latin-1").split("?", 1)[0]
    try:
        parsed = repr(parse_openai(body, TOKEN, completion=path == "/v1/completions"))
    except ShoalError as exc:
        parsed = f"{type(exc).__name__}: {exc}"
    return (request.method, request.target, tuple(request.headers), body, parsed)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "wire": wire,
    "control": control_message,
    "plan": plan,
    "fleet_document": fleet_document,
    "chat_line": chat_line,
    "openai_json": openai_json,
    "openai_http": openai_http,
}
"""Every target by name (its corpus folder's name)."""
