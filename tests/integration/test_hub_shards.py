"""Stage shards through a real Hugging Face mirror (olah) and the real huggingface_hub client (issue 24).

One olah server serves the module: the int4 3-stage export of the session (it carries a self-draft) is
published into it as a git repository, then a second commit where one byte of a stage file was changed and
the manifest kept its hash, as a tampered or broken mirror would serve. Every fetch gets a cache folder of its
own, so what arrived is exactly what that fetch asked for.
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from huggingface_hub import CommitInfo
from huggingface_hub.utils import filter_repo_objects

from agent.errors import IntegrityError, SourceError
from agent.node.shard_source import ShardSource
from agent.runtime.config import RuntimeConfig
from agent.runtime.stage import CompiledStage
from discovery.fleet_document import ModelSource
from shards.hub.fetch import ShardRequest, fetch_manifest, fetch_shards
from shards.hub.publish import export_paths, mirror_repo_path, publish_to_hub, publish_to_mirror
from shards.manifest import MANIFEST_NAME, Manifest, sha256_file
from tests.support.flaky_proxy import FlakyProxy
from tests.support.olah_mirror import OlahMirror

pytestmark = [pytest.mark.processes, pytest.mark.usefixtures("hub_connections_dropped")]

REPO_ID = "shoal-test/smollm2-int4"
TAMPERED = "stage-1/openvino_model.xml"
"""The stage file whose one byte the second commit changes (the manifest keeps its old sha256). olah streams
about 10 MB/s here, so the tests move small files where the point allows."""
STRAY = "notes.txt"
"""A file in the tampered export's folder that its manifest does not list: no publish may carry it."""


@pytest.fixture(scope="module")
def mirror(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OlahMirror]:
    with OlahMirror(tmp_path_factory.mktemp("olah")) as server:
        yield server


@pytest.fixture(scope="module")
def export(exported: Callable[..., Path]) -> Path:
    return exported(3, "int4")


@pytest.fixture(scope="module")
def good(export: Path, mirror: OlahMirror) -> str:
    """The commit of the export as it is."""
    return publish_to_mirror(export, mirror.mirrors, REPO_ID)


@pytest.fixture(scope="module")
def tampered_export(export: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The export with one byte of TAMPERED changed (same size) and STRAY beside it; its manifest unchanged.

    Hard links make the copy cheap; the changed file is written anew, so the session's export is untouched.
    """
    copy = tmp_path_factory.mktemp("tampered") / "export"
    shutil.copytree(export, copy, copy_function=os.link)
    data = bytearray((export / TAMPERED).read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / TAMPERED).unlink()
    (copy / TAMPERED).write_bytes(bytes(data))
    (copy / STRAY).write_text("not part of the export\n")
    return copy


@pytest.fixture(scope="module")
def bad(good: str, tampered_export: Path, mirror: OlahMirror) -> str:
    """A second commit on the mirror, serving the tampered file under the old manifest."""
    return publish_to_mirror(tampered_export, mirror.mirrors, REPO_ID, verify=False)


@dataclass
class Fetched:
    cache: Path
    folder: Path
    progress: list[tuple[int, int]]


@pytest.fixture(scope="module")
def stage1(good: str, mirror: OlahMirror, tmp_path_factory: pytest.TempPathFactory) -> Fetched:
    """Stage 1 fetched into a cache of its own; tests that start from a warm cache take a copy (``warm``)."""
    cache = tmp_path_factory.mktemp("stage1-cache")
    seen: list[tuple[int, int]] = []
    folder = fetch_shards(
        ShardRequest(REPO_ID, good, (1,)),
        cache_dir=cache,
        endpoint=mirror.endpoint,
        progress=lambda done, total: seen.append((done, total)),
    )
    return Fetched(cache, folder, seen)


def warm(stage1: Fetched, tmp_path: Path) -> Path:
    """A copy of stage 1's cache (its snapshot links are relative, so they point into the copy)."""
    cache = tmp_path / "cache"
    shutil.copytree(stage1.cache, cache, symlinks=True)
    return cache


def files_in(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def stored(cache: Path) -> list[Path]:
    """Every downloaded file the cache holds: huggingface_hub's blobs (the manifest) and the files shoal moved
    into the snapshot folders (the stages')."""
    in_snapshots = (p for p in cache.glob("models--*/snapshots/**/*") if p.is_file() and not p.is_symlink())
    return sorted([*(p for p in cache.glob("models--*/blobs/*") if p.is_file()), *in_snapshots])


def test_publish_to_mirror_commits_exactly_the_manifests_files_once_per_change(
    export: Path, tampered_export: Path, good: str, bad: str, mirror: OlahMirror
) -> None:
    git_dir = mirror_repo_path(mirror.mirrors, REPO_ID)

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", f"--git-dir={git_dir}", *args], capture_output=True, encoding="utf-8", errors="replace", check=True
        ).stdout

    expected = set(export_paths(Manifest.load(export)))
    assert set(git("ls-tree", "-r", "--name-only", good).split()) == expected
    assert set(git("ls-tree", "-r", "--name-only", bad).split()) == expected  # STRAY left out
    assert git("rev-list", "main").split() == [bad, good]  # the changed export added a commit
    assert publish_to_mirror(tampered_export, mirror.mirrors, REPO_ID, verify=False) == bad  # unchanged: none
    assert git("rev-list", "main").split() == [bad, good]


def test_a_stage_fetch_brings_only_that_stage_and_it_compiles(export: Path, stage1: Fetched) -> None:
    manifest = Manifest.load(export)
    stage = manifest.stages[1]
    assert files_in(stage1.folder) == {MANIFEST_NAME, *(f.path for f in stage.files)}
    assert len(stored(stage1.cache)) == len(stage.files) + 1  # nothing else was downloaded
    total = sum(f.size for f in stage.files)
    seen = stage1.progress
    assert seen[0] == (0, total) and seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert len(seen) > 2  # bytes were told as they arrived, not only at the end
    fetched = Manifest.load(stage1.folder)
    assert fetched == manifest
    compiled = CompiledStage(stage1.folder, fetched.stages[1], fetched.weights, RuntimeConfig(device="CPU", threads=1))
    assert compiled.graph.name == stage.name


def test_an_agent_tells_which_stages_its_cache_holds(export: Path, good: str, stage1: Fetched, tmp_path: Path) -> None:
    manifest = Manifest.load(export)
    model = ModelSource(repo_id=REPO_ID, revision=good)
    assert ShardSource(cache_dir=stage1.cache).cached_stages(model, manifest) == (1,)
    assert ShardSource(cache_dir=tmp_path / "empty").cached_stages(model, manifest) == ()
    cut = warm(stage1, tmp_path)
    with open(max(stored(cut), key=lambda p: p.stat().st_size), "r+b") as blob:  # the stage's weights
        blob.truncate(1024)  # a download cut off: not held
    assert ShardSource(cache_dir=cut).cached_stages(model, manifest) == ()
    assert ShardSource().cached_stages(ModelSource(export_dir=str(export)), manifest) == tuple(
        range(len(manifest.stages))
    )


def test_a_head_fetch_through_hf_endpoint_brings_the_tokenizer_and_the_draft(
    export: Path, good: str, mirror: OlahMirror, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", mirror.endpoint)  # read at each call, as an office's agents set it
    manifest = Manifest.load(export)
    assert manifest.draft is not None
    assert fetch_manifest(REPO_ID, good, cache_dir=tmp_path) == manifest
    folder = fetch_shards(ShardRequest(REPO_ID, good, head=True), cache_dir=tmp_path)
    wanted = [*manifest.tokenizer_files, *manifest.draft.graph.files]
    assert files_in(folder) == {MANIFEST_NAME, *(f.path for f in wanted)}
    assert "tokenizer/chat_template.jinja" in files_in(folder)


def test_a_repository_the_mirror_lacks_is_a_clear_error(good: str, mirror: OlahMirror, tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="no such repository"):
        fetch_shards(ShardRequest("shoal-test/absent", good, (0,)), cache_dir=tmp_path, endpoint=mirror.endpoint)


def test_a_file_changed_on_the_mirror_is_refused_named_and_not_kept(
    export: Path,
    tampered_export: Path,
    bad: str,
    stage1: Fetched,
    mirror: OlahMirror,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    cache = warm(stage1, tmp_path)  # the unchanged stage file is already there: only TAMPERED is downloaded
    expected = next(f.sha256 for f in Manifest.load(export).stages[1].files if f.path == TAMPERED)
    actual = sha256_file(tampered_export / TAMPERED)
    with caplog.at_level(logging.WARNING, "shards.hub.fetch"), pytest.raises(IntegrityError) as refused:
        fetch_shards(ShardRequest(REPO_ID, bad, (1,)), cache_dir=cache, endpoint=mirror.endpoint)
    message = str(refused.value)
    assert TAMPERED in message and expected in message and actual in message
    assert mirror.downloads(REPO_ID, bad, TAMPERED) == 2  # deleted and fetched once more before refusing
    assert any("fetching it again" in r.getMessage() for r in caplog.records)
    snapshot = next(cache.glob("models--*/snapshots")) / bad
    assert not (snapshot / TAMPERED).exists() and not (snapshot / TAMPERED).is_symlink()
    assert actual not in {sha256_file(b) for b in stored(cache)}


def test_a_file_corrupted_in_the_cache_is_fetched_again(
    export: Path, good: str, stage1: Fetched, mirror: OlahMirror, tmp_path: Path
) -> None:
    cache = warm(stage1, tmp_path)
    victim = next(f for f in Manifest.load(export).stages[1].files if f.path.endswith(".xml"))
    folder = stage1.folder.relative_to(stage1.cache)
    blob = (cache / folder / victim.path).resolve()
    with blob.open("r+b") as f:
        f.seek(victim.size // 2)
        byte = f.read(1)
        f.seek(victim.size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    before = mirror.downloads(REPO_ID, good, victim.path)
    assert fetch_shards(ShardRequest(REPO_ID, good, (1,)), cache_dir=cache, endpoint=mirror.endpoint) == cache / folder
    assert sha256_file(cache / folder / victim.path) == victim.sha256
    assert mirror.downloads(REPO_ID, good, victim.path) == before + 1


def test_an_interrupted_fetch_downloads_only_what_it_lacks(
    export: Path, good: str, stage1: Fetched, mirror: OlahMirror, tmp_path: Path
) -> None:
    cache = warm(stage1, tmp_path)
    folder = cache / stage1.folder.relative_to(stage1.cache)
    files = Manifest.load(export).stages[1].files
    lost = next(f for f in files if f.path.endswith(".xml"))
    # as if the run had stopped in this file: not in the snapshot, its first half left as a partial download
    partial = next(cache.glob("models--*")) / "shoal-partial" / f"{lost.sha256}.incomplete"
    partial.parent.mkdir(exist_ok=True)
    partial.write_bytes((folder / lost.path).read_bytes()[: lost.size // 2])
    (folder / lost.path).unlink()
    counts = {f.path: mirror.downloads(REPO_ID, good, f.path) for f in files}
    fetch_shards(ShardRequest(REPO_ID, good, (1,)), cache_dir=cache, endpoint=mirror.endpoint)
    assert {f.path: mirror.downloads(REPO_ID, good, f.path) - counts[f.path] for f in files} == {
        f.path: int(f is lost) for f in files
    }
    assert sha256_file(folder / lost.path) == lost.sha256


def test_with_the_mirror_stopped_a_fetch_is_served_and_checked_from_the_cache(
    export: Path, good: str, stage1: Fetched, mirror: OlahMirror, tmp_path: Path
) -> None:
    manifest = Manifest.load(export)
    cache = warm(stage1, tmp_path)
    folder = cache / stage1.folder.relative_to(stage1.cache)
    request = ShardRequest(REPO_ID, good, (1,))
    mirror.stop()
    try:
        seen: list[tuple[int, int]] = []
        got = fetch_shards(request, cache_dir=cache, endpoint=mirror.endpoint, progress=lambda *p: seen.append(p))
        assert got == folder and Manifest.load(got) == manifest
        total = sum(f.size for f in manifest.stages[1].files)
        assert seen[0] == (total, total)  # everything was in the cache
        # the checks still run offline: a bad cached file is refused and deleted (it cannot be fetched again)
        victim = manifest.stages[1].files[0]
        (folder / victim.path).resolve().write_bytes(b"x" * victim.size)
        with pytest.raises(IntegrityError, match=victim.path):
            fetch_shards(request, cache_dir=cache, endpoint=mirror.endpoint)
        assert not (folder / victim.path).exists()
        # what the cache never held is a clear error
        with pytest.raises(SourceError, match="cannot be reached") as lacking:
            fetch_shards(ShardRequest(REPO_ID, good, (2,)), cache_dir=cache, endpoint=mirror.endpoint)
        assert manifest.stages[2].files[0].path in str(lacking.value)
    finally:
        mirror.start()


def test_a_mirror_that_drops_out_mid_file_and_comes_back_is_resumed_where_it_stopped(
    exported: Callable[..., Path], mirror: OlahMirror, tmp_path: Path
) -> None:
    """A mirror whose host drops off the network in the middle of a stage's largest file: the fetch fails with
    shoal's error (before: huggingface_hub's RuntimeError on a client it had closed), the part that arrived is
    kept, and once the mirror is back the next fetch asks only for the rest (an HTTP Range) and checks it."""
    one_stage = exported(1, "int4")  # one large file: the cut lands well inside it
    commit = publish_to_mirror(one_stage, mirror.mirrors, "shoal-test/smollm2-one-stage")
    big = max(Manifest.load(one_stage).stages[0].files, key=lambda f: f.size)
    assert big.size > 40_000_000, "the cut must leave more than huggingface_hub's 10 MB chunks on each side"
    request = ShardRequest("shoal-test/smollm2-one-stage", commit, (0,))
    cache = tmp_path / "cache"
    with FlakyProxy(("127.0.0.1", mirror.port)) as proxy:
        proxy.cut_after(big.size // 2)
        with pytest.raises(SourceError, match=f"cannot download {big.path}"):
            fetch_shards(request, cache_dir=cache, endpoint=proxy.endpoint)
        assert proxy.ranges() == []
        proxy.up()
        seen: list[tuple[int, int]] = []
        folder = fetch_shards(request, cache_dir=cache, endpoint=proxy.endpoint, progress=lambda *p: seen.append(p))
    (resumed,) = proxy.ranges()
    start = int(resumed.removeprefix("bytes=").removesuffix("-"))
    assert 10_000_000 <= start < big.size  # it carried on from the part kept, not from zero
    assert sha256_file(folder / big.path) == big.sha256
    assert seen[-1][0] == seen[-1][1] and all(a[0] <= b[0] for a, b in itertools.pairwise(seen))
    assert not any(cache.glob("**/*.incomplete"))


class RecordingHub:
    """Stands in for ``HfApi`` where no Hub can be reached: records the calls and resolves ``upload_folder``'s
    patterns over the folder with huggingface_hub's own filter, to know exactly what would be uploaded."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, object]]] = []
        self.uploaded: set[str] = set()

    def create_repo(self, repo_id: str, **options: object) -> None:
        self.calls.append(("create_repo", {"repo_id": repo_id, **options}))

    def create_branch(self, repo_id: str, **options: object) -> None:
        self.calls.append(("create_branch", {"repo_id": repo_id, **options}))

    def upload_folder(self, **options: object) -> CommitInfo:
        self.calls.append(("upload_folder", options))
        folder = Path(str(options["folder_path"]))
        every = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
        patterns = options["allow_patterns"]
        assert isinstance(patterns, list)
        self.uploaded = set(filter_repo_objects(every, allow_patterns=patterns))
        return CommitInfo(
            commit_url=f"https://huggingface.co/{options['repo_id']}/commit/{'c' * 40}",  # parsed, never opened
            commit_message=str(options.get("commit_message")),
            commit_description="",
            oid="c" * 40,
        )


def test_publish_to_hub_uploads_exactly_the_manifests_files(
    export: Path, tampered_export: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "export"
    shutil.copytree(export, folder, copy_function=os.link)
    (folder / STRAY).write_text("left at home\n")
    (folder / "stage-0" / "scratch.bin").write_bytes(b"\0" * 16)
    hub = RecordingHub()
    sha = publish_to_hub(folder, "org/model", api=hub, revision="v1", progress=False)  # type: ignore[arg-type]
    assert sha == "c" * 40
    assert hub.uploaded == set(export_paths(Manifest.load(export)))
    assert [name for name, _ in hub.calls] == ["create_repo", "create_branch", "upload_folder"]
    assert hub.calls[0][1]["exist_ok"] is True and hub.calls[0][1]["private"] is True
    assert hub.calls[2][1]["revision"] == "v1"
    # an export that does not match its manifest is refused before anything is sent
    refused = RecordingHub()
    with pytest.raises(IntegrityError, match=TAMPERED):
        publish_to_hub(tampered_export, "org/model", api=refused, progress=False)  # type: ignore[arg-type]
    assert refused.calls == []
