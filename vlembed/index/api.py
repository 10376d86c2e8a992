"""``vlembed.Index``: the document index's Python API (the CLI is a thin layer over it)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from vlembed.client import Client
from vlembed.index.codec import StorageOptions
from vlembed.index.indexer import IndexReport, add_paths
from vlembed.index.search import Hit, SimilarityMap, default_candidates, page_similarity, rerank
from vlembed.index.store import IndexMeta, ModelMismatchError, PageStore

__all__ = ["DEFAULT_INDEX", "Index"]

DEFAULT_INDEX = "vlembed-index"
QUERY_TASK = "retrieval.query"


class Index:
    """A directory of indexed pages (LanceDB), searched with a running service.

    Args:
        path: Index directory; created on the first :meth:`add`.

    Example::

        with vlembed.Client("http://localhost:8000") as client:
            index = vlembed.Index("my-index")
            index.add(["reports/", "scans/*.png"], client=client)
            for hit in index.search("quarterly revenue", k=5, client=client):
                print(hit.source, hit.page, hit.score)
    """

    def __init__(self, path: str | os.PathLike[str] = DEFAULT_INDEX) -> None:
        self.store = PageStore(path)

    @property
    def path(self):
        return self.store.path

    @property
    def meta(self) -> IndexMeta | None:
        """Model, widths and storage options; None before the first page is added."""
        return self.store.meta

    def __len__(self) -> int:
        return self.store.count()

    def add(
        self,
        paths: Sequence[str | os.PathLike[str]],
        *,
        client: Client,
        options: StorageOptions | None = None,
        concurrency: int = 3,
        pages_per_request: int = 2,
        progress: bool = False,
    ) -> IndexReport:
        """Index PDFs, images, folders and globs; unchanged files are not embedded again.

        Args:
            paths: Files, folders (recursive) or glob patterns.
            client: The service that embeds the pages.
            options: Storage of multi-vectors, for a new index (default float32, unpooled);
                an existing index keeps its own and refuses different ones.
            concurrency: Requests in flight.
            pages_per_request: Pages per request.
            progress: Print a progress line on stderr.

        Raises:
            ModelMismatchError: The index was built with another model or revision.
        """
        return add_paths(
            self.store,
            paths,
            client,
            options,
            concurrency=concurrency,
            pages_per_request=pages_per_request,
            progress=progress,
        )

    def _check_client(self, client: Client) -> None:
        meta = self.store.meta
        if meta is not None and (meta.model, meta.revision) != (client.name, client.revision):
            raise ModelMismatchError(
                f"index {self.path} was built with model {meta.model!r} revision "
                f"{meta.revision!r}; the service serves {client.name!r} revision "
                f"{client.revision!r}: query vectors would not be comparable"
            )

    def query_vectors(self, query: str, client: Client) -> tuple[np.ndarray, np.ndarray]:
        """``(single [dim], multi [n, multi_dim])`` of a text query."""
        self._check_client(client)
        ((single, multi),) = client.embed_both([query], task=QUERY_TASK)
        return single, multi

    def search(
        self, query: str, *, k: int = 10, client: Client, candidates: int | None = None
    ) -> list[Hit]:
        """The ``k`` best pages for a text query, by MaxSim.

        Args:
            query: The question.
            k: Hits to return.
            client: The service that embeds the query (same model as the index).
            candidates: Pages the first stage passes to the MaxSim rerank
                (default ``max(4k, 50)``).
        """
        single, multi = self.query_vectors(query, client)
        return self.search_vectors(single, multi, k=k, candidates=candidates)

    def search_vectors(
        self, single: np.ndarray, multi: np.ndarray, *, k: int = 10, candidates: int | None = None
    ) -> list[Hit]:
        """:meth:`search` with query vectors computed elsewhere."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        return rerank(self.store, single, multi, k, candidates or default_candidates(k))

    def similarity_map(
        self, hit: Hit | str, query: str | np.ndarray, *, client: Client | None = None
    ) -> SimilarityMap:
        """Per-token match of a query with one page (for heatmaps).

        Args:
            hit: A hit or its id.
            query: The query text (then ``client`` is needed) or its multi-vector rows.
            client: The service, when ``query`` is a text.
        """
        if isinstance(query, str):
            if client is None:
                raise ValueError("a text query needs client= to be embedded")
            _, multi = self.query_vectors(query, client)
        else:
            multi = np.asarray(query, dtype=np.float32)
        return page_similarity(self.store, hit.id if isinstance(hit, Hit) else hit, multi)

    def thumbnail(self, hit: Hit | str) -> bytes:
        """PNG bytes of a page's thumbnail."""
        page_id = hit.id if isinstance(hit, Hit) else hit
        rows = self.store.rows([page_id], ("thumbnail",))
        if not rows["thumbnail"]:
            raise KeyError(f"no page with id {page_id!r} in {self.path}")
        return rows["thumbnail"][0]
