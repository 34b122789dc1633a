"""Publish an export: to the Hugging Face Hub, or as a git repository that an office mirror serves.

Either way the repository holds exactly the export's layout: ``manifest.json`` and ``tokenizer/`` at the
root, one folder per stage (and ``draft/``), and nothing the manifest does not list. Agents then fetch only
their own files from it (``shards.hub.fetch``), pinned to the commit these functions return.
"""

from __future__ import annotations

import glob
import logging
import os
import re
import subprocess
import time
from pathlib import Path

from huggingface_hub import HfApi

from agent.errors import ConfigError, ExportError
from shards.manifest import MANIFEST_NAME, Manifest

log = logging.getLogger(__name__)

MIRROR_BRANCH = "main"
"""The branch a mirror server serves (olah serves ``main`` of each local repository)."""

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_GIT_IDENTITY = {
    # commits need an author; a fixed one keeps publishing free of the machine's git configuration
    "GIT_AUTHOR_NAME": "shoal",
    "GIT_AUTHOR_EMAIL": "shoal@localhost",
    "GIT_COMMITTER_NAME": "shoal",
    "GIT_COMMITTER_EMAIL": "shoal@localhost",
}


def export_paths(manifest: Manifest) -> list[str]:
    """Every path a published repository holds: the manifest's files, then ``manifest.json`` itself."""
    return [f.path for f in manifest.all_files()] + [MANIFEST_NAME]


def publish_to_hub(
    export_dir: Path,
    repo_id: str,
    *,
    api: HfApi | None = None,
    revision: str | None = None,
    private: bool = True,
    progress: bool = True,
    verify: bool = True,
) -> str:
    """Upload the export in ``export_dir`` to the Hub repository ``repo_id`` (created if missing, ``private``
    then) in one commit on branch ``revision`` (None: the default branch); returns that commit's sha.

    The export is checked against its manifest first (``verify``; ``progress`` shows that check's bar). Only
    the files the manifest lists and the manifest itself are uploaded: leftovers in the folder stay home.
    Files of an earlier export that this one does not list stay in the repository, unread by any fetch.
    ``api``: the client to use (tests inject one); by default ``HfApi()``, which reads ``HF_ENDPOINT`` and
    ``HF_TOKEN``.
    """
    export_dir = Path(export_dir)
    manifest = _checked(export_dir, verify, progress)
    api = api or HfApi()
    api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
    if revision is not None:
        # upload_folder commits only to an existing branch
        api.create_branch(repo_id, branch=revision, repo_type="model", exist_ok=True)
    paths = export_paths(manifest)
    started = time.monotonic()
    info = api.upload_folder(
        repo_id=repo_id,
        folder_path=export_dir,
        repo_type="model",
        revision=revision,
        # exact paths, escaped: a pattern per file keeps the upload to what the manifest lists
        allow_patterns=[glob.escape(p) for p in paths],
        commit_message=_commit_message(manifest),
    )
    sha = str(info.oid)
    log.info(
        "published %s to the Hub as %s@%s: %d files in %.1f s",
        export_dir,
        repo_id,
        sha[:12],
        len(paths),
        time.monotonic() - started,
    )
    return sha


def mirror_repo_path(mirror_root: Path, repo_id: str) -> Path:
    """Where a mirror keeps ``repo_id`` (``ORG/NAME``): ``mirror_root/models/ORG/NAME``, olah's layout."""
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_NAME.match(p) and ".." not in p for p in parts):
        raise ConfigError(f"a mirror repository id is ORG/NAME (letters, digits, '.', '_', '-'), not {repo_id!r}")
    return Path(mirror_root) / "models" / parts[0] / parts[1]


def publish_to_mirror(
    export_dir: Path, mirror_root: Path, repo_id: str, *, verify: bool = True, progress: bool = False
) -> str:
    """Commit the export in ``export_dir`` to the bare git repository ``mirror_root/models/ORG/NAME`` (made if
    missing), on branch ``main``; returns the commit's sha, the revision agents pin.

    A mirror server in offline mode (olah with ``mirrors-path = [mirror_root]``) serves that repository to the
    Hugging Face client as if it were on the Hub. Each publish that changes anything adds one commit whose tree
    is exactly the manifest's files and ``manifest.json`` (a file dropped from the export leaves the tree);
    publishing an unchanged export adds none and returns the current commit. Files are plain git blobs, stored
    uncompressed (weights barely compress): olah serves plain blobs, and serves LFS only from a working tree's
    ``.git/lfs``, so LFS would buy nothing here. The export is checked against its manifest first (``verify``).
    """
    export_dir = Path(export_dir).resolve()
    manifest = _checked(export_dir, verify, progress)
    git_dir = mirror_repo_path(mirror_root, repo_id)
    started = time.monotonic()
    if not (git_dir / "HEAD").is_file():
        git_dir.mkdir(parents=True, exist_ok=True)
        _git(git_dir, "init", "--quiet", "--bare", f"--initial-branch={MIRROR_BRANCH}")
    # A private index per publish, over the export folder as work tree: nothing is copied, and the tree holds
    # exactly the paths listed (a persistent index would keep files an earlier export had)
    index = git_dir / f"shoal-publish-{os.getpid()}.index"
    env = {"GIT_INDEX_FILE": str(index), "GIT_WORK_TREE": str(export_dir), "GIT_LITERAL_PATHSPECS": "1"}
    # stored uncompressed: weights barely compress, and zlib would make a publish several times slower
    store = {"GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "core.compression", "GIT_CONFIG_VALUE_0": "0"}
    ref = f"refs/heads/{MIRROR_BRANCH}"
    try:
        _git(
            git_dir,
            "add",
            "--force",  # an export folder's .gitignore (if any) must not drop listed files
            "--pathspec-from-file=-",
            "--pathspec-file-nul",
            env={**env, **store},
            stdin="\0".join(export_paths(manifest)),
        )
        tree = _git(git_dir, "write-tree", env=env)
    finally:
        index.unlink(missing_ok=True)
    parent = _git(git_dir, "rev-parse", "--quiet", "--verify", f"{ref}^{{commit}}", check=False) or None
    if parent is not None and _git(git_dir, "rev-parse", f"{parent}^{{tree}}") == tree:
        log.info("published %s to mirror %s: unchanged, still %s", export_dir, git_dir, parent[:12])
        return parent
    commit = _git(git_dir, "commit-tree", tree, *(["-p", parent] if parent else []), "-m", _commit_message(manifest))
    # compare-and-swap against the parent read above: a concurrent publish fails instead of being lost
    _git(git_dir, "update-ref", ref, commit, parent or "")
    log.info(
        "published %s to mirror %s as %s: %d files in %.1f s",
        export_dir,
        git_dir,
        commit[:12],
        len(manifest.all_files()) + 1,
        time.monotonic() - started,
    )
    return commit


def _checked(export_dir: Path, verify: bool, progress: bool) -> Manifest:
    manifest = Manifest.load(export_dir)
    if verify:
        manifest.verify(export_dir, progress=progress)
    return manifest


def _commit_message(manifest: Manifest) -> str:
    return (
        f"shoal export {manifest.export_id}: {manifest.source.id}, {manifest.weights}, "
        f"{len(manifest.stages)} stages{', with a draft' if manifest.draft else ''}"
    )


def _git(
    git_dir: Path,
    *args: str,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    check: bool = True,
) -> str:
    """Run ``git`` on ``git_dir``; returns its stripped stdout. A failure is an ExportError with git's words."""
    argv = ["git", f"--git-dir={git_dir}", *args]
    full_env = {**os.environ, **_GIT_IDENTITY, **(env or {})}
    try:
        result = subprocess.run(
            argv, input=stdin, capture_output=True, encoding="utf-8", errors="replace", env=full_env, check=False
        )
    except FileNotFoundError as exc:
        raise ExportError("publishing to a mirror needs the git command, which is not installed") from exc
    if check and result.returncode != 0:
        raise ExportError(f"git {args[0]} failed in {git_dir}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout.strip()
