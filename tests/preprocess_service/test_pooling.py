import numpy as np
import pytest

from preprocess_service.pooling import Projector, single_vector
from vlembed.wire import CHUNK_IMAGE, CHUNK_TEXT, Chunk, Rows


def _rows() -> Rows:
    r = np.random.default_rng(1).standard_normal((10, 8)).astype(np.float32)
    # 3 text rows (…, <|vision_start|>), 4 image rows, 3 text rows (<|vision_end|>, …)
    return Rows(
        r, (Chunk(CHUNK_TEXT, 0, 3, -1), Chunk(CHUNK_IMAGE, 3, 4, 0), Chunk(CHUNK_TEXT, 7, 3, -1))
    )


def test_mean_over_all_rows_normalised() -> None:
    rows = _rows()
    want = rows.rows.mean(0)
    np.testing.assert_allclose(
        single_vector(rows, "all", None), want / np.linalg.norm(want), atol=1e-6
    )


def test_vision_span_includes_start_and_end_tokens() -> None:
    rows = _rows()
    want = rows.rows[2:8].mean(0)
    np.testing.assert_allclose(
        single_vector(rows, "vision", None), want / np.linalg.norm(want), atol=1e-6
    )


def test_matryoshka_truncates_before_normalising() -> None:
    rows = _rows()
    want = rows.rows.mean(0)[:4]
    got = single_vector(rows, "all", 4)
    assert got.shape == (4,)
    np.testing.assert_allclose(got, want / np.linalg.norm(want), atol=1e-6)
    raw = single_vector(rows, "all", None, normalize=False)
    np.testing.assert_allclose(raw, rows.rows.mean(0), atol=1e-6)


def test_unknown_pooling_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="all"):
        single_vector(_rows(), "cls", None)


def test_projector_rows_are_unit_norm(tmp_path) -> None:
    rng = np.random.default_rng(2)
    np.savez(
        tmp_path / "p.npz",
        weight=rng.standard_normal((3, 8)).astype(np.float32),
        bias=rng.standard_normal(3).astype(np.float32),
    )
    proj = Projector.load(tmp_path / "p.npz")
    out = proj(_rows().rows)
    assert out.shape == (10, 3)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(
        proj(_rows().rows, normalize=False), _rows().rows @ proj.weight.T + proj.bias, atol=1e-5
    )
