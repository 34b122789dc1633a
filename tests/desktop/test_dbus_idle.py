"""The D-Bus idle sources against a real dbus-daemon (issue 43, acceptance 2): small services exporting
GNOME's ``org.gnome.Mutter.IdleMonitor``, ``org.freedesktop.ScreenSaver`` and logind's session properties,
read through the sources as on a desktop."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from jeepney import HeaderFields, MessageType, new_error, new_method_return
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection

from agent.donor.idle import LogindSource, MutterSource, ScreenSaverSource, pick_source, platform_candidates

pytestmark = pytest.mark.desktop

Handler = Callable[[], tuple[str, tuple[Any, ...]]]
"""Answers one method: (signature, body)."""


@contextmanager
def service(address: str, name: str, methods: dict[tuple[str, str, str], Handler]) -> Iterator[None]:
    """Own ``name`` on the bus and answer ``methods`` ((path, interface, member) -> handler) until the block ends."""
    connection = open_dbus_connection(address)
    connection.send_and_get_reply(message_bus.RequestName(name), timeout=5)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                message = connection.receive(timeout=0.05)
            except TimeoutError:
                continue
            if message.header.message_type is not MessageType.method_call:
                continue
            fields = message.header.fields
            key = (fields[HeaderFields.path], fields.get(HeaderFields.interface), fields[HeaderFields.member])
            handler = methods.get(key)
            if handler is None:
                connection.send(new_error(message, "org.freedesktop.DBus.Error.UnknownMethod", "s", (str(key),)))
            else:
                connection.send(new_method_return(message, *handler()))

    thread = threading.Thread(target=serve, name=f"fake {name}")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)
        connection.close()


MUTTER = ("/org/gnome/Mutter/IdleMonitor/Core", "org.gnome.Mutter.IdleMonitor", "GetIdletime")
SCREENSAVER = ("/org/freedesktop/ScreenSaver", "org.freedesktop.ScreenSaver", "GetSessionIdleTime")
LOGIND = ("/org/freedesktop/login1/session/auto", "org.freedesktop.DBus.Properties", "GetAll")


def test_mutter_idle_monitor(session_bus: str) -> None:
    source = MutterSource(session_bus)
    assert source.problem() == "no org.gnome.Mutter.IdleMonitor on the session D-Bus"
    idle_ms = [61_250]
    with service(session_bus, "org.gnome.Mutter.IdleMonitor", {MUTTER: lambda: ("t", (idle_ms[0],))}):
        assert source.seconds_since_input() == 61.25
        idle_ms[0] = 40  # the user touched the mouse
        assert source.seconds_since_input() == 0.04
        assert source.problem() is None
    assert source.seconds_since_input() is None  # GNOME's shell went away: no reading, and why
    assert source.problem() == "no org.gnome.Mutter.IdleMonitor on the session D-Bus"
    source.close()


def test_freedesktop_screensaver_in_seconds_and_kde_milliseconds(session_bus: str) -> None:
    with service(session_bus, "org.freedesktop.ScreenSaver", {SCREENSAVER: lambda: ("u", (95,))}):
        seconds, kde = ScreenSaverSource(session_bus), ScreenSaverSource(session_bus, milliseconds=True)
        assert seconds.seconds_since_input() == 95.0
        assert kde.seconds_since_input() == 0.095
        seconds.close()
        kde.close()


def test_a_service_without_the_method_is_a_problem(session_bus: str) -> None:
    with service(session_bus, "org.freedesktop.ScreenSaver", {}):
        source = ScreenSaverSource(session_bus)
        problem = source.problem() or ""
        assert problem.startswith("org.freedesktop.ScreenSaver.GetSessionIdleTime failed: ")
        assert "UnknownMethod" in problem
        source.close()


def test_logind_idle_hint(session_bus: str) -> None:
    hint: dict[str, tuple[str, Any]] = {"IdleHint": ("b", True), "IdleSinceHintMonotonic": ("t", 40_000_000)}
    with service(session_bus, "org.freedesktop.login1", {LOGIND: lambda: ("a{sv}", (hint,))}):
        source = LogindSource(session_bus, clock=lambda: 100.0)  # the test's bus stands in for the system bus
        assert source.seconds_since_input() == 60.0
        hint["IdleHint"] = ("b", False)
        assert source.seconds_since_input() == 0.0  # in use now
        hint["IdleSinceHintMonotonic"] = ("t", 0)
        assert source.problem() == "the desktop never set logind's IdleHint for this session"
        source.close()


def test_pick_source_prefers_mutter_over_the_others(session_bus: str) -> None:
    gnome = {MUTTER: lambda: ("t", (5_000,))}
    kde = {SCREENSAVER: lambda: ("u", (7_000,))}
    env = {"DBUS_SESSION_BUS_ADDRESS": session_bus, "DBUS_SYSTEM_BUS_ADDRESS": session_bus}
    with service(session_bus, "org.freedesktop.ScreenSaver", kde):
        with service(session_bus, "org.gnome.Mutter.IdleMonitor", gnome):
            picked = pick_source(env, platform_candidates("linux"))
            assert picked is not None and picked.name == "gnome"
            assert picked.seconds_since_input() == 5.0
            assert isinstance(picked, MutterSource)
            picked.close()
        kde_env = {**env, "XDG_CURRENT_DESKTOP": "KDE"}
        picked = pick_source(kde_env, platform_candidates("linux"))
        assert picked is not None and picked.name == "screensaver"
        assert picked.seconds_since_input() == 7.0
        assert isinstance(picked, ScreenSaverSource)
        picked.close()
