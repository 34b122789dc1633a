"""A fresh Xvfb X server for tests of the donor's X11 idle source (Debian package ``xvfb``); xdotool (``xdotool``)
makes real input events on it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def xvfb(program: str = "Xvfb") -> Iterator[str]:
    """Start an Xvfb server on a display number it picks itself (``-displayfd``), yield ``:N``, stop it after.
    ``RuntimeError`` if it exits before giving its display."""
    read, write = os.pipe()
    server = subprocess.Popen(
        [program, "-displayfd", str(write), "-nolisten", "tcp", "-screen", "0", "320x240x24"],
        pass_fds=(write,),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.close(write)
    try:
        with os.fdopen(read) as pipe:
            number = pipe.readline().strip()  # written once the server accepts connections
        if not number:
            raise RuntimeError(f"Xvfb exited with {server.wait(5)} before giving its display")
        yield f":{number}"
    finally:
        server.terminate()
        server.wait(10)


def press_key(display: str, key: str = "shift") -> None:
    """A real key press on ``display`` (an XTEST event: the X server's idle count starts again)."""
    xdotool = shutil.which("xdotool")
    if xdotool is None:
        raise RuntimeError("xdotool is not installed (Debian package xdotool)")
    subprocess.run([xdotool, "key", key], env={"DISPLAY": display}, check=True, timeout=10)
