"""Brute-force scoring: the definitions every other number in eval/ is checked against.

Everything here is plain numpy over small inputs, written for clarity rather than speed, so that
the MTEB wrapper's scores and the parity report can be verified line by line:

- single vector: cosine (and dot, which equals cosine for the L2-normalised vectors vlembed
  returns);
- multi-vector: MaxSim (ColBERT late interaction): for each query row the largest dot product
  over the document rows, summed over the query rows;
- ranking metrics: nDCG@k and recall@k with the definitions ``pytrec_eval`` (and therefore MTEB)
  uses, including its tie order (equal scores: document id descending);
- rank correlation of two score lists: Spearman's rho and Kendall's tau-b, from scipy when it is
  installed, otherwise from the small implementations below (they agree with scipy on ties).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

__all__ = [
    "cosine_matrix",
    "dot_matrix",
    "kendall_tau",
    "maxsim",
    "maxsim_matrix",
    "ndcg_at_k",
    "rank_documents",
    "recall_at_k",
    "row_cosines",
    "spearman",
]


def _as_2d(x: np.ndarray | Sequence[np.ndarray], dtype: type = np.float64) -> np.ndarray:
    arr = np.asarray(x, dtype=dtype)
    return arr.reshape(1, -1) if arr.ndim == 1 else arr


def dot_matrix(queries: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """``[n_queries, n_docs]`` dot products, in float64."""
    return _as_2d(queries) @ _as_2d(docs).T


def cosine_matrix(queries: np.ndarray, docs: np.ndarray) -> np.ndarray:
    """``[n_queries, n_docs]`` cosine similarities, in float64 (zero vectors give 0)."""
    q = _as_2d(queries)
    d = _as_2d(docs)
    qn = np.linalg.norm(q, axis=1, keepdims=True)
    dn = np.linalg.norm(d, axis=1, keepdims=True)
    return (q / np.where(qn == 0, 1, qn)) @ (d / np.where(dn == 0, 1, dn)).T


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of each row of ``a`` with the same row of ``b`` (shapes must match)."""
    a = _as_2d(a)
    b = _as_2d(b)
    if a.shape != b.shape:
        raise ValueError(f"row_cosines needs equal shapes, got {a.shape} and {b.shape}")
    na = np.linalg.norm(a, axis=1)
    nb = np.linalg.norm(b, axis=1)
    denom = np.where((na == 0) | (nb == 0), 1, na * nb)
    return np.einsum("ij,ij->i", a, b) / denom


def maxsim(query_rows: np.ndarray, doc_rows: np.ndarray) -> float:
    """MaxSim of one query against one document: sum over query rows of the best dot product."""
    return float((_as_2d(query_rows) @ _as_2d(doc_rows).T).max(axis=1).sum())


def maxsim_matrix(
    queries: Sequence[np.ndarray], docs: Sequence[np.ndarray], dtype: type = np.float64
) -> np.ndarray:
    """``[n_queries, n_docs]`` MaxSim scores for ragged multi-vector inputs.

    All query rows are stacked once and each document is scored against the stack with one
    matrix product; the per-row maxima are then summed per query. Nothing is padded, so a
    document's score never sees a fake zero row (a zero-padded document would clamp a query
    row whose best real dot product is negative at 0).

    Args:
        queries: One ``[n_rows, dim]`` array per query, each with at least one row.
        docs: One ``[n_rows, dim]`` array per document, each with at least one row.
        dtype: Arithmetic type; float64 for reference numbers, float32 for speed.
    """
    if not queries or not docs:
        return np.zeros((len(queries), len(docs)), dtype=dtype)
    q_list = [_as_2d(q, dtype) for q in queries]
    if any(len(q) == 0 for q in q_list) or any(len(d) == 0 for d in docs):
        raise ValueError("MaxSim needs at least one row per query and per document")
    stacked = np.concatenate(q_list, axis=0)
    starts = np.cumsum([0] + [len(q) for q in q_list[:-1]])
    out = np.empty((len(q_list), len(docs)), dtype=dtype)
    for j, doc in enumerate(docs):
        best = (stacked @ _as_2d(doc, dtype).T).max(axis=1)
        out[:, j] = np.add.reduceat(best, starts)
    return out


def rank_documents(scores: Sequence[float] | np.ndarray, doc_ids: Sequence[str]) -> list[str]:
    """Document ids by descending score; equal scores by descending id, as pytrec_eval does."""
    if len(scores) != len(doc_ids):
        raise ValueError(f"{len(scores)} scores for {len(doc_ids)} documents")
    order = sorted(range(len(doc_ids)), key=lambda i: doc_ids[i], reverse=True)
    order = sorted(order, key=lambda i: -float(scores[i]))
    return [doc_ids[i] for i in order]


def ndcg_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    """nDCG@k with linear gains (trec_eval's ``ndcg_cut``); 0 when nothing is relevant."""
    dcg = sum(qrels.get(doc, 0) / math.log2(i + 2) for i, doc in enumerate(ranked[:k]))
    ideal = sorted((rel for rel in qrels.values() if rel > 0), reverse=True)[:k]
    idcg = sum(rel / math.log2(i + 2) for i, rel in enumerate(ideal))
    return dcg / idcg if idcg > 0 else 0.0


def recall_at_k(ranked: Sequence[str], qrels: Mapping[str, int], k: int) -> float:
    """Share of the relevant documents (score > 0) found in the top k; 0 when none exist."""
    relevant = {doc for doc, rel in qrels.items() if rel > 0}
    if not relevant:
        return 0.0
    return len(relevant.intersection(ranked[:k])) / len(relevant)


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing the mean of the ranks they span."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _spearman_own(a: np.ndarray, b: np.ndarray) -> float:
    ra = _average_ranks(a)
    rb = _average_ranks(b)
    ra -= ra.mean()
    rb -= rb.mean()
    denom = math.sqrt(float(ra @ ra) * float(rb @ rb))
    return float(ra @ rb / denom) if denom > 0 else float("nan")


def _kendall_own(a: np.ndarray, b: np.ndarray) -> float:
    """Kendall's tau-b by counting pairs (O(n²): fine for the few hundred documents here)."""
    da = np.sign(a[:, None] - a[None, :])
    db = np.sign(b[:, None] - b[None, :])
    upper = np.triu_indices(len(a), k=1)
    da = da[upper]
    db = db[upper]
    concordant_minus_discordant = float((da * db).sum())
    n_a = float(np.count_nonzero(da))
    n_b = float(np.count_nonzero(db))
    denom = math.sqrt(n_a * n_b)
    return concordant_minus_discordant / denom if denom > 0 else float("nan")


def _rank_correlation(name: str, a, b, own, scipy_name: str) -> float:
    """Shared checks of the two rank correlations; scipy when installed, else our own."""
    x = np.asarray(a, dtype=np.float64)
    y = np.asarray(b, dtype=np.float64)
    if len(x) != len(y):
        raise ValueError(f"{name} needs equal lengths, got {len(x)} and {len(y)}")
    if len(x) < 2:
        return float("nan")
    try:
        import scipy.stats
    except ImportError:
        return own(x, y)
    if np.all(x == x[0]) or np.all(y == y[0]):
        return float("nan")  # scipy warns and returns NaN; say it without the warning
    return float(getattr(scipy.stats, scipy_name)(x, y).statistic)


def spearman(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Spearman's rank correlation of two equally long score lists (NaN if one is constant)."""
    return _rank_correlation("spearman", a, b, _spearman_own, "spearmanr")


def kendall_tau(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """Kendall's tau-b of two equally long score lists (NaN if one is constant)."""
    return _rank_correlation("kendall_tau", a, b, _kendall_own, "kendalltau")
