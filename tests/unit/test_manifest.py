from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.errors import IntegrityError, ManifestError, UnsupportedModelError
from shards.architecture import ArchSpec, arch_spec_from_config
from shards.manifest import FileEntry, GraphEntry, Manifest, SourceInfo

ARCH = ArchSpec("llama", "llama", 4, 64, 128, 4, 2, 16, 100, 1e-5, False, False, False, True, 512)


def graph(tmp: Path, name: str, start: int, stop: int, embeddings: bool, head: bool) -> GraphEntry:
    folder = tmp / name
    folder.mkdir()
    (folder / "openvino_model.xml").write_text(f"<net name='{name}'/>")
    (folder / "openvino_model.bin").write_bytes(bytes(range(start, stop + 10)))
    files = tuple(FileEntry.of(tmp, p) for p in sorted(folder.iterdir()))
    return GraphEntry(
        name,
        f"{name}/openvino_model.xml",
        start,
        stop,
        embeddings,
        head,
        ("input_ids", "attention_mask", "position_ids", "beam_idx"),
        ("logits",),
        files,
        10,
        4,
        100,
    )


def manifest(tmp: Path) -> Manifest:
    return Manifest(
        source=SourceInfo("test", "gguf", "sha256:00"),
        arch=ARCH,
        weights="int4",
        context_tokens=512,
        stages=(graph(tmp, "stage-0", 0, 3, True, False), graph(tmp, "stage-1", 3, 4, False, True)),
        tokenizer_files=(),
    )


def test_roundtrip_and_verify(tmp_path: Path) -> None:
    m = manifest(tmp_path)
    m.save(tmp_path)
    loaded = Manifest.load(tmp_path)
    assert loaded == m
    loaded.verify(tmp_path, progress=False)


def test_tampered_file_is_detected(tmp_path: Path) -> None:
    m = manifest(tmp_path)
    (tmp_path / "stage-1" / "openvino_model.bin").write_bytes(b"\x00" * 11)
    with pytest.raises(IntegrityError, match="sha256"):
        m.verify(tmp_path, progress=False)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(format_version=4), "format 4 is not supported"),
        (lambda d: d["stages"].pop(), "cover 3 of 4 layers"),
        (lambda d: d["stages"][1].update(layer_start=2), "expected 3"),
        (lambda d: d["stages"][0]["files"][0].update(path="../../etc/passwd"), "escapes"),
        (lambda d: d.pop("arch"), "malformed manifest"),
        (lambda d: d["stages"][1].update(head=False), "LM head"),
    ],
)
def test_bad_manifests_are_refused(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(json.dumps(manifest(tmp_path).to_json()))
    edit(data)
    (tmp_path / "manifest.json").write_text(json.dumps(data))
    with pytest.raises(ManifestError, match=message):
        Manifest.load(tmp_path)


def test_missing_manifest(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"no manifest\.json"):
        Manifest.load(tmp_path)


def test_arch_spec_refuses_unsupported_configs() -> None:
    from transformers import GPT2Config, LlamaConfig, Qwen2Config

    with pytest.raises(UnsupportedModelError, match="gpt2"):
        arch_spec_from_config(GPT2Config())
    qwen = arch_spec_from_config(Qwen2Config(num_hidden_layers=2))
    assert qwen.qkv_bias and not qwen.o_bias
    llama = arch_spec_from_config(LlamaConfig(num_hidden_layers=2, num_key_value_heads=8))
    assert llama.family == "llama" and llama.head_dim == 4096 // 32


def test_a_sliding_window_shorter_than_the_context_is_refused() -> None:
    from transformers import MistralConfig, Qwen2Config

    from shards.architecture import check_attention_window

    with pytest.raises(UnsupportedModelError, match="sliding-window attention over 32 tokens is not supported"):
        check_attention_window(MistralConfig(sliding_window=32), 4096)
    check_attention_window(MistralConfig(sliding_window=4096), 4096)  # the window covers the whole context
    check_attention_window(MistralConfig(sliding_window=None), 4096)
    check_attention_window(Qwen2Config(sliding_window=32, use_sliding_window=False), 4096)  # a window not in force
    with pytest.raises(UnsupportedModelError, match="qwen2 with sliding-window attention over 32"):
        check_attention_window(Qwen2Config(sliding_window=32, use_sliding_window=True), 4096)
