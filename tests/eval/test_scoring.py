import math

import numpy as np
import pytest

from eval import scoring


def _rows(rng: np.random.Generator, n: int, dim: int = 8) -> np.ndarray:
    x = rng.standard_normal((n, dim))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_maxsim_matrix_equals_the_definition() -> None:
    rng = np.random.default_rng(0)
    queries = [_rows(rng, n) for n in (1, 3, 7)]
    docs = [_rows(rng, n) for n in (2, 9, 4, 1)]
    got = scoring.maxsim_matrix(queries, docs)
    for i, q in enumerate(queries):
        for j, d in enumerate(docs):
            expected = sum(max(float(qr @ dr) for dr in d) for qr in q)
            assert got[i, j] == pytest.approx(expected, abs=1e-12)
            assert scoring.maxsim(q, d) == pytest.approx(expected, abs=1e-12)


def test_maxsim_keeps_negative_row_maxima() -> None:
    """A zero-padded document would turn this -1 into 0; the score must stay -1."""
    q = np.array([[1.0, 0.0]])
    short = np.array([[-1.0, 0.0]])
    long = np.array([[-1.0, 0.0], [-1.0, 0.0], [-1.0, 0.0]])
    assert scoring.maxsim_matrix([q], [short, long]).tolist() == [[-1.0, -1.0]]


def test_maxsim_rejects_empty_inputs() -> None:
    with pytest.raises(ValueError, match="at least one row"):
        scoring.maxsim_matrix([np.zeros((0, 4))], [np.ones((2, 4))])


def test_cosine_and_row_cosines() -> None:
    a = np.array([[3.0, 4.0], [1.0, 0.0]])
    b = np.array([[6.0, 8.0], [0.0, 2.0]])
    np.testing.assert_allclose(scoring.cosine_matrix(a, b), [[1.0, 0.8], [0.6, 0.0]])
    np.testing.assert_allclose(scoring.row_cosines(a, b), [1.0, 0.0])
    np.testing.assert_allclose(scoring.dot_matrix(a, b), [[50.0, 8.0], [6.0, 0.0]])
    with pytest.raises(ValueError, match="equal shapes"):
        scoring.row_cosines(a, b[:1])


def test_rank_ties_follow_pytrec_eval() -> None:
    """Equal scores: descending document id, as trec_eval sorts."""
    assert scoring.rank_documents([0.5, 0.9, 0.5, 0.1], ["a", "b", "c", "d"]) == [
        "b",
        "c",
        "a",
        "d",
    ]


def test_ndcg_and_recall_known_values() -> None:
    ranked = ["x", "rel", "y", "z", "w", "rel2"]
    qrels = {"rel": 1, "rel2": 1}
    # DCG = 1/log2(3); IDCG = 1 + 1/log2(3)
    expected = (1 / math.log2(3)) / (1 + 1 / math.log2(3))
    assert scoring.ndcg_at_k(ranked, qrels, 5) == pytest.approx(expected)
    assert scoring.recall_at_k(ranked, qrels, 5) == 0.5
    assert scoring.recall_at_k(ranked, qrels, 6) == 1.0
    assert scoring.ndcg_at_k(["rel"], {"rel": 1}, 5) == 1.0
    assert scoring.ndcg_at_k(["a"], {}, 5) == 0.0
    assert scoring.recall_at_k(["a"], {"b": 0}, 5) == 0.0


def test_rank_correlations_match_scipy_and_own_fallback() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal(40)
    b = a + 0.5 * rng.standard_normal(40)
    b[:5] = b[5]  # ties
    assert scoring._spearman_own(a, b) == pytest.approx(scoring.spearman(a, b), abs=1e-12)
    assert scoring._kendall_own(a, b) == pytest.approx(scoring.kendall_tau(a, b), abs=1e-12)
    assert scoring.spearman(a, a) == pytest.approx(1.0)
    assert scoring.kendall_tau(a, -a) == pytest.approx(-1.0)
    assert math.isnan(scoring.spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert math.isnan(scoring.kendall_tau([1.0], [2.0]))
