"""The page table on disk: an embedded LanceDB dataset plus a small JSON of index metadata.

One row per page. What makes indexing crash-safe lives in the data, not in a journal:

- every row carries its file's ``content_hash`` and ``n_pages``, and a file's pages are written
  by as few ``add`` calls as memory allows (one per file up to ``MAX_ROWS_PER_ADD`` pages);
  each ``add`` is one atomic Lance commit;
- :meth:`PageStore.file_states` tells, per source, which hash is stored and whether every page
  is there exactly once; the indexer deletes what is stale or partial before adding anything.

The metadata (model id and revision, widths, storage options) is written once, atomically
(temporary file + rename), when the first page is added; later adds must match it.

The location is a local directory or an object-store URI (``s3://bucket/index``, ``gs://…``,
``file:///…``): LanceDB writes both, and the metadata file of a URI is written with one
``pyarrow.fs`` put (atomic on object stores), credentials coming from the usual environment.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlembed.index.codec import StorageOptions

__all__ = [
    "ANN_MIN_ROWS",
    "FileState",
    "IndexMeta",
    "ModelMismatchError",
    "PageRecord",
    "PageStore",
    "is_uri",
]

TABLE = "pages"
META_FILE = "vlembed-index.json"
FORMAT = 1
ANN_MIN_ROWS = 5000  # below this an exact scan of the single vectors is fast enough
MAX_ROWS_PER_ADD = 128

os.environ.setdefault("LANCE_LOG", "error")  # lance's own WARN lines would break the progress bar


class ModelMismatchError(ValueError):
    """Pages from another model (or revision, or storage options) than the index was built with."""


@dataclasses.dataclass(frozen=True)
class IndexMeta:
    """What every row of an index shares; stored in ``vlembed-index.json``."""

    model: str
    revision: str | None
    dim: int
    multi_dim: int
    options: StorageOptions
    format: int = FORMAT

    def to_json(self) -> dict[str, Any]:
        return {
            "format": self.format,
            "model": self.model,
            "revision": self.revision,
            "dim": self.dim,
            "multi_dim": self.multi_dim,
            "storage": self.options.to_dict(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> IndexMeta:
        return cls(
            model=str(data["model"]),
            revision=data.get("revision"),
            dim=int(data["dim"]),
            multi_dim=int(data["multi_dim"]),
            options=StorageOptions.from_dict(data.get("storage", {})),
            format=int(data.get("format", FORMAT)),
        )


@dataclasses.dataclass
class PageRecord:
    """One row: a page, its vectors, and where it came from."""

    source: str
    page: int
    n_pages: int
    content_hash: str
    size: int
    width: int
    height: int
    grid_h: int
    grid_w: int
    image_row_start: int
    n_image_rows: int
    n_rows: int
    thumbnail: bytes
    vector: np.ndarray
    mv: bytes
    mv_rows: int
    mv_labels: bytes
    model: str
    revision: str

    @property
    def id(self) -> str:
        return page_id(self.source, self.content_hash, self.page)


@dataclasses.dataclass
class FileState:
    """What the table holds for one source."""

    hashes: set[str]
    pages: list[int]
    n_pages: set[int]

    def complete(self, content_hash: str) -> bool:
        """Exactly the pages 1..n of this one hash, each once."""
        if self.hashes != {content_hash} or len(self.n_pages) != 1:
            return False
        (n,) = self.n_pages
        return sorted(self.pages) == list(range(1, n + 1))


def page_id(source: str, content_hash: str, page: int) -> str:
    """Stable id of a stored page: what a hit carries to fetch its thumbnail and rows."""
    import hashlib

    key = f"{source}\0{content_hash}\0{page}".encode()
    return hashlib.sha1(key, usedforsecurity=False).hexdigest()[:20]


def is_uri(location: str) -> bool:
    """Whether an index location is a URI (``s3://…``) rather than a local path."""
    return "://" in location


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _schema(dim: int):
    import pyarrow as pa

    return pa.schema(
        [
            ("id", pa.string()),
            ("source", pa.string()),
            ("page", pa.int32()),
            ("n_pages", pa.int32()),
            ("content_hash", pa.string()),
            ("size", pa.int64()),
            ("width", pa.int32()),
            ("height", pa.int32()),
            ("grid_h", pa.int32()),
            ("grid_w", pa.int32()),
            ("image_row_start", pa.int32()),
            ("n_image_rows", pa.int32()),
            ("n_rows", pa.int32()),
            ("thumbnail", pa.binary()),
            ("vector", pa.list_(pa.float32(), dim)),
            ("mv", pa.large_binary()),
            ("mv_rows", pa.int32()),
            ("mv_labels", pa.binary()),
            ("model", pa.string()),
            ("revision", pa.string()),
        ]
    )


class PageStore:
    """The LanceDB table of an index directory (created on first write)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        import lancedb

        text = os.fspath(path)
        self.path: Path | str = text.rstrip("/") if is_uri(text) else Path(text)
        if isinstance(self.path, Path):
            self.path.mkdir(parents=True, exist_ok=True)
        self._db = lancedb.connect(str(self.path))
        self.meta = self._read_meta()
        self._table = None

    # --- metadata -------------------------------------------------------------------------

    def _read_meta(self) -> IndexMeta | None:
        if isinstance(self.path, str):
            from pyarrow import fs

            filesystem, where = fs.FileSystem.from_uri(f"{self.path}/{META_FILE}")
            try:
                with filesystem.open_input_stream(where) as fh:
                    return IndexMeta.from_json(json.loads(fh.read()))
            except FileNotFoundError:
                return None
        file = self.path / META_FILE
        if not file.exists():
            return None
        return IndexMeta.from_json(json.loads(file.read_text()))

    def _write_meta(self, meta: IndexMeta) -> None:
        data = json.dumps(meta.to_json(), indent=2)
        if isinstance(self.path, str):
            from pyarrow import fs

            filesystem, where = fs.FileSystem.from_uri(f"{self.path}/{META_FILE}")
            filesystem.create_dir(where.rsplit("/", 1)[0], recursive=True)
            with filesystem.open_output_stream(where) as fh:
                fh.write(data.encode())
            return
        fd, tmp = tempfile.mkstemp(dir=self.path, prefix=".meta-", suffix=".json")
        with os.fdopen(fd, "w") as fh:
            fh.write(data)
        os.replace(tmp, self.path / META_FILE)

    def ensure_meta(self, wanted: IndexMeta) -> IndexMeta:
        """Record ``wanted`` for a new index, or check it against the existing one."""
        if self.meta is None:
            self._write_meta(wanted)
            self.meta = wanted
            return wanted
        have = self.meta
        if (have.model, have.revision) != (wanted.model, wanted.revision):
            raise ModelMismatchError(
                f"index {self.path} holds pages of model {have.model!r} revision "
                f"{have.revision!r}; the service serves {wanted.model!r} revision "
                f"{wanted.revision!r}. Use another --index directory or the same model"
            )
        if (have.dim, have.multi_dim) != (wanted.dim, wanted.multi_dim):
            raise ModelMismatchError(
                f"index {self.path} stores {have.dim}-d vectors and {have.multi_dim}-d rows; "
                f"the service returns {wanted.dim} and {wanted.multi_dim}"
            )
        return have

    # --- table ----------------------------------------------------------------------------

    @property
    def table(self):
        """The page table, or None before the first page is written."""
        if self._table is None and TABLE in self._table_names():
            self._table = self._db.open_table(TABLE)
        return self._table

    def _table_names(self) -> list[str]:
        result = self._db.list_tables()
        names = getattr(result, "tables", result)
        return list(names)

    def count(self) -> int:
        return 0 if self.table is None else int(self.table.count_rows())

    def file_states(self) -> dict[str, FileState]:
        """Per source: stored hashes, page numbers (with repeats) and page counts."""
        table = self.table
        if table is None:
            return {}
        cols = ["source", "content_hash", "page", "n_pages"]
        data = table.search().select(cols).limit(None).to_arrow().to_pydict()
        states: dict[str, FileState] = {}
        for source, digest, page, n in zip(*(data[c] for c in cols), strict=True):
            state = states.setdefault(source, FileState(set(), [], set()))
            state.hashes.add(digest)
            state.pages.append(page)
            state.n_pages.add(n)
        return states

    def delete_sources(self, sources: Sequence[str]) -> None:
        if self.table is None or not sources:
            return
        for start in range(0, len(sources), 200):
            chunk = sources[start : start + 200]
            self.table.delete(f"source IN ({', '.join(_quote(s) for s in chunk)})")

    def add(self, records: Sequence[PageRecord]) -> None:
        """Append pages in one atomic commit."""
        if not records:
            return
        if self.meta is None:
            raise RuntimeError("ensure_meta() before adding pages")
        import pyarrow as pa

        schema = _schema(self.meta.dim)
        columns: dict[str, Any] = {"id": [r.id for r in records]}
        for field in schema.names[1:]:
            if field == "vector":
                flat = np.concatenate([np.asarray(r.vector, np.float32) for r in records])
                columns[field] = pa.FixedSizeListArray.from_arrays(pa.array(flat), self.meta.dim)
            else:
                columns[field] = pa.array(
                    [getattr(r, field) for r in records], schema.field(field).type
                )
        batch = pa.table(columns, schema=schema)
        if self.table is None:
            self._table = self._db.create_table(TABLE, data=batch, schema=schema)
        else:
            self.table.add(batch)

    # --- reading --------------------------------------------------------------------------

    def nearest(self, vector: np.ndarray, limit: int, columns: Sequence[str]) -> dict[str, list]:
        """Rows whose single vector has the largest dot product with ``vector``.

        Uses the ANN index when one exists (with a refine step on exact distances), an exact
        scan otherwise; rows added since the index was built are scanned exactly too.
        """
        table = self.table
        if table is None:
            return {c: [] for c in columns}
        query = (
            table.search(np.asarray(vector, np.float32), vector_column_name="vector")
            .distance_type("dot")
            .limit(limit)
            .select([*columns, "_distance"])  # named, or lance warns on every search
        )
        if self.has_ann():
            query = query.nprobes(32).refine_factor(4)
        return query.to_arrow().to_pydict()

    def rows(self, ids: Sequence[str], columns: Sequence[str]) -> dict[str, list]:
        """Rows by id (any order)."""
        if self.table is None or not ids:
            return {c: [] for c in columns}
        where = f"id IN ({', '.join(_quote(i) for i in ids)})"
        return (
            self.table.search()
            .where(where)
            .select(list(columns))
            .limit(None)
            .to_arrow()
            .to_pydict()
        )

    # --- ANN ------------------------------------------------------------------------------

    def has_ann(self) -> bool:
        table = self.table
        return table is not None and any(
            "vector" in list(getattr(ix, "columns", [])) for ix in table.list_indices()
        )

    def build_ann(self, min_rows: int = ANN_MIN_ROWS) -> bool:
        """Build (or refresh) the IVF-PQ index on the single vectors once the table is large.

        Returns whether an index was (re)built. An existing index is extended with
        ``optimize()`` instead of being retrained.
        """
        table = self.table
        n = self.count()
        if table is None or n < min_rows or self.meta is None:
            return False
        if self.has_ann():
            table.optimize()
            return True
        dim = self.meta.dim
        sub = next(s for s in (dim // 16, dim // 8, dim // 4, 1) if s >= 1 and dim % s == 0)
        from lancedb.index import IvfPq

        config = IvfPq(
            distance_type="dot", num_partitions=max(1, int(np.sqrt(n))), num_sub_vectors=sub
        )
        table.create_index("vector", config=config)
        return True
