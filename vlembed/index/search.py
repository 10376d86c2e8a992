"""Two-stage search: nearest single vectors, then exact MaxSim on the stored multi-vectors.

The first stage (LanceDB vector search on the 2048-d page vectors; ANN once the table is large)
only picks candidates, ``max(4k, 50)`` of them by default; the order the user sees is MaxSim,
computed here in float32 on the rows as stored (pooled and/or sign bits).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from vlembed.index.codec import decode_labels, decode_rows
from vlembed.index.maxsim import maxsim, similarity_matrix
from vlembed.index.store import PageStore

__all__ = ["Hit", "SimilarityMap", "default_candidates", "page_similarity", "rerank"]

_RERANK_COLUMNS = ("id", "source", "page", "content_hash", "mv", "mv_rows")


@dataclasses.dataclass(frozen=True)
class Hit:
    """One search result.

    Attributes:
        source: Absolute path of the file.
        page: 1-based page number.
        score: MaxSim of the query with the page's stored rows.
        id: Row id; :meth:`vlembed.Index.thumbnail` and :meth:`~vlembed.Index.similarity_map`
            take it.
        content_hash: SHA-256 of the file when it was indexed.
    """

    source: str
    page: int
    score: float
    id: str
    content_hash: str

    def to_json(self) -> dict[str, object]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class SimilarityMap:
    """How much each token of a page matches a query (what a heatmap is drawn from).

    Attributes:
        matrix: ``[n_query_rows, n_page_rows]`` dot products over the page's original rows (a
            pooled page repeats its cluster's value for every row of the cluster).
        row_max: ``[n_page_rows]``: for each page row, the max over query rows.
        image_row_start: Index of the first image row in the page's rows.
        grid: ``(rows, cols)`` of merged image tokens; ``rows * cols`` image rows follow
            ``image_row_start``.
    """

    matrix: np.ndarray
    row_max: np.ndarray
    image_row_start: int
    grid: tuple[int, int]

    @property
    def image_map(self) -> np.ndarray:
        """``row_max`` of the image rows, laid out as the page's ``grid``."""
        n = self.grid[0] * self.grid[1]
        start = self.image_row_start
        return self.row_max[start : start + n].reshape(self.grid)


def default_candidates(k: int) -> int:
    return max(4 * k, 50)


def rerank(
    store: PageStore, single: np.ndarray, multi: np.ndarray, k: int, candidates: int
) -> list[Hit]:
    """The ``k`` best pages by MaxSim among the ``candidates`` nearest single vectors."""
    if store.meta is None:
        return []
    binary = store.meta.options.binary
    dim = store.meta.multi_dim
    rows = store.nearest(single, max(candidates, k), _RERANK_COLUMNS)
    hits = []
    for i in range(len(rows["id"])):
        page_rows = decode_rows(rows["mv"][i], rows["mv_rows"][i], dim, binary)
        hits.append(
            Hit(
                source=rows["source"][i],
                page=int(rows["page"][i]),
                score=maxsim(multi, page_rows),
                id=rows["id"][i],
                content_hash=rows["content_hash"][i],
            )
        )
    hits.sort(key=lambda h: (-h.score, h.source, h.page))
    return hits[:k]


def page_similarity(store: PageStore, page_id: str, multi: np.ndarray) -> SimilarityMap:
    """The :class:`SimilarityMap` of one stored page for query rows ``multi``."""
    cols = ("mv", "mv_rows", "mv_labels", "n_rows", "image_row_start", "grid_h", "grid_w")
    rows = store.rows([page_id], cols)
    if not rows["mv"] or store.meta is None:
        raise KeyError(f"no page with id {page_id!r} in {store.path}")
    stored = decode_rows(
        rows["mv"][0], rows["mv_rows"][0], store.meta.multi_dim, store.meta.options.binary
    )
    labels = decode_labels(rows["mv_labels"][0], rows["n_rows"][0])
    matrix = similarity_matrix(multi, stored)[:, labels]
    return SimilarityMap(
        matrix=matrix,
        row_max=matrix.max(axis=0),
        image_row_start=int(rows["image_row_start"][0]),
        grid=(int(rows["grid_h"][0]), int(rows["grid_w"][0])),
    )
