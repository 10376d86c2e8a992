from __future__ import annotations

import numpy as np
import pytest

from vlembed.index.maxsim import maxsim, sign_rows, similarity_matrix


def test_maxsim_is_sum_over_query_rows_of_best_page_row() -> None:
    rng = np.random.default_rng(0)
    q = rng.standard_normal((5, 8)).astype(np.float32)
    d = rng.standard_normal((11, 8)).astype(np.float32)
    by_hand = sum(max(float(qi @ dj) for dj in d) for qi in q)
    assert maxsim(q, d) == pytest.approx(by_hand, rel=1e-6)


def test_similarity_matrix_shape_and_dim_check() -> None:
    assert similarity_matrix(np.ones((2, 4)), np.ones((3, 4))).shape == (2, 3)
    with pytest.raises(ValueError, match="one dim"):
        similarity_matrix(np.ones((2, 4)), np.ones((3, 5)))


def test_sign_rows_unpack_msb_first_as_plus_minus_one() -> None:
    rows = np.array([[0.5, -1, 2, -3, 0.1, 0.1, -0.1, 1, -1, 1]], dtype=np.float32)
    packed = np.packbits(rows > 0, axis=1)
    assert packed.shape == (1, 2)
    np.testing.assert_array_equal(sign_rows(packed, 10), np.sign(rows))


def test_binary_dot_is_dim_minus_twice_hamming() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((2, 128))
    sa, sb = np.sign(a), np.sign(b)
    hamming = int(np.count_nonzero((a > 0) != (b > 0)))
    assert float(sa @ sb) == 128 - 2 * hamming
