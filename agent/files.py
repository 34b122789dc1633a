"""The files of shoal's folders (the fleet folder, an identity, the documents an agent keeps): written whole or
not at all, read back as JSON objects, changed under the folder's lock; and moments as their JSON writes them.

Files are written atomically (temp file + ``os.replace``) so that a crash never leaves a half-written key,
certificate or document behind for the agent to choke on. A JSON file that several commands change (``shoal
fleet token`` while ``shoal fleet serve-enrollment`` redeems one) is read, changed and written back under
:func:`folder_lock`, so that neither loses the other's change. Every folder these serve is the fleet's or a
node's, so their trouble is a :class:`FleetError` naming the file.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from agent.errors import FleetError


def make_dir(folder: Path) -> None:
    """Create ``folder`` (and its parents), private to its owner where the OS honours modes."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise FleetError(f"cannot create {folder}: {exc}") from exc


def write_atomic(path: Path, data: bytes, private: bool) -> None:
    """Write ``data`` to ``path`` via a temp file in the same folder and ``os.replace``."""
    try:
        # mkstemp creates the file 0600 from the start, so a private key is never readable by
        # others, not even for the moment between creation and chmod.
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        raise FleetError(f"cannot write {path}: {exc}") from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if not private:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise FleetError(f"cannot write {path}: {exc}") from exc
        raise


def write_json(path: Path, doc: object, private: bool) -> None:
    """Write ``doc`` as indented JSON with :func:`write_atomic`."""
    write_atomic(path, (json.dumps(doc, indent=1) + "\n").encode(), private=private)


def read_json(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``, None if there is no such file; :class:`FleetError` if it is not one."""
    try:
        doc = json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise FleetError(f"cannot read {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise FleetError(f"{path} is malformed (not a JSON object)")
    return doc


def utc_iso(when: dt.datetime) -> str:
    """``2025-01-31T12:00:00Z``: how the fleet's JSON files write a moment (seconds, UTC)."""
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_utc(text: str, where: object) -> dt.datetime:
    """The moment :func:`utc_iso` wrote; :class:`FleetError` naming ``where`` if it is not one."""
    try:
        when = dt.datetime.fromisoformat(text)
    except ValueError as exc:
        raise FleetError(f"{where} is malformed (bad time {text!r})") from exc
    if when.tzinfo is None:
        raise FleetError(f"{where} is malformed (time {text!r} has no time zone)")
    return when.astimezone(dt.UTC)


LOCK_TIMEOUT = 10.0
"""Seconds to wait for a folder's lock (holders keep it for milliseconds)."""
STALE_LOCK = 60.0
"""A lock file older than this was left by a process that died while holding it."""


LOCK_NAME = ".lock"
"""The lock file's name inside the folder it guards."""


@contextlib.contextmanager
def folder_lock(folder: Path, timeout: float = LOCK_TIMEOUT) -> Iterator[None]:
    """Hold ``<folder>/.lock`` (an exclusively created file: works across processes, on every OS) while a
    JSON file of the folder is read, changed and written back. It blocks: call it off the event loop."""
    path = Path(folder) / LOCK_NAME
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            break
        except FileExistsError:
            with contextlib.suppress(OSError):
                if time.time() - path.stat().st_mtime > STALE_LOCK:
                    path.unlink()
                    continue
            if time.monotonic() > deadline:
                raise FleetError(
                    f"{path} is held by another shoal command; if none is running, remove that file"
                ) from None
            time.sleep(0.01)
        except OSError as exc:
            raise FleetError(f"cannot lock {path}: {exc}") from exc
    try:
        with contextlib.suppress(OSError):
            os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        yield
    finally:
        path.unlink(missing_ok=True)
