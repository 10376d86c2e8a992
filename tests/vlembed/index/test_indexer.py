"""Index.add against a fake client: incremental, crash repair, unreadable files."""

from __future__ import annotations

import pytest

from tests.vlembed.index.conftest import noise_image, write_encrypted_pdf, write_pdf
from vlembed.index import Index, ModelMismatchError, StorageOptions
from vlembed.index.store import PageStore


def _pages(index: Index) -> list[tuple[str, int]]:
    data = index.store.table.search().select(["source", "page"]).limit(None).to_arrow()
    return sorted(zip(data["source"].to_pylist(), data["page"].to_pylist(), strict=True))


@pytest.fixture
def docs(tmp_path):
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    write_pdf(root / "a.pdf", 3, seed=1)
    write_pdf(root / "sub" / "b.pdf", 2, seed=2)
    noise_image(90, 60, 3).save(root / "sub" / "c.png")
    (root / "notes.txt").write_text("not indexed from a folder")
    return root


def test_folder_is_indexed_once_per_page_and_reindex_embeds_nothing(docs, tmp_path, fake_client):
    index = Index(tmp_path / "idx")
    report = index.add([docs], client=fake_client)
    assert report.ok and report.files_indexed == 3 and report.pages_embedded == 6
    assert _pages(index) == sorted(
        [(str(docs / "a.pdf"), p) for p in (1, 2, 3)]
        + [(str(docs / "sub" / "b.pdf"), p) for p in (1, 2)]
        + [(str(docs / "sub" / "c.png"), 1)]
    )
    calls = len(fake_client.calls)
    again = Index(tmp_path / "idx").add([docs / "**" / "*.pdf", docs / "sub"], client=fake_client)
    assert again.files_unchanged == 3 and again.pages_embedded == 0
    assert len(fake_client.calls) == calls  # nothing sent
    assert index.meta.model == "fake-model" and index.meta.revision == "rev1"


def test_changed_file_replaces_its_pages(docs, tmp_path, fake_client):
    index = Index(tmp_path / "idx")
    index.add([docs], client=fake_client)
    write_pdf(docs / "a.pdf", 1, seed=9)  # 3 pages -> 1 page, new content
    report = index.add([docs], client=fake_client)
    assert report.files_indexed == 1 and report.files_unchanged == 2
    assert [p for s, p in _pages(index) if s.endswith("a.pdf")] == [1]
    assert len(index) == 4


def test_partial_and_duplicated_files_are_rebuilt(docs, tmp_path, fake_client):
    index = Index(tmp_path / "idx")
    index.add([docs], client=fake_client)
    store = index.store
    a = str(docs / "a.pdf")
    store.table.delete(f"source = '{a}' AND page = 2")  # as if a run died between two adds
    b = str(docs / "sub" / "b.pdf")
    dup = store.table.search().where(f"source = '{b}' AND page = 1").limit(None).to_arrow()
    store.table.add(dup)  # a page twice
    report = Index(tmp_path / "idx").add([docs], client=fake_client)
    assert report.files_indexed == 2 and report.files_unchanged == 1
    pages = _pages(Index(tmp_path / "idx"))  # a table handle reads the version it opened
    assert len(pages) == len(set(pages)) == 6


def test_unreadable_files_are_skipped_and_reported(docs, tmp_path, fake_client):
    (docs / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not a pdf")
    write_encrypted_pdf(docs / "secret.pdf")
    (docs / "bad.png").write_bytes(b"\x89PNG not really")
    index = Index(tmp_path / "idx")
    report = index.add([docs, tmp_path / "nope.pdf"], client=fake_client)
    assert not report.ok and report.files_indexed == 3
    reasons = dict(report.skipped)
    assert "password" in reasons[str(docs / "secret.pdf")]
    assert "cannot open PDF" in reasons[str(docs / "broken.pdf")]
    assert "cannot open image" in reasons[str(docs / "bad.png")]
    assert report.missing == [str(tmp_path / "nope.pdf")]
    assert "3 skipped" in report.summary() and "password" in report.summary()


def test_index_refuses_another_model_and_other_storage_options(docs, tmp_path, fake_client):
    index = Index(tmp_path / "idx")
    index.add([docs / "sub" / "c.png"], client=fake_client)
    fake_client.revision = "rev2"
    with pytest.raises(ModelMismatchError, match="rev1"):
        index.add([docs], client=fake_client)
    with pytest.raises(ModelMismatchError):
        index.search("q", client=fake_client)
    fake_client.revision = "rev1"
    with pytest.raises(ValueError, match="fixed per index"):
        index.add([docs], client=fake_client, options=StorageOptions(binary=True))


def test_metadata_survives_reopening(docs, tmp_path, fake_client):
    opts = StorageOptions(pool_factor=2, binary=True)
    Index(tmp_path / "idx").add([docs / "sub"], client=fake_client, options=opts)
    store = PageStore(tmp_path / "idx")
    assert store.meta.options == opts and store.meta.dim == 16 and store.meta.multi_dim == 8
