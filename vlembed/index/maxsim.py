"""Late-interaction scoring: MaxSim over float or sign-binarised page rows.

MaxSim (ColBERT, ColPali, jina-embeddings-v4): for each query row, the best dot product with
any page row, summed over the query rows. Binary pages are scored the published way, "binary
docs, float queries": each stored bit is read as +1/-1 and dotted with the float query row,
which keeps more of the float ranking than binarising the query too. Everything accumulates in
float32.
"""

from __future__ import annotations

import numpy as np

__all__ = ["maxsim", "sign_rows", "similarity_matrix"]


def sign_rows(packed: np.ndarray, dim: int) -> np.ndarray:
    """``[n, dim]`` float32 of +1/-1 from rows of sign bits packed MSB-first (``np.packbits``)."""
    bits = np.unpackbits(np.asarray(packed, dtype=np.uint8), axis=1, count=dim)
    return bits.astype(np.float32) * 2.0 - 1.0


def similarity_matrix(query: np.ndarray, page: np.ndarray) -> np.ndarray:
    """``[n_query_rows, n_page_rows]`` dot products (float32)."""
    q = np.asarray(query, dtype=np.float32)
    d = np.asarray(page, dtype=np.float32)
    if q.ndim != 2 or d.ndim != 2 or q.shape[1] != d.shape[1]:
        raise ValueError(f"need [n, dim] query and page rows of one dim; got {q.shape}, {d.shape}")
    return q @ d.T


def maxsim(query: np.ndarray, page: np.ndarray) -> float:
    """Sum over query rows of the max over page rows of the dot product."""
    return float(similarity_matrix(query, page).max(axis=1).sum(dtype=np.float32))
