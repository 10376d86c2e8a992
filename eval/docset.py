"""The on-disk format of a local document-retrieval set (what ``vlembed eval make-docs`` writes).

A small BEIR/MTEB-retrieval-like layout that needs no library to read::

    DIR/manifest.json    {"format": "vlembed-docs/1", "seed": …, "n_pages": …, …}
    DIR/corpus.jsonl     {"id": "page-0000", "image": "images/page-0000.png", "kind": "report",
                          "width": 827, "height": 1169, "title": "…"}
    DIR/queries.jsonl    {"id": "q-0000-0", "text": "…?", "page": "page-0000",
                          "answer": "…", "fact": "table"}
    DIR/qrels.tsv        query-id <TAB> corpus-id <TAB> score   (header line first)
    DIR/images/*.png     the page images

Every query is answerable from exactly one page (``qrels`` has one line per query, score 1);
``answer`` and ``fact`` are for people reading the set, MTEB ignores them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

__all__ = ["FORMAT", "DocEntry", "DocSet", "QueryEntry", "read_docset", "write_docset"]

FORMAT = "vlembed-docs/1"
QRELS_HEADER = "query-id\tcorpus-id\tscore"


@dataclass(frozen=True)
class DocEntry:
    """One corpus page."""

    id: str
    image: str  # path relative to the set's root
    kind: str
    width: int
    height: int
    title: str


@dataclass(frozen=True)
class QueryEntry:
    """One query and the page that answers it."""

    id: str
    text: str
    page: str
    answer: str
    fact: str


@dataclass
class DocSet:
    """A document set in memory (page images are read on demand)."""

    root: Path
    manifest: dict[str, Any]
    corpus: list[DocEntry]
    queries: list[QueryEntry]
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)

    def image_path(self, doc: DocEntry) -> Path:
        return self.root / doc.image

    def load_image(self, doc: DocEntry) -> Image.Image:
        """The page as a fully loaded RGB image."""
        with Image.open(self.image_path(doc)) as im:
            return im.convert("RGB")

    def revision(self) -> str:
        """Content hash of the whole set (text files and image bytes), 12 hex digits."""
        h = hashlib.sha256()
        for name in ("manifest.json", "corpus.jsonl", "queries.jsonl", "qrels.tsv"):
            h.update((self.root / name).read_bytes())
        for doc in self.corpus:
            h.update(self.image_path(doc).read_bytes())
        return h.hexdigest()[:12]


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON: {exc}") from exc
    return rows


def read_docset(root: Path | str) -> DocSet:
    """Read and check a document set; errors name the file and what is wrong."""
    root = Path(root)
    manifest_path = root / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(
            f"{root} is not a document set (no manifest.json); create one with "
            "`vlembed eval make-docs --out DIR`"
        )
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{manifest_path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    try:
        corpus = [DocEntry(**row) for row in _read_jsonl(root / "corpus.jsonl")]
        queries = [QueryEntry(**row) for row in _read_jsonl(root / "queries.jsonl")]
    except TypeError as exc:
        raise ValueError(f"{root}: unexpected fields in corpus/queries: {exc}") from exc
    qrels: dict[str, dict[str, int]] = {}
    lines = (root / "qrels.tsv").read_text(encoding="utf-8").splitlines()
    if not lines or lines[0] != QRELS_HEADER:
        raise ValueError(f"{root / 'qrels.tsv'}: first line must be {QRELS_HEADER!r}")
    for n, line in enumerate(lines[1:], start=2):
        parts = line.split("\t")
        if len(parts) != 3:
            raise ValueError(f"{root / 'qrels.tsv'}:{n}: expected 3 tab-separated fields")
        qrels.setdefault(parts[0], {})[parts[1]] = int(parts[2])
    doc_ids = {d.id for d in corpus}
    query_ids = {q.id for q in queries}
    for qid, rels in qrels.items():
        if qid not in query_ids or not set(rels) <= doc_ids:
            raise ValueError(f"{root / 'qrels.tsv'}: {qid} refers to an unknown query or page")
    missing = [d.image for d in corpus if not (root / d.image).is_file()]
    if missing:
        raise FileNotFoundError(f"{root}: {len(missing)} page images missing, e.g. {missing[0]}")
    return DocSet(root=root, manifest=manifest, corpus=corpus, queries=queries, qrels=qrels)


def write_docset(
    root: Path,
    manifest: dict[str, Any],
    pages: list[tuple[DocEntry, Image.Image]],
    queries: list[QueryEntry],
) -> DocSet:
    """Write a set (images, jsonl, qrels, manifest) into an empty or absent ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    for doc, image in pages:
        image.save(root / doc.image, format="PNG")
    with (root / "corpus.jsonl").open("w", encoding="utf-8") as f:
        for doc, _ in pages:
            f.write(json.dumps(doc.__dict__, ensure_ascii=False) + "\n")
    with (root / "queries.jsonl").open("w", encoding="utf-8") as f:
        for q in queries:
            f.write(json.dumps(q.__dict__, ensure_ascii=False) + "\n")
    lines = [QRELS_HEADER] + [f"{q.id}\t{q.page}\t1" for q in queries]
    (root / "qrels.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (root / "manifest.json").write_text(
        json.dumps({"format": FORMAT, **manifest}, indent=2, sort_keys=True) + "\n",
        encoding="utf-8",
    )
    return read_docset(root)
