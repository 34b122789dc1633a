"""Real desktop services that the idle sources read: an X server (Xvfb, with xdotool for input) and a private
D-Bus session bus (dbus-daemon) with small services standing in for GNOME's, KDE's and logind's. Each test
skips, saying what to install, where a program is missing (``make setup`` installs them as root)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.xvfb import xvfb


def need(program: str, package: str) -> str:
    """The path of ``program``, or a skip naming the Debian package that brings it."""
    path = shutil.which(program)
    if path is None:
        pytest.skip(f"{program} is not installed (Debian package {package}: apt-get install -y {package})")
    return path


@pytest.fixture
def x_display() -> Iterator[str]:
    """A fresh Xvfb server (``:N``, the number it picked itself), stopped after the test."""
    try:
        with xvfb(need("Xvfb", "xvfb")) as display:
            yield display
    except RuntimeError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def session_bus() -> Iterator[str]:
    """The address of a private dbus-daemon session bus, stopped after the test."""
    daemon = need("dbus-daemon", "dbus-daemon")
    bus = subprocess.Popen(
        [daemon, "--session", "--print-address=1", "--nofork", "--nopidfile"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert bus.stdout is not None
        address = bus.stdout.readline().strip()
        if not address:
            pytest.fail(f"dbus-daemon exited with {bus.wait(5)} before giving its address")
        yield address
    finally:
        bus.terminate()
        bus.wait(10)
