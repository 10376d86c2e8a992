"""Session fixtures: the pinned llama.cpp source, a tiny synthetic checkpoint, its reference.

Building these once per session keeps the suite fast; tests must not mutate them (the
reference's task is reset after each test that changes it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def llama_source() -> Path:
    from llama_patches.build import pristine_source

    return pristine_source()


@pytest.fixture(scope="session")
def vocab_gguf(llama_source: Path) -> Path:
    return llama_source / "models" / "ggml-vocab-qwen2.gguf"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory, vocab_gguf: Path) -> Path:
    from gguf_convert.synthetic import make_checkpoint

    return make_checkpoint(
        tmp_path_factory.mktemp("ckpt") / "tiny", "tiny", 0, vocab_gguf=vocab_gguf
    )


@pytest.fixture(scope="session")
def tiny_plain_checkpoint(tmp_path_factory: pytest.TempPathFactory, vocab_gguf: Path) -> Path:
    from gguf_convert.synthetic import make_checkpoint

    return make_checkpoint(
        tmp_path_factory.mktemp("ckpt") / "tiny-plain",
        "tiny",
        0,
        layout="qwen",
        vocab_gguf=vocab_gguf,
    )


@pytest.fixture(scope="session")
def _tiny_reference(tiny_checkpoint: Path):
    from eval.reference import ReferenceEmbedder

    return ReferenceEmbedder(tiny_checkpoint)


@pytest.fixture
def tiny_reference(_tiny_reference) -> Iterator:
    """The session's reference embedder, put back on the retrieval task after each test."""
    yield _tiny_reference
    _tiny_reference.set_task("retrieval")


@pytest.fixture(scope="session")
def tiny_converted(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny checkpoint as served: f32 GGUFs for every task, projectors, manifest."""
    from gguf_convert.convert import convert

    out = tmp_path_factory.mktemp("served") / "tiny-f32"
    convert(tiny_checkpoint, out, dtype="f32", progress=lambda _: None)
    return out
