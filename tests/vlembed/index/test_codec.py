from __future__ import annotations

import math

import numpy as np
import pytest

from vlembed.index.codec import (
    StorageOptions,
    decode_labels,
    decode_rows,
    encode_rows,
    pool_rows,
    stored_rows,
)
from vlembed.index.maxsim import maxsim


def _rows(n: int, dim: int = 32, seed: int = 0) -> np.ndarray:
    rows = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


@pytest.mark.parametrize("factor", [2, 3, 4])
@pytest.mark.parametrize("method", ["ward", "average"])
def test_pooling_keeps_one_row_in_factor_as_unit_cluster_means(factor: int, method: str) -> None:
    rows = _rows(101)
    pooled, labels = pool_rows(rows, factor, method)
    assert pooled.shape == (math.ceil(101 / factor), 32)
    assert labels.shape == (101,) and labels.max() + 1 == pooled.shape[0]
    np.testing.assert_allclose(np.linalg.norm(pooled, axis=1), 1.0, atol=1e-6)
    for c in range(pooled.shape[0]):
        mean = rows[labels == c].mean(axis=0)
        np.testing.assert_allclose(pooled[c], mean / np.linalg.norm(mean), atol=1e-6)
    # deterministic, labels numbered by first appearance
    again, labels2 = pool_rows(rows, factor, method)
    np.testing.assert_array_equal(labels, labels2)
    first = [int(np.flatnonzero(labels == c)[0]) for c in range(pooled.shape[0])]
    assert first == sorted(first)


def test_pooling_merges_duplicate_rows_first() -> None:
    base = _rows(10)
    rows = np.repeat(base, 2, axis=0)  # every row twice: factor 2 recovers the originals
    pooled, labels = pool_rows(rows, 2)
    np.testing.assert_allclose(pooled, base, atol=1e-6)
    np.testing.assert_array_equal(labels, np.repeat(np.arange(10), 2))


def test_float_round_trip_is_exact_and_unpooled_has_no_labels() -> None:
    rows = _rows(20)
    enc = encode_rows(rows, StorageOptions())
    assert enc.labels == b"" and enc.n_rows == 20
    np.testing.assert_array_equal(decode_rows(enc.data, enc.n_rows, enc.dim, False), rows)
    np.testing.assert_array_equal(decode_labels(enc.labels, 20), np.arange(20))
    assert len(enc.data) == 20 * 32 * 4


def test_binary_rows_score_float_queries_against_signs() -> None:
    rows, q = _rows(20), _rows(4, seed=5)
    enc = encode_rows(rows, StorageOptions(binary=True))
    assert len(enc.data) == 20 * 32 // 8
    signs = decode_rows(enc.data, enc.n_rows, 32, True)
    np.testing.assert_array_equal(signs, np.where(rows > 0, 1.0, -1.0))
    assert maxsim(q, signs) == pytest.approx(float((q @ np.sign(rows).T).max(1).sum()), rel=1e-6)


def test_pooled_binary_keeps_labels_of_every_row() -> None:
    enc = encode_rows(_rows(30), StorageOptions(pool_factor=3, binary=True))
    assert enc.n_rows == 10
    assert decode_labels(enc.labels, 30).shape == (30,)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"pool_factor": 5}, "pool_factor"), ({"pool_method": "single"}, "pool_method")],
)
def test_invalid_options_name_the_allowed_values(kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        StorageOptions(**kwargs)


def test_options_round_trip_through_json() -> None:
    opts = StorageOptions(pool_factor=3, pool_method="average", binary=True)
    assert StorageOptions.from_dict(opts.to_dict()) == opts


@pytest.mark.parametrize(
    ("spec", "options"),
    [
        ("float32", StorageOptions()),
        ("binary", StorageOptions(binary=True)),
        ("pool2", StorageOptions(pool_factor=2)),
        ("pool3-average", StorageOptions(pool_factor=3, pool_method="average")),
        ("pool2+binary", StorageOptions(pool_factor=2, binary=True)),
        (" Pool4 + BINARY ", StorageOptions(pool_factor=4, binary=True)),
    ],
)
def test_storage_specs_parse_and_print_back(spec: str, options: StorageOptions) -> None:
    assert StorageOptions.parse(spec) == options
    assert StorageOptions.parse(options.spec) == options


@pytest.mark.parametrize("spec", ["pool5", "pool0", "pool", "int8", "pool2-median", ""])
def test_unknown_storage_specs_are_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        StorageOptions.parse(spec)


def test_stored_rows_are_what_search_scores() -> None:
    rows = _rows(40)
    assert np.array_equal(stored_rows(rows, StorageOptions()), rows)
    signs = stored_rows(rows, StorageOptions(binary=True))
    assert np.array_equal(signs, np.where(rows > 0, 1.0, -1.0).astype(np.float32))
    pooled = stored_rows(rows, StorageOptions(pool_factor=2))
    assert np.array_equal(pooled, pool_rows(rows, 2)[0])
