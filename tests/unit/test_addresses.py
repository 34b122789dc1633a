"""One parser for ``HOST:PORT`` (issue 42 §4): the agent's settings and flags, and a join token's address."""

from __future__ import annotations

import pytest

from agent.addresses import format_address, parse_address
from agent.errors import ConfigError


@pytest.mark.parametrize("address", [("10.0.0.2", 7300), ("fd00::2", 7301), ("pc-1.office", 0)])
def test_what_format_writes_parse_reads_back(address: tuple[str, int]) -> None:
    assert parse_address(format_address(address)) == address


def test_a_setting_may_leave_out_its_host_and_name_any_port_a_token_may_not() -> None:
    assert parse_address(":7000") == ("127.0.0.1", 7000)
    assert parse_address("0.0.0.0:0") == ("0.0.0.0", 0)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_address(":7000", empty_host=None)
    with pytest.raises(ConfigError, match="HOST:PORT"):
        parse_address("host:0", any_port=False)


def test_a_bare_ipv6_address_is_refused_saying_how_to_write_it() -> None:
    with pytest.raises(ConfigError, match=r"write an IPv6 address as \[ADDR\]:PORT"):
        parse_address("fd00::1:7300")
