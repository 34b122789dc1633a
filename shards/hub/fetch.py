"""Fetch stage shards from the Hugging Face Hub or an office mirror, each file checked against the manifest.

An agent downloads only what it needs (:class:`ShardRequest`): the files of the stages it serves and, when it
heads chats, the tokenizer with its chat-template files and the draft graph; always ``manifest.json``, which
lists them all with their size and sha256. The revision is pinned to a commit, so every agent gets the same
bytes, and a fetch of a commit already in the cache needs no network.

huggingface_hub brings the manifest into its cache (the shared Hugging Face cache, or the agent's own cache
folder), and its ``http_get`` moves each wanted file, ``max_workers`` at a time, into the same commit's
snapshot folder. A transfer that fails leaves its partial file behind (``shoal-partial/`` beside the cache's
own folders of the repository), and the next fetch resumes it with an HTTP ``Range`` where it stopped, to
within huggingface_hub's 10 MB chunk: huggingface_hub's own downloads delete their partial file on failure, so
a mirror that drops out mid-file would otherwise cost the whole file again. Within one transfer, huggingface_hub
itself resumes a dropped connection a few times. Files already complete are kept and not fetched again. The
endpoint is the Hub, or an office mirror given by ``HF_ENDPOINT`` (read at each call) or the ``endpoint``
argument. When it cannot be reached, the fetch is served from the cache alone. huggingface_hub's shared HTTP
client is kept usable across its own retries (``shards.hub.http_client``).

Nothing is handed out unchecked: every file's size and sha256 are compared with the manifest before
:func:`fetch_shards` returns. A bad file is deleted (the snapshot's link and the blob it points to) and
fetched once more; if it is still bad, :class:`~agent.errors.IntegrityError` names it, and the bad copy is
not left in the cache. Every call blocks (downloads, hashing): the agent runs it in an executor.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from filelock import FileLock
from huggingface_hub import HfApi, hf_hub_download, hf_hub_url
from huggingface_hub import constants as hf_constants
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get, repo_folder_name
from huggingface_hub.utils import build_hf_headers
from tqdm.auto import tqdm

from agent.errors import ConfigError, IntegrityError, ManifestError, ShoalError, SourceError
from shards.hub.http_client import keep_client_usable
from shards.manifest import MANIFEST_NAME, FileEntry, Manifest, sha256_file

log = logging.getLogger(__name__)

Progress = Callable[[int, int], None]
"""Told ``(bytes done, bytes in all)`` of the requested files as they arrive, from download threads: keep it
quick (hand the numbers to the event loop, for example). Files already in the cache count as done."""

COMMIT = re.compile(r"^[0-9a-f]{40}$")
PROBE_TIMEOUT = 10.0
"""Seconds to wait for the endpoint's answer to the first request before fetching from the cache alone."""
_TRANSFER_ERRORS = (OSError, httpx.HTTPError, EntryNotFoundError, RuntimeError)
"""What huggingface_hub raises when a transfer fails: RuntimeError is httpx refusing a client that was closed
(``shards.hub.http_client`` keeps the shared one usable; a client of the caller's own may still be closed)."""


@dataclass(frozen=True)
class ShardRequest:
    """What one agent fetches of a published export."""

    repo_id: str
    revision: str
    """The commit (40 hex digits) the fleet document pins: a branch name would let agents disagree."""
    stages: tuple[int, ...] = ()
    """Indexes of the stages whose files are wanted."""
    head: bool = False
    """Also the files a head needs: the tokenizer and chat-template files, and the draft graph if any."""

    def __post_init__(self) -> None:
        if not COMMIT.match(self.revision):
            raise ConfigError(f"{self.repo_id}: revision must be a commit (40 hex digits), not {self.revision!r}")
        object.__setattr__(self, "stages", tuple(int(i) for i in self.stages))
        if any(i < 0 for i in self.stages):
            raise ConfigError(f"{self.repo_id}: stage indexes cannot be negative: {self.stages}")


def wanted_files(manifest: Manifest, request: ShardRequest) -> list[FileEntry]:
    """The manifest's entries for what ``request`` asks: its stages' files, then (head) the tokenizer files and
    the draft graph's. Each path once, in that order."""
    for index in request.stages:
        if index >= len(manifest.stages):
            raise ManifestError(f"the export has {len(manifest.stages)} stages; there is no stage {index}")
    entries = [f for i in sorted(set(request.stages)) for f in manifest.stages[i].files]
    if request.head:
        entries += manifest.tokenizer_files
        if manifest.draft is not None:
            entries += manifest.draft.graph.files
    unique: dict[str, FileEntry] = {}
    for entry in entries:
        unique.setdefault(entry.path, entry)
    return list(unique.values())


def fetch_manifest(
    repo_id: str,
    revision: str,
    *,
    cache_dir: Path | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
    timeout: float = PROBE_TIMEOUT,
) -> Manifest:
    """The manifest of ``repo_id`` at commit ``revision``: from the cache if there (a commit never changes, so
    no request is made), else downloaded alone. SourceError when it can be neither."""
    return _Fetch(ShardRequest(repo_id, revision), cache_dir, endpoint, token, timeout).manifest()[0]


def fetch_shards(
    request: ShardRequest,
    *,
    cache_dir: Path | None = None,
    endpoint: str | None = None,
    token: str | bool | None = None,
    progress: Progress | None = None,
    progress_bar: bool = False,
    max_workers: int = 4,
    timeout: float = PROBE_TIMEOUT,
) -> Path:
    """Download what ``request`` asks into the cache, check every file, and return the snapshot folder.

    The folder is laid out as an export folder holding only the requested files and the manifest
    (``Manifest.load`` reads it, ``CompiledStage`` compiles a requested stage from it); files of other
    requests of the same commit may sit beside them. ``cache_dir``: None for the shared Hugging Face cache
    (``HF_HUB_CACHE``). ``endpoint``: None for ``HF_ENDPOINT``, else the Hub. ``progress``: see
    :data:`Progress`; ``progress_bar`` shows a tqdm bar (for a command line). ``timeout``: seconds the endpoint
    has to answer before the cache alone is used.

    The endpoint is asked only when the cache lacks something: a request the cache already holds is checked
    and served without a single request, so a restart does not wait on a mirror that is down.

    Raises IntegrityError when a file is still wrong after fetching it again (the message names its path in
    the repository with the expected and the actual sha256), SourceError when the repository or commit does
    not exist or a file can neither be downloaded nor found in the cache, ManifestError for a stage the export
    does not have.
    """
    return _Fetch(request, cache_dir, endpoint, token, timeout).shards(progress, progress_bar, max_workers)


class _Fetch:
    """One fetch of a request: the client calls, their errors in shoal's words, and the checks."""

    def __init__(
        self,
        request: ShardRequest,
        cache_dir: Path | None,
        endpoint: str | None,
        token: str | bool | None,
        timeout: float,
    ) -> None:
        keep_client_usable()
        self.request = request
        self.repo_id, self.revision = request.repo_id, request.revision
        self.cache_dir = str(cache_dir) if cache_dir is not None else None
        # read at each call: huggingface_hub reads HF_ENDPOINT once, when it is imported
        self.endpoint = endpoint or os.environ.get("HF_ENDPOINT") or None
        self.token = token
        self.timeout = timeout
        self.where = f"{self.repo_id}@{self.revision[:12]}"
        self.endpoint_name = self.endpoint or hf_constants.ENDPOINT
        self.cache_name = self.cache_dir or hf_constants.HF_HUB_CACHE
        self._online: bool | None = None
        self.offline_reason = ""
        """Why the endpoint is not used, for messages: 'cannot be reached (...)', 'answered 503'."""

    # -- the whole fetch -----------------------------------------------------------------------
    def shards(self, callback: Progress | None, progress_bar: bool, max_workers: int) -> Path:
        started = time.monotonic()
        manifest, folder = self.manifest()
        files = wanted_files(manifest, self.request)
        total = sum(f.size for f in files)
        # present with the right size: the hash is checked below, once, for every file
        cached = [f for f in files if (folder / f.path).is_file() and (folder / f.path).stat().st_size == f.size]
        log.info(
            "fetching %s: stages %s%s, %d files, %.1f MB (%.1f MB in the cache)",
            self.where,
            list(self.request.stages),
            " and the head's files" if self.request.head else "",
            len(files),
            total / 1e6,
            sum(f.size for f in cached) / 1e6,
        )
        with _Bytes(total, sum(f.size for f in cached), callback, progress_bar, f"fetch {self.repo_id}") as counter:
            self.check_all(folder, files, counter, progress_bar, max_workers)
            counter.finish()
        log.info("fetched %s: %d files checked in %.1f s", self.where, len(files), time.monotonic() - started)
        return folder

    def online(self) -> bool:
        """Whether the endpoint answers for this commit; asked once, when first needed."""
        if self._online is None:
            self._online = self._probe()
        return self._online

    def _probe(self) -> bool:
        try:
            HfApi(endpoint=self.endpoint, token=self.token).repo_info(
                self.repo_id, revision=self.revision, repo_type="model", timeout=self.timeout
            )
        except (httpx.TransportError, OfflineModeIsEnabled, RuntimeError) as exc:
            self.offline_reason = f"cannot be reached ({_describe(exc)})"
        except HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else None
            if status in (401, 403, 404) or isinstance(exc, EntryNotFoundError):
                raise self.source_error(exc, "the repository") from exc
            # a Hub or mirror that is down answers 5xx (or 429 when it sheds load): the cache may hold the rest
            self.offline_reason = f"answered {status}"
        else:
            return True
        log.warning("%s %s: fetching %s from the cache alone", self.endpoint_name, self.offline_reason, self.where)
        return False

    def manifest(self) -> tuple[Manifest, Path]:
        """The manifest and the snapshot folder holding it: from the cache (a cached copy that does not parse is
        deleted), else downloaded."""
        with contextlib.suppress(SourceError):
            path = self.download(MANIFEST_NAME, local_only=True)
            try:
                return Manifest.load(path.parent), path.parent
            except ManifestError as exc:
                log.warning("%s: %s is unreadable (%s): deleted, fetching it again", self.where, path, exc)
                _evict(path)
        if not self.online():
            raise SourceError(
                f"{self.where}: {MANIFEST_NAME} is not in the cache ({self.cache_name}) and "
                f"{self.endpoint_name} {self.offline_reason}"
            )
        path = self.download(MANIFEST_NAME)
        return Manifest.load(path.parent), path.parent

    # -- downloads -----------------------------------------------------------------------------
    def download(self, filename: str, *, local_only: bool = False) -> Path:
        """One small file of the commit (the manifest) through huggingface_hub's cache; the stages' files go
        through :meth:`download_resumable`."""
        try:
            path = hf_hub_download(
                self.repo_id,
                filename,
                **self._where_args(),
                local_files_only=local_only,
                etag_timeout=self.timeout,
            )
        except (*_TRANSFER_ERRORS, ValueError) as exc:
            raise self.source_error(exc, filename) from exc
        return Path(str(path))

    def _where_args(self) -> dict[str, Any]:
        """What both huggingface_hub calls are told of the repository: which commit, which cache, which Hub."""
        return {
            "repo_type": "model",
            "revision": self.revision,
            "cache_dir": self.cache_dir,
            "endpoint": self.endpoint,
            "token": self.token,
        }

    def source_error(self, exc: Exception, what: str) -> ShoalError:
        """The client's error for ``what`` (a file, or the repository) as one of shoal's."""
        if isinstance(exc, LocalEntryNotFoundError):
            return SourceError(
                f"{self.where}: {what} is not in the cache ({self.cache_name}) and {self.endpoint_name} "
                f"{self.offline_reason or 'cannot be reached'}"
            )
        if isinstance(exc, RevisionNotFoundError):
            return SourceError(f"{self.repo_id}: {self.endpoint_name} has no commit {self.revision}")
        if isinstance(exc, RepositoryNotFoundError):
            return SourceError(
                f"{self.repo_id}: no such repository on {self.endpoint_name} (or it is private: set HF_TOKEN)"
            )
        if what == "the repository":
            # olah answers 404 EntryNotFound for a repository it does not hold
            return SourceError(
                f"{self.repo_id}: {self.endpoint_name} holds no such repository, or no commit {self.revision} in it"
            )
        if isinstance(exc, EntryNotFoundError):
            if what == MANIFEST_NAME:
                return ManifestError(f"{self.where}: no {MANIFEST_NAME} (not a published shoal export)")
            return IntegrityError(f"{self.where}: {what} is listed in {MANIFEST_NAME} but not in the repository")
        # huggingface_hub's ValueError (a download that failed its own checks) has the reason as its cause
        return SourceError(f"{self.where}: cannot download {what} from {self.endpoint_name} ({exc.__cause__ or exc})")

    # -- checks --------------------------------------------------------------------------------
    def check_all(self, folder: Path, files: list[FileEntry], counter: _Bytes, bar: bool, max_workers: int) -> None:
        """Every wanted file against the manifest: a bad one is deleted, and what is missing then is downloaded
        (``max_workers`` files at a time) and checked; a file still bad after a second download is refused."""
        missing: list[FileEntry] = []
        with tqdm(total=counter.total, unit="B", unit_scale=True, desc="check", leave=False, disable=not bar) as shown:
            for entry in files:
                problem = _problem(folder / entry.path, entry)
                if problem is not None and problem != _MISSING:
                    log.warning("%s: %s %s: deleted, fetching it again", self.where, entry.path, problem)
                    _evict(folder / entry.path)
                    counter.add(-entry.size)
                    if not self.online():
                        raise IntegrityError(
                            f"{self.where}: {entry.path} {problem}; the bad copy was deleted, and it cannot be "
                            f"fetched again: {self.endpoint_name} {self.offline_reason}"
                        )
                if problem is not None:
                    missing.append(entry)
                shown.update(entry.size)
        if missing and not self.online():
            raise SourceError(
                f"{self.where}: {self.endpoint_name} {self.offline_reason} and the cache ({self.cache_name}) lacks "
                f"{len(missing)} of the requested files: {', '.join(e.path for e in missing)}"
            )
        with ThreadPoolExecutor(max_workers, thread_name_prefix="shoal-fetch") as pool:
            # every download runs to its end (a failure keeps its partial file for the next try); the first
            # failure is raised after
            for done in [pool.submit(self.fetch_checked, entry, folder, counter) for entry in missing]:
                done.result()

    def fetch_checked(self, entry: FileEntry, folder: Path, counter: _Bytes) -> None:
        """Download one file and check it; one that fails its check is downloaded once more from its start, then
        refused (the bad copy is not kept)."""
        for attempt in (1, 2):
            problem = self.download_resumable(entry, folder / entry.path, counter)
            if problem is None:
                if attempt == 2:
                    log.info("%s: %s fetched again and checked", self.where, entry.path)
                return
            if attempt == 1:
                log.warning("%s: %s %s: deleted, fetching it again", self.where, entry.path, problem)
                counter.add(-entry.size)
        raise IntegrityError(
            f"{self.where}: {entry.path} {problem} (fetched twice from {self.endpoint_name}; the bad copy was deleted)"
        )

    def download_resumable(self, entry: FileEntry, destination: Path, counter: _Bytes) -> str | None:
        """Download ``entry`` into a partial file that outlives a failed transfer, so that the next try resumes it
        with an HTTP ``Range`` where this one stopped (huggingface_hub's own downloads start again from zero: it
        deletes its partial file on failure). The whole file is checked against the manifest: if it passes, it
        is moved to ``destination`` (None returned); if not, it is deleted and what is wrong returned."""
        partial = self.partials / f"{entry.sha256}.incomplete"
        partial.parent.mkdir(parents=True, exist_ok=True)
        url = hf_hub_url(self.repo_id, entry.path, revision=self.revision, endpoint=self.endpoint)
        # one writer per partial file: two agents sharing a cache must not append to the same one
        with FileLock(f"{partial}.lock"), partial.open("ab") as out:
            have = out.tell()
            if have > entry.size:
                out.truncate(0)
                have = 0
            if have:
                log.info("%s: resuming %s at %d of %d bytes", self.where, entry.path, have, entry.size)
                counter.add(have)
            try:
                http_get(
                    url,
                    out,
                    resume_size=have,
                    headers=build_hf_headers(token=self.token),
                    expected_size=entry.size,
                    displayed_filename=entry.path,
                    tqdm_class=counter.tqdm_class(),
                )
            except (*_TRANSFER_ERRORS, HfHubHTTPError) as exc:
                raise self.source_error(exc, entry.path) from exc
        problem = _problem(partial, entry)
        if problem is not None:
            partial.unlink(missing_ok=True)
            return problem
        destination.parent.mkdir(parents=True, exist_ok=True)
        _evict(destination)
        os.replace(partial, destination)
        return None

    @property
    def partials(self) -> Path:
        """Where this repository's unfinished downloads wait (beside huggingface_hub's own folders of it)."""
        return Path(self.cache_name) / repo_folder_name(repo_id=self.repo_id, repo_type="model") / "shoal-partial"


_MISSING = "missing"


def _problem(path: Path, entry: FileEntry) -> str | None:
    """What is wrong with the file at ``path`` against its manifest entry (None: nothing)."""
    if not path.is_file():
        return _MISSING
    size = path.stat().st_size
    actual = sha256_file(path)
    if size != entry.size or actual != entry.sha256:
        return f"sha256 {actual} ({size} bytes) does not match the manifest's {entry.sha256} ({entry.size} bytes)"
    return None


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0]


def _evict(path: Path) -> None:
    """Delete a cached file: the snapshot's link and the blob it points to (or the file, in a cache without
    links). Another snapshot linking the same blob fetches it again when it next needs it."""
    if path.is_symlink():
        blob = path.resolve()
        path.unlink(missing_ok=True)
        blob.unlink(missing_ok=True)
    else:
        path.unlink(missing_ok=True)


class _Bytes:
    """Bytes of the requested files on disk so far: told to the callback and shown on the bar."""

    def __init__(self, total: int, done: int, callback: Progress | None, bar: bool, desc: str) -> None:
        self.total = total
        self.done = min(done, total)
        self._callback = callback
        self._lock = threading.Lock()
        self._bar = tqdm(total=total, initial=self.done, unit="B", unit_scale=True, desc=desc, disable=not bar)
        self._tell()

    def __enter__(self) -> _Bytes:
        return self

    def __exit__(self, *exc: object) -> None:
        self._bar.close()

    def add(self, n: int) -> None:
        # under the lock: download threads report concurrently, and the callback sees a steady count
        with self._lock:
            before = self.done
            self.done = max(0, min(self.total, self.done + n))
            self._bar.update(self.done - before)
            self._tell()

    def finish(self) -> None:
        self.add(self.total)

    def _tell(self) -> None:
        if self._callback is not None:
            self._callback(self.done, self.total)

    def tqdm_class(self) -> type[tqdm]:
        """A tqdm class for huggingface_hub: its byte bars stay hidden and feed this count instead."""
        counter = self

        class _Feed(tqdm):
            def __init__(self, *args: Any, **kwargs: Any) -> None:
                # snapshot_download makes one byte bar ("B") and one bar of files; only bytes count
                self._counts = kwargs.get("unit") == "B"
                kwargs["disable"] = True
                kwargs.pop("name", None)
                super().__init__(*args, **kwargs)

            def update(self, n: float | None = 1) -> bool | None:
                if self._counts and n:
                    counter.add(int(n))
                return None

        return _Feed
