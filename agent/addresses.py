"""``HOST:PORT``, as shoal's flags, settings and join tokens write an address: one parser and its inverse."""

from __future__ import annotations

from agent.errors import ConfigError


def parse_address(
    text: str, *, default_port: int | None = None, any_port: bool = True, empty_host: str | None = "127.0.0.1"
) -> tuple[str, int]:
    """``HOST:PORT`` (IPv6 as ``[::1]:PORT``) -> (host, port); :class:`ConfigError` saying the form otherwise.

    ``default_port``: the port of a bare ``HOST`` (none: a port is required); ``any_port``: port 0 (any free
    port) is allowed, as where one listens; ``empty_host``: the host of ``:PORT`` (None: a host is required)."""
    text = text.strip()
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ConfigError(f"address {text!r} is not HOST:PORT")
        port_text = rest[1:] if rest else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    elif ":" not in text:
        host, port_text = text, ""
    else:  # a bare IPv6 address: no way to tell a port from its last group
        raise ConfigError(f"address {text!r} is not HOST:PORT: write an IPv6 address as [ADDR]:PORT")
    if not port_text and default_port is not None:
        port_text = str(default_port)
    host = host or empty_host or ""
    if not host or not port_text.isdigit() or not (0 if any_port else 1) <= int(port_text) < 65536:
        raise ConfigError(f"address {text!r} is not HOST:PORT")
    return host, int(port_text)


def format_address(address: tuple[str, int]) -> str:
    """(host, port) -> ``HOST:PORT``, an IPv6 host in brackets: what :func:`parse_address` reads back."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
