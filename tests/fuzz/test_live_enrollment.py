"""The enrollment endpoint under a hypothesis state machine (smaller than the ring's: ``test_live_agent.py``).

A real ``EnrollmentServer`` over TLS on loopback, driven by sync rules on one persistent event loop: joins with a
fresh token, with a token already used, an expired one, a forged one (its secret guessed), one pinning another CA,
and connections that send garbage instead of a request. Invariants: every fresh token enrolls exactly one PC, every
other attempt is refused and enrolls nobody, and the server holds no connection once its joiner is gone.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import secrets
import ssl
from collections.abc import Awaitable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test

from agent.errors import FleetError
from agent.fleet import init_fleet
from agent.fleet.enrollment import EnrollmentServer, JoinToken, create_token, join

WAIT = 10.0
T = TypeVar("T")

pytestmark = pytest.mark.timeout(120)


class Enrollment:
    def __init__(self, loop: asyncio.AbstractEventLoop, fleet: Path, server: EnrollmentServer, folder: Path) -> None:
        self.loop, self.fleet, self.server, self.folder = loop, fleet, server, folder
        self.address = ("127.0.0.1", 0)
        self.enrolled = 0
        self.steps = 0
        self.names = 0

    def run(self, coro: Awaitable[T]) -> T:
        async def bounded() -> T:
            async with asyncio.timeout(WAIT):
                return await coro

        return self.loop.run_until_complete(bounded())

    def join(self, token: JoinToken) -> None:
        """Join as a new PC (its identity goes to ``self.out``)."""
        self.names += 1
        self.run(join(self.address, token, f"pc{self.names}", self.out, timeout=WAIT))

    @property
    def out(self) -> Path:
        return self.folder / f"pc{self.names}"


@pytest.fixture
def enrollment(tmp_path: Path) -> Iterator[Enrollment]:
    fleet = tmp_path / "fleet"
    init_fleet(fleet, "fuzz")
    loop = asyncio.new_event_loop()
    server = EnrollmentServer(fleet, ("127.0.0.1", 0), "ca-pc", timeout=2.0)
    state = Enrollment(loop, fleet, server, tmp_path / "joiners")
    state.address = loop.run_until_complete(server.start())
    try:
        yield state
    finally:
        loop.run_until_complete(server.stop())
        loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


def machine(e: Enrollment) -> type[RuleBasedStateMachine]:
    class LiveEnrollment(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.used: list[JoinToken] = []

        def refused(self, token: JoinToken, match: str) -> None:
            with pytest.raises(FleetError, match=match):
                e.join(token)
            assert not e.out.exists(), "a refused joiner got an identity"

        @rule()
        def fresh_token(self) -> None:
            e.steps += 1
            token = create_token(e.fleet)
            e.join(token)
            assert any(e.out.iterdir()), "the joiner's identity was not written"
            e.enrolled += 1
            self.used.append(token)

        @precondition(lambda self: bool(self.used))
        @rule(data=st.data())
        def reused_token(self, data: st.DataObject) -> None:
            e.steps += 1
            self.refused(data.draw(st.sampled_from(self.used)), "used up")

        @rule(hours=st.integers(1, 24 * 30))
        def expired_token(self, hours: int) -> None:
            e.steps += 1
            now = dt.datetime.now(dt.UTC)
            token = create_token(e.fleet, ttl=dt.timedelta(hours=hours), now=now - dt.timedelta(hours=hours, seconds=2))
            self.refused(token, "expired")

        @rule(secret=st.binary(min_size=16, max_size=16))
        def forged_token(self, secret: bytes) -> None:
            e.steps += 1
            token = create_token(e.fleet)
            if secret.hex() == token.secret:
                return
            self.refused(replace(token, secret=secret.hex()), "not signed with the secret")

        @rule()
        def token_of_another_ca(self) -> None:
            e.steps += 1
            token = create_token(e.fleet)
            self.refused(replace(token, ca_hash=secrets.token_hex(32)), "CA|fleet")

        @rule(garbage=st.binary(min_size=1, max_size=500))
        def garbage_request(self, garbage: bytes) -> None:
            e.steps += 1

            async def send() -> bytes:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
                context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
                reader, writer = await asyncio.open_connection(*e.address, ssl=context)
                try:
                    await reader.readline()  # the greeting
                    writer.write(garbage.replace(b"\n", b" ") + b"\n")
                    await writer.drain()
                    reply = await reader.readline()
                    assert await reader.read() == b"", "the server kept the connection after its reply"
                    return reply
                finally:
                    writer.close()
                    await asyncio.gather(writer.wait_closed(), return_exceptions=True)

            reply = e.run(send())
            assert b'"ok": false' in reply or b'"ok":false' in reply, reply

        @invariant()
        def only_fresh_tokens_enrolled_anyone(self) -> None:
            assert e.server.joins == e.enrolled

        @invariant()
        def no_connection_is_left(self) -> None:
            async def settled() -> None:
                while e.server._handlers:
                    await asyncio.sleep(0.002)

            e.run(settled())

    return LiveEnrollment


def test_the_enrollment_endpoint_under_a_state_machine_of_joiners(enrollment: Enrollment) -> None:
    options = settings(max_examples=5, stateful_step_count=10, deadline=None, database=None)
    options = settings(options, suppress_health_check=list(HealthCheck))
    run_state_machine_as_test(machine(enrollment), settings=options)
    print(
        f"\nenrollment: {enrollment.steps} rule steps, {enrollment.enrolled} enrolled, "
        f"{enrollment.server.refusals} refused"
    )
    assert enrollment.enrolled and enrollment.server.refusals
