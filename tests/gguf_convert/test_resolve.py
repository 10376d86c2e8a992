"""``--model``: converted directory, checkpoint directory, or Hugging Face repo id (no network)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gguf_convert.resolve import _snapshot_download, is_repo_id, resolve_model
from vlembed.manifest import load_manifest


def test_repo_ids_and_paths_are_told_apart(tmp_path: Path) -> None:
    assert is_repo_id("jinaai/jina-embeddings-v4")
    assert is_repo_id("jinaai/jina-embeddings-v4@main")
    assert not is_repo_id("model")
    (tmp_path / "a").mkdir()
    assert not is_repo_id(str(tmp_path / "a"))


def test_repo_id_is_downloaded_once_and_converted_into_the_cache(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setenv("VLEMBED_CACHE", str(tmp_path / "cache"))
    calls: list[tuple[str, str | None]] = []

    def download(repo: str, revision: str | None) -> Path:  # the hub, as a local directory
        calls.append((repo, revision))
        snapshot = tmp_path / "hub" / "snapshots" / "0123456789abcdef0123"
        if not snapshot.exists():
            shutil.copytree(tiny_checkpoint, snapshot)
        return snapshot

    out = resolve_model("jinaai/jina-embeddings-v4@v1", dtype="f32", download=download)
    assert out == tmp_path / "cache" / "models" / "jinaai--jina-embeddings-v4--v1"
    manifest = load_manifest(out)
    assert set(manifest.tasks) == {"retrieval", "text-matching", "code"}
    assert calls == [("jinaai/jina-embeddings-v4", "v1")]
    # a converted directory is served as it is; a second resolve reuses the conversion
    assert resolve_model(str(out)) == out
    again = resolve_model("jinaai/jina-embeddings-v4@v1", dtype="f32", download=download)
    ggufs = {k: v for k, v in manifest.files.items() if k.endswith(".gguf")}
    assert (
        again == out and ggufs and all(load_manifest(out).files[k] == v for k, v in ggufs.items())
    )  # the GGUFs were kept, not rewritten


def test_unknown_reference_says_what_it_accepts(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="neither a converted model"):
        resolve_model(str(tmp_path / "nothing-here"))


def test_offline_download_says_what_to_download_and_where(tmp_path: Path, monkeypatch) -> None:
    hub = pytest.importorskip("huggingface_hub")
    monkeypatch.setenv("VLEMBED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def offline(*args, **kwargs):
        raise OSError("offline: no network")

    monkeypatch.setattr(hub, "snapshot_download", offline)
    with pytest.raises(RuntimeError) as info:
        _snapshot_download("jinaai/jina-embeddings-v4", None)
    message = str(info.value)
    assert "huggingface-cli download jinaai/jina-embeddings-v4" in message
    assert str(tmp_path / "cache" / "models" / "jina-embeddings-v4-hf") in message
    assert "--model" in message
