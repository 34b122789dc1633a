"""What fuzzing found, each as a plain test of the decoder that failed (``make fuzz``; ``tests/fuzz/run.py``).

Each input made a decoder raise something other than shoal's own error, which the receive paths do not catch:
a peer (or a client) could end the task serving it, or have a 500 where a 400 belongs.
"""

from __future__ import annotations

import pytest

from agent.chat.openai_request import parse_openai
from agent.chat_client.protocol import ChatRequest
from agent.errors import ChatProtocolError, FleetError, HTTPError, RemoteProtocolError
from agent.fleet.enrollment import _parse_request
from agent.fleet.signed import verify_document
from agent.wire import Frame, FrameType
from agent.wire.messages import Hello
from discovery import control
from discovery.fleet_document import FleetDocument
from discovery.plan_codec import PlanRecord
from tests.fuzz.seeds import plan_record
from tests.fuzz.targets import fleet_ca

DEEP = b"[" * 5000
"""Deeper than the interpreter's recursion limit: json's C parser raised RecursionError, no ValueError."""
HUGE = "1" + "0" * 400
"""An integer JSON reads whole, and float() refuses with OverflowError."""


def members(body: str | bytes) -> Frame:
    return Frame.message(FrameType.MEMBERS, body.encode() if isinstance(body, str) else body)


def test_json_nested_too_deeply_is_each_decoders_own_error() -> None:
    with pytest.raises(RemoteProtocolError, match="not JSON"):
        Hello.from_json(DEEP)
    with pytest.raises(RemoteProtocolError, match="not JSON"):
        control.from_frame(members(DEEP))
    with pytest.raises(FleetError, match="not JSON"):
        verify_document(DEEP, fleet_ca()[1])
    with pytest.raises(FleetError, match="malformed"):
        FleetDocument._from_body(DEEP)
    with pytest.raises(ChatProtocolError, match="not a JSON line"):
        ChatRequest.from_line(DEEP)
    with pytest.raises(HTTPError, match="not JSON"):
        parse_openai(DEEP, "t", completion=False)
    with pytest.raises(FleetError, match="not a JSON line"):
        _parse_request(DEEP)


def test_a_control_document_outside_ascii_is_refused_as_not_base64() -> None:
    # found by the control target: base64 raised ValueError (not binascii.Error) for a non-ASCII string
    with pytest.raises(RemoteProtocolError, match="not base64"):
        control.from_frame(members('{"kind":"fleet","document":"]\u01d3"}'))


@pytest.mark.parametrize(
    "fields",
    [
        '"time":1,"revocations":1e400',  # json reads inf; int(inf) raised OverflowError
        '"time":1,"revocations":0,"fleet":NaN',  # int(nan) raised ValueError outside the decoder's checks
        f'"time":{HUGE},"revocations":0',  # float() of a 401-digit integer raised OverflowError
    ],
    ids=["inf", "nan", "huge"],
)
def test_a_control_hello_with_numbers_out_of_range_is_refused(fields: str) -> None:
    announcement = '{"s":"1","id":"0123456789ab","n":"pc1","f":"0123456789abcdef","fp":"sha256:' + "ab" * 32
    announcement += '","v":"0.1.0","p":"7","port":"7100","i":"0a1b2c3d","t":"1","q":"0"}'
    with pytest.raises(RemoteProtocolError, match=r"finite|out of range"):
        control.from_frame(members(f'{{"kind":"hello","announcement":{announcement},{fields}}}'))


def test_a_plan_whose_bottleneck_is_a_huge_integer_is_malformed() -> None:
    data = {**plan_record().to_json(), "bottleneck": int(HUGE)}
    with pytest.raises(RemoteProtocolError, match="malformed plan"):
        PlanRecord.from_json(data)


def test_a_chat_request_with_a_huge_temperature_is_refused() -> None:
    line = '{"v":1,"token":"t","messages":[{"role":"user","content":"x"}],"temperature":' + HUGE + "}"
    with pytest.raises(ChatProtocolError, match="out of range") as refused:
        ChatRequest.from_line(line.encode())
    assert refused.value.param == "temperature"
    with pytest.raises(HTTPError, match="out of range"):
        body = b'{"messages":[{"role":"user","content":"x"}],"top_p":' + HUGE.encode() + b"}"
        parse_openai(body, "t", completion=False)


@pytest.mark.parametrize("role", ["[]", "{}"])
def test_an_openai_message_whose_role_is_not_text_is_a_bad_request(role: str) -> None:
    # found by the openai_json target: the role was looked up in a dict, and a list is unhashable (TypeError: a 500)
    with pytest.raises(HTTPError, match="role must be one of") as refused:
        parse_openai(f'{{"messages":[{{"role":{role},"content":"x"}}]}}'.encode(), "t", completion=False)
    assert refused.value.code == "bad_request"
