"""The pure parts of fetching shards from the Hub: which files a request wants, and the patterns that fetch them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from agent.errors import ConfigError, ManifestError
from shards.architecture import ArchSpec
from shards.hub.fetch import ShardRequest, _Bytes, wanted_files
from shards.hub.publish import export_paths, mirror_repo_path, publish_to_mirror
from shards.manifest import DraftEntry, FileEntry, GraphEntry, Manifest, SourceInfo

ARCH = ArchSpec("llama", "llama", 4, 64, 128, 4, 2, 16, 100, 1e-5, False, False, False, True, 512)
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def entry(path: str, size: int = 10) -> FileEntry:
    return FileEntry(path, "a" * 64, size)


def graph(name: str, start: int, stop: int, *extra: str) -> GraphEntry:
    files = (entry(f"{name}/openvino_model.bin", 100), entry(f"{name}/openvino_model.xml"), *map(entry, extra))
    return GraphEntry(
        name,
        f"{name}/openvino_model.xml",
        start,
        stop,
        start == 0,
        stop == 4,
        ("input_ids",),
        ("logits",),
        files,
        1,
        1,
        1,
    )


def manifest(draft: bool = True) -> Manifest:
    return Manifest(
        source=SourceInfo("test", "gguf", "sha256:00"),
        arch=ARCH,
        weights="int4",
        context_tokens=512,
        stages=(graph("stage-0", 0, 2), graph("stage-1", 2, 3, "stage-1/odd [1]*?.bin"), graph("stage-2", 3, 4)),
        tokenizer_files=(entry("tokenizer/tokenizer.json"), entry("tokenizer/chat_template.jinja")),
        draft=DraftEntry("self", "self:1", ARCH, graph("draft", 0, 1)) if draft else None,
    )


def test_a_stage_request_wants_only_that_stages_files() -> None:
    got = [f.path for f in wanted_files(manifest(), ShardRequest("o/n", COMMIT, (2,)))]
    assert got == ["stage-2/openvino_model.bin", "stage-2/openvino_model.xml"]


def test_a_head_request_adds_the_tokenizer_and_the_draft() -> None:
    got = [f.path for f in wanted_files(manifest(), ShardRequest("o/n", COMMIT, (0, 0), head=True))]
    assert got == [
        "stage-0/openvino_model.bin",
        "stage-0/openvino_model.xml",
        "tokenizer/tokenizer.json",
        "tokenizer/chat_template.jinja",
        "draft/openvino_model.bin",
        "draft/openvino_model.xml",
    ]
    no_draft = [f.path for f in wanted_files(manifest(draft=False), ShardRequest("o/n", COMMIT, head=True))]
    assert no_draft == ["tokenizer/tokenizer.json", "tokenizer/chat_template.jinja"]


def test_a_stage_the_export_lacks_is_refused() -> None:
    with pytest.raises(ManifestError, match="no stage 3"):
        wanted_files(manifest(), ShardRequest("o/n", COMMIT, (3,)))


@pytest.mark.parametrize("revision", ["main", COMMIT[:12], COMMIT.upper(), COMMIT + "0"])
def test_a_request_pins_a_commit(revision: str) -> None:
    with pytest.raises(ConfigError, match="40 hex"):
        ShardRequest("o/n", revision, (0,))


def test_a_request_takes_any_sequence_of_stages_and_refuses_negative_ones() -> None:
    assert ShardRequest("o/n", COMMIT, [1, 0]).stages == (1, 0)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        ShardRequest("o/n", COMMIT, (-1,))


def test_progress_counts_the_bytes_that_arrive_and_ends_at_the_total() -> None:
    seen: list[tuple[int, int]] = []
    with _Bytes(100, 30, lambda done, total: seen.append((done, total)), False, "t") as counter:
        feed = counter.tqdm_class()
        files = feed(iter([1, 2]), total=2)  # snapshot_download's bar of files: not bytes
        assert list(files) == [1, 2]
        files.update(1)
        data = feed(total=50, unit="B", unit_scale=True)
        data.update(20)
        data.update(-5)  # huggingface_hub rolls back a resumed download the server sent whole
        data.update(500)
        counter.finish()
    assert seen == [(30, 100), (50, 100), (45, 100), (100, 100), (100, 100)]


@pytest.mark.parametrize("repo_id", ["name", "a/b/c", "../x", "org/..", "org/-x", ""])
def test_a_mirror_repository_is_org_slash_name(tmp_path: Path, repo_id: str) -> None:
    with pytest.raises(ConfigError, match="ORG/NAME"):
        mirror_repo_path(tmp_path, repo_id)


def test_a_mirror_publish_commits_the_listed_files_on_main(tmp_path: Path) -> None:
    export = tmp_path / "export"
    (export / "stage-0").mkdir(parents=True)
    (export / "stage-0" / "openvino_model.xml").write_text("<net/>")
    (export / "stage-0" / "openvino_model.bin").write_bytes(b"\1\2\3")
    (export / "tokenizer").mkdir()
    (export / "tokenizer" / "tokenizer.json").write_text("{}")
    (export / "leftover.tmp").write_text("not listed")
    files = tuple(FileEntry.of(export, export / "stage-0" / n) for n in ("openvino_model.bin", "openvino_model.xml"))
    stage = GraphEntry("stage-0", "stage-0/openvino_model.xml", 0, 4, True, True, (), (), files, 3, 1, 3)
    one = Manifest(
        SourceInfo("t", "gguf", "x"),
        ARCH,
        "int4",
        512,
        (stage,),
        (FileEntry.of(export, export / "tokenizer" / "tokenizer.json"),),
    )
    one.save(export)
    first = publish_to_mirror(export, tmp_path / "mirror", "org/name")
    git_dir = tmp_path / "mirror" / "models" / "org" / "name"

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", f"--git-dir={git_dir}", *args], capture_output=True, encoding="utf-8", errors="replace", check=True
        ).stdout

    assert git("symbolic-ref", "HEAD").strip() == "refs/heads/main"
    assert git("rev-parse", "main").strip() == first
    assert sorted(git("ls-tree", "-r", "--name-only", first).split()) == sorted(export_paths(one))
    assert publish_to_mirror(export, tmp_path / "mirror", "org/name") == first
    # a file dropped from the manifest leaves the tree in the next commit
    Manifest(one.source, one.arch, one.weights, one.context_tokens, one.stages, ()).save(export)
    second = publish_to_mirror(export, tmp_path / "mirror", "org/name")
    assert git("rev-list", "main").split() == [second, first]
    assert "tokenizer/tokenizer.json" not in git("ls-tree", "-r", "--name-only", second).split()
