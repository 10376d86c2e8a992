"""The offline document set: deterministic, well-formed, one answering page per query."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="needs the eval extra (matplotlib)")

from eval.docset import FORMAT, read_docset  # noqa: E402
from eval.make_docs import KINDS, make_docs  # noqa: E402


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_same_seed_same_bytes_other_seed_other_pages(small_docs, tmp_path: Path) -> None:
    again = make_docs(tmp_path / "again", 8, seed=7, scale=0.25)
    assert _digest(again.root) == _digest(small_docs.root)
    other = make_docs(tmp_path / "other", 8, seed=8, scale=0.25)
    assert [q.text for q in other.queries] != [q.text for q in small_docs.queries]


def test_a_page_does_not_depend_on_the_pages_after_it(small_docs, tmp_path: Path) -> None:
    head = make_docs(tmp_path / "head", 3, seed=7, scale=0.25)
    assert [d.title for d in head.corpus] == [d.title for d in small_docs.corpus[:3]]
    for doc in head.corpus:
        assert (
            doc.image
            and (head.root / doc.image).read_bytes() == (small_docs.root / doc.image).read_bytes()
        )


def test_layout_kinds_and_shapes(small_docs) -> None:
    kinds = [d.kind for d in small_docs.corpus]
    assert set(kinds[:4]) == set(KINDS) and set(kinds[4:]) == set(KINDS)
    for d in small_docs.corpus:
        image = small_docs.load_image(d)
        assert image.size == (d.width, d.height) and image.mode == "RGB"
        ratio = d.height / d.width
        expected = {"report": (1.3, 1.5), "slide": (0.5, 0.6), "datasheet": (0.65, 0.75)}
        lo, hi = expected.get(d.kind, (1.7, 6.0))  # receipts: long and narrow
        assert lo <= ratio <= hi, (d.kind, d.width, d.height)


def test_queries_and_qrels(small_docs) -> None:
    docs = small_docs
    assert docs.manifest["format"] == FORMAT
    assert docs.manifest["n_queries"] == len(docs.queries) >= len(docs.corpus)
    assert len({q.text for q in docs.queries}) == len(docs.queries)
    page_ids = {d.id for d in docs.corpus}
    for q in docs.queries:
        assert docs.qrels[q.id] == {q.page: 1}
        assert q.page in page_ids and q.text.endswith("?") and q.answer
    assert {q.page for q in docs.queries} == page_ids  # every page is asked about


def test_distinctive_names_are_not_shared(tmp_path: Path) -> None:
    """The name a query hangs on (company, project, store, model code) is on one page only."""
    docs = make_docs(tmp_path / "many", 24, seed=3, scale=0.1)
    firsts = {}
    for d in docs.corpus:
        key = d.title.split(" receipt ")[0] if d.kind == "receipt" else d.title
        name = " ".join(key.replace("Project ", "").split()[:2])
        assert name not in firsts, (name, d.id, firsts.get(name))
        firsts[name] = d.id


def test_refuses_to_replace_a_foreign_directory(tmp_path: Path) -> None:
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a document set"):
        make_docs(foreign, 2, seed=0, scale=0.1)
    assert (foreign / "notes.txt").exists()


def test_replaces_an_earlier_set(tmp_path: Path) -> None:
    make_docs(tmp_path / "set", 4, seed=0, scale=0.1)
    docs = make_docs(tmp_path / "set", 2, seed=1, scale=0.1)
    assert len(list((tmp_path / "set" / "images").iterdir())) == 2 == len(docs.corpus)


def test_reader_reports_bad_sets(docs_copy) -> None:
    root = docs_copy.root
    (root / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\nq-x\tpage-0000\t1\n")
    with pytest.raises(ValueError, match="unknown query or page"):
        read_docset(root)
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["format"] = "other/9"
    (root / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="format 'other/9'"):
        read_docset(root)
    with pytest.raises(FileNotFoundError, match="make-docs"):
        read_docset(root / "images")


def test_revision_follows_content(docs_copy) -> None:
    before = docs_copy.revision()
    image = docs_copy.image_path(docs_copy.corpus[0])
    image.write_bytes(image.read_bytes() + b"\0")
    assert docs_copy.revision() != before
