"""Search over a document index, in the service: validated query -> query vectors -> hits.

``vlembed serve --index DIR`` opens an index built by ``vlembed index`` (read-only: nothing
here writes to it) and refuses to start when the index holds another model's pages. A search
embeds its query through the service's own pipeline (:class:`EmbeddingService`, in-process, a
``retrieval.query`` single vector and multi-vector), takes the nearest single vectors (with the
client's filter as a LanceDB prefilter built here from validated fields, never from client
SQL), reranks them by exact MaxSim on the stored rows, and on request returns each hit's match
map. The same steps as ``vlembed.Index.search``, on the stored rows as stored.

``vlembed.index`` (and LanceDB) are imported only when an index is opened: a service without
``--index`` never loads them. No FastAPI here; ``api/search.py`` is the glue.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from preprocess_service.api.protocol import EmbeddingRequest
from preprocess_service.api.search_protocol import SearchFilter, SearchRequest
from preprocess_service.embedder import EmbeddingService
from preprocess_service.prompts import text_prompt
from preprocess_service.validate import Limits, ValidRequest, resolve_task, validate
from vlembed.errors import InvalidInputError, VlembedError
from vlembed.manifest import Manifest

if TYPE_CHECKING:
    from vlembed.index.search import SimilarityMap
    from vlembed.index.store import PageStore

__all__ = [
    "FoundPage",
    "IndexOpenError",
    "QUERY_TASK",
    "SearchResult",
    "SearchService",
    "ValidSearch",
    "served_revision",
    "where_clause",
]

QUERY_TASK = "retrieval.query"
PAGE_ID = re.compile(r"^[0-9a-f]{1,64}$")
_COLUMNS = (
    "id",
    "source",
    "page",
    "width",
    "height",
    "mv",
    "mv_rows",
    "mv_labels",
    "n_rows",
    "image_row_start",
    "grid_h",
    "grid_w",
)


class IndexOpenError(ValueError):
    """The index cannot be served: missing, not an index, or built with another model."""


def served_revision(manifest: Manifest) -> str | None:
    """The revision ``/v1/models`` reports (and ``vlembed index`` records in an index)."""
    return manifest.source_fingerprint[:16] or None


@dataclass(frozen=True)
class ValidSearch:
    """A search request checked against the served model, ready to run."""

    query: str
    k: int
    where: str | None
    match_map: bool
    request: ValidRequest  # the query's multi-vector and single vector (retrieval.query)


@dataclass(frozen=True)
class FoundPage:
    """One hit, with its match map when one was asked for."""

    id: str
    source: str
    page: int
    score: float
    width: int
    height: int
    similarity: SimilarityMap | None = None


@dataclass(frozen=True)
class SearchResult:
    hits: list[FoundPage]
    query_tokens: list[str] | list[int]
    n_tokens: int


def _like_literal(text: str) -> str:
    """``text`` as a LIKE pattern matching it anywhere, quoted, with ``\\`` as the escape."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return "'%" + escaped.replace("'", "''") + "%'"


def where_clause(f: SearchFilter | None) -> str | None:
    """The LanceDB filter of a validated :class:`SearchFilter` (None: every page)."""
    if f is None:
        return None
    parts = []
    if f.source is not None:
        parts.append(f"source LIKE {_like_literal(f.source)} ESCAPE '\\'")
    if f.page_min is not None:
        parts.append(f"page >= {int(f.page_min)}")
    if f.page_max is not None:
        parts.append(f"page <= {int(f.page_max)}")
    return " AND ".join(parts) or None


def _check_filter(f: SearchFilter | None) -> None:
    if f is None:
        return
    if f.source is not None and any(ord(c) < 0x20 or ord(c) == 0x7F for c in f.source):
        raise InvalidInputError(
            "filter.source must not contain control characters", param="filter.source"
        )
    if f.page_min is not None and f.page_max is not None and f.page_min > f.page_max:
        raise InvalidInputError(
            f"filter.page_min ({f.page_min}) is greater than filter.page_max ({f.page_max})",
            param="filter.page_max",
        )


def _as_query_param(exc: VlembedError) -> VlembedError:
    """Errors the embeddings validation names ``input`` are about the search's ``query``."""
    if exc.param and exc.param.startswith("input"):
        exc.param = "query" + exc.param[len("input") :]
        exc.args = (f"query: {exc}",)
    return exc


@dataclass
class SearchService:
    """An index opened read-only, searched with the service's own embedding pipeline."""

    store: PageStore
    embedder: EmbeddingService
    limits: Limits

    @classmethod
    def open(cls, path: Path, embedder: EmbeddingService, limits: Limits) -> SearchService:
        """Open the index at ``path`` for the model ``embedder`` serves, or say why not.

        Raises:
            IndexOpenError: No index there, or it holds pages of another model or revision,
                or the service cannot embed retrieval queries as multi-vectors.
        """
        from vlembed.index.store import META_FILE, PageStore

        m = embedder.model.manifest
        path = Path(path).expanduser().resolve()
        if not (path / META_FILE).is_file():
            raise IndexOpenError(
                f"--index {path}: not a vlembed index (no {META_FILE}); build one with "
                f"`vlembed index PATH... --index {path}` and the same --model"
            )
        try:
            resolve_task(QUERY_TASK, m, embedder.served_tasks)
        except InvalidInputError as exc:
            raise IndexOpenError(f"--index needs the {QUERY_TASK} task served: {exc}") from exc
        if not m.multi_vector_dim:
            raise IndexOpenError("--index needs a model with a multi-vector projector")
        store = PageStore(path)
        meta = store.meta
        assert meta is not None
        want = (m.model_name, served_revision(m))
        if (meta.model, meta.revision) != want:
            raise IndexOpenError(
                f"--index {path} was built with model {meta.model!r} revision "
                f"{meta.revision!r}; this service serves {want[0]!r} revision {want[1]!r}: "
                "its query vectors would not be comparable. Serve that model, or re-index"
            )
        dim = max(m.matryoshka_dims) if m.matryoshka_dims else None
        if (meta.dim, meta.multi_dim) != (dim, m.multi_vector_dim):
            raise IndexOpenError(
                f"--index {path} stores {meta.dim}-d vectors and {meta.multi_dim}-d rows; "
                f"the served model returns {dim} and {m.multi_vector_dim}"
            )
        return cls(store=store, embedder=embedder, limits=limits)

    @property
    def path(self) -> Path:
        return self.store.path

    def validate(self, req: SearchRequest) -> ValidSearch:
        """Every check that needs no I/O, before any work; errors name the field."""
        if not req.query.strip():
            raise InvalidInputError("query must not be empty", param="query")
        _check_filter(req.filter)
        svc = self.embedder
        wire = EmbeddingRequest(
            input=req.query, task=QUERY_TASK, return_multivector=True, return_single_vector=True
        )
        try:
            request = validate(wire, svc.model.manifest, svc.served_tasks, self.limits)
        except VlembedError as exc:
            raise _as_query_param(exc) from None
        return ValidSearch(
            query=req.query,
            k=req.k,
            where=where_clause(req.filter),
            match_map=req.match_map,
            request=request,
        )

    async def search(self, valid: ValidSearch) -> SearchResult:
        """The ``k`` best pages by MaxSim among the nearest single vectors (filtered)."""
        try:
            (result,) = await self.embedder.embed(valid.request)
        except VlembedError as exc:
            raise _as_query_param(exc) from None
        assert result.single is not None  # asked for with the multi-vector
        hits = await asyncio.to_thread(
            self._rank, result.single, result.vector, valid.k, valid.where, valid.match_map
        )
        tokens = self._tokens(valid, result.vector.shape[0])
        return SearchResult(hits=hits, query_tokens=tokens, n_tokens=result.n_tokens)

    def _tokens(self, valid: ValidSearch, n_rows: int) -> list[str] | list[int]:
        """The query prompt's tokens as text, one per multi-vector row (else their indices)."""
        opts = valid.request.options
        (text,) = text_prompt(valid.query, opts.adapter_task, opts.role).segments
        tokenizer = self.embedder.model.tokenizer
        ids = tokenizer.encode(str(text), add_special_tokens=False).ids
        if len(ids) != n_rows:
            return list(range(n_rows))
        return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]

    def _rank(
        self, single: np.ndarray, multi: np.ndarray, k: int, where: str | None, maps: bool
    ) -> list[FoundPage]:
        from vlembed.index.codec import decode_labels, decode_rows
        from vlembed.index.maxsim import maxsim, similarity_matrix
        from vlembed.index.search import SimilarityMap, default_candidates

        store, meta = self.store, self.store.meta
        table = store.table
        if table is None or meta is None:
            return []
        query = (
            table.search(np.asarray(single, np.float32), vector_column_name="vector")
            .distance_type("dot")
            .limit(max(default_candidates(k), k))
            .select([*_COLUMNS, "_distance"])
        )
        if where is not None:
            query = query.where(where, prefilter=True)
        if store.has_ann():
            query = query.nprobes(32).refine_factor(4)
        rows = query.to_arrow().to_pydict()
        binary = meta.options.binary
        scored = []
        for i in range(len(rows["id"])):
            page_rows = decode_rows(rows["mv"][i], rows["mv_rows"][i], meta.multi_dim, binary)
            scored.append((maxsim(multi, page_rows), rows["source"][i], int(rows["page"][i]), i))
        scored.sort(key=lambda s: (-s[0], s[1], s[2]))
        hits = []
        for score, source, page, i in scored[:k]:
            similarity = None
            if maps:
                page_rows = decode_rows(rows["mv"][i], rows["mv_rows"][i], meta.multi_dim, binary)
                labels = decode_labels(rows["mv_labels"][i], rows["n_rows"][i])
                matrix = similarity_matrix(multi, page_rows)[:, labels]
                similarity = SimilarityMap(
                    matrix=matrix,
                    row_max=matrix.max(axis=0),
                    image_row_start=int(rows["image_row_start"][i]),
                    grid=(int(rows["grid_h"][i]), int(rows["grid_w"][i])),
                )
            hits.append(
                FoundPage(
                    id=rows["id"][i],
                    source=source,
                    page=page,
                    score=score,
                    width=int(rows["width"][i]),
                    height=int(rows["height"][i]),
                    similarity=similarity,
                )
            )
        return hits

    async def thumbnail(self, page_id: str) -> bytes | None:
        """PNG bytes of a page's thumbnail; None when no page has this id."""
        if not PAGE_ID.match(page_id):
            raise InvalidInputError(
                f"page id {page_id[:80]!r} is not an id from a search hit", param="id"
            )
        rows = await asyncio.to_thread(self.store.rows, [page_id], ("thumbnail",))
        return rows["thumbnail"][0] if rows["thumbnail"] else None
