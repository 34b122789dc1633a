"""One method call at a time on a D-Bus bus, through jeepney's blocking connection (pure Python), for the idle
sources that ask a desktop service (``gnome``, ``screensaver``, ``logind``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.donor.idle.base import PolledSource
from agent.errors import IdleSourceError

CALL_TIMEOUT = 1.0
"""Seconds a call waits for its answer: a desktop service answers in milliseconds."""
SYSTEM_BUS = "unix:path=/var/run/dbus/system_bus_socket"
"""The system bus where ``DBUS_SYSTEM_BUS_ADDRESS`` is not set (the D-Bus specification's default)."""


def session_bus(env: Mapping[str, str]) -> str | None:
    """The session bus's address, or None outside a desktop session."""
    return env.get("DBUS_SESSION_BUS_ADDRESS") or None


def system_bus(env: Mapping[str, str]) -> str:
    """The system bus's address."""
    return env.get("DBUS_SYSTEM_BUS_ADDRESS") or SYSTEM_BUS


class BusSource(PolledSource):
    """A source that calls one method of one service; ``address`` None: no such bus here."""

    bus_name = "session"
    service = ""
    """The well-known name called (a missing service is this source's usual problem)."""

    def __init__(self, address: str | None) -> None:
        super().__init__()
        self.address = address
        self._connection: Any = None

    def call(self, path: str, interface: str, method: str, signature: str = "", body: tuple[Any, ...] = ()) -> Any:
        """The body of the reply to ``method``; :class:`IdleSourceError` saying why where there is none."""
        if self.address is None:
            raise IdleSourceError(f"no {self.bus_name} D-Bus here (DBUS_SESSION_BUS_ADDRESS is not set)")
        try:
            from jeepney import DBusAddress, new_method_call
            from jeepney.io.blocking import open_dbus_connection
            from jeepney.wrappers import DBusErrorResponse, unwrap_msg
        except ImportError as exc:
            raise IdleSourceError("jeepney is not installed (pip install jeepney)") from exc
        try:
            if self._connection is None:
                self._connection = open_dbus_connection(self.address)
            message = new_method_call(DBusAddress(path, self.service, interface), method, signature, body)
            return unwrap_msg(self._connection.send_and_get_reply(message, timeout=CALL_TIMEOUT))
        except DBusErrorResponse as exc:
            if exc.name == "org.freedesktop.DBus.Error.ServiceUnknown":
                raise IdleSourceError(f"no {self.service} on the {self.bus_name} D-Bus") from exc
            raise IdleSourceError(f"{self.service}.{method} failed: {exc}") from exc
        except (OSError, RuntimeError, ValueError, KeyError) as exc:  # no bus, a refused or broken connection
            raise IdleSourceError(f"cannot reach the {self.bus_name} D-Bus at {self.address}: {exc}") from exc

    def _close(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            connection.close()
