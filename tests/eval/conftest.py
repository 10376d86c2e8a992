"""Fixtures for the evaluation harness: a small generated document set, the reference backend.

Both are session-scoped and read-only for tests: the document set is tiny (pages at a quarter
of their real size, so the tiny reference encodes each in a fraction of a second) and the
backend's cache makes repeated encodings of the same inputs free.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def small_docs(tmp_path_factory: pytest.TempPathFactory):
    from eval.make_docs import make_docs

    return make_docs(tmp_path_factory.mktemp("docs") / "small", 8, seed=7, scale=0.25)


@pytest.fixture(scope="session")
def tiny_backend(_tiny_reference):
    from eval.backends import ReferenceBackend

    return ReferenceBackend(_tiny_reference, cache_size=1024)


@pytest.fixture
def docs_copy(small_docs, tmp_path: Path):
    """A private copy of the small set, for tests that modify files."""
    import shutil

    from eval.docset import read_docset

    dst = tmp_path / "docs"
    shutil.copytree(small_docs.root, dst)
    return read_docset(dst)
