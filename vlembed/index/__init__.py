"""Document retrieval over PDFs and images: ``vlembed index`` / ``vlembed search``.

Pages become one single vector and one multi-vector each (``retrieval.passage`` on a running
service) and are stored in an embedded LanceDB directory; search takes the nearest single
vectors and reranks them by exact MaxSim on the multi-vectors.

Modules, one stage each: ``sources`` (which files), ``pages`` (render), ``geometry`` (the
service's resize, client-side), ``layout`` (image rows in a multi-vector), ``codec`` (pooling,
sign bits), ``maxsim`` (scoring), ``store`` (LanceDB), ``indexer`` (add), ``search`` (query),
``service`` (a local ``vlembed serve``), ``progress``, ``api`` (:class:`Index`), ``cli``;
``pool`` (replicas with failover) and ``distributed`` (the same job on Ray, imported only by
``vlembed index --ray``). Needs the ``index`` extra (lancedb, pypdfium2, scipy), and the ``ray``
extra for ``--ray``.
"""

from __future__ import annotations

from vlembed.index.api import DEFAULT_INDEX, Index
from vlembed.index.codec import StorageOptions
from vlembed.index.indexer import IndexReport
from vlembed.index.search import Hit, SimilarityMap
from vlembed.index.store import IndexMeta, ModelMismatchError

__all__ = [
    "DEFAULT_INDEX",
    "Hit",
    "Index",
    "IndexMeta",
    "IndexReport",
    "ModelMismatchError",
    "SimilarityMap",
    "StorageOptions",
]
