"""The parity report: reference against itself is exact; a perturbed variant shows up."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("matplotlib", reason="needs the eval extra (matplotlib)")

from eval.backends import parse_spec  # noqa: E402
from eval.parity import (  # noqa: E402
    IMAGE_PREFIX_TOKENS,
    IMAGE_SUFFIX_TOKENS,
    image_token_grid,
    image_token_rows,
    run_parity,
)


def test_image_token_layout_matches_the_reference(tiny_backend, small_docs) -> None:
    """4 template tokens, then the merged grid from smart_resize, then 7 template tokens."""
    embedder = tiny_backend.embedder
    tall_and_wide = [d for d in small_docs.corpus if d.kind in ("receipt", "slide")][:2]
    for doc in tall_and_wide:
        enc = embedder.encode_image(small_docs.load_image(doc))
        gh, gw = image_token_grid(doc.width, doc.height, embedder.min_pixels, embedder.max_pixels)
        _, grid = embedder.image_inputs(small_docs.load_image(doc))
        assert (gh, gw) == (grid[1] // 2, grid[2] // 2)
        positions = np.flatnonzero(enc.image_token_mask)
        assert positions.tolist() == list(range(IMAGE_PREFIX_TOKENS, IMAGE_PREFIX_TOKENS + gh * gw))
        assert len(enc.token_ids) == IMAGE_PREFIX_TOKENS + gh * gw + IMAGE_SUFFIX_TOKENS
        rows = image_token_rows(enc.multi, (gh, gw))
        assert rows.shape == (gh, gw, enc.multi.shape[1])
        np.testing.assert_array_equal(rows.reshape(gh * gw, -1), enc.multi[enc.image_token_mask])
    with pytest.raises(ValueError, match="expected"):
        image_token_rows(np.zeros((10, 4)), (2, 2))


def _strict_json(path: Path) -> dict:
    def reject(token: str) -> None:
        raise AssertionError(f"non-standard JSON constant {token}")

    return json.loads(path.read_text(), parse_constant=reject)


def test_reference_against_itself_is_exact(tiny_backend, small_docs, tmp_path: Path) -> None:
    specs = [parse_spec("reference:ckpt"), parse_spec("again=reference:ckpt")]
    data = run_parity(specs, [tiny_backend, tiny_backend], small_docs, tmp_path, n_heatmaps=2)
    agreement = data["agreement"]["again"]
    for key in ("single_cosine_pages", "single_cosine_queries"):
        assert agreement[key]["min"] == pytest.approx(1.0, abs=1e-6)
    for key in ("row_cosine_pages", "row_cosine_queries"):
        assert agreement[key]["min"] == pytest.approx(1.0, abs=1e-6)
        assert agreement[key]["mismatched"] == 0
    for key in ("single_scores", "maxsim_scores"):
        assert agreement[key]["abs_diff"]["max"] == 0.0
        assert agreement[key]["spearman"]["min"] == pytest.approx(1.0)
        assert agreement[key]["kendall"]["min"] == pytest.approx(1.0)
        assert agreement[key]["top1_agreement"] == 1.0
    assert data["retrieval"]["reference"] == data["retrieval"]["again"]

    on_disk = _strict_json(tmp_path / "parity.json")
    assert on_disk["baseline"] == "reference"
    assert set(on_disk["agreement"]["again"]["single_cosine_pages"]["per_item"]) == {
        d.id for d in small_docs.corpus
    }
    drawn = on_disk["heatmaps"]["again"]
    assert len(drawn) == 2 and all((tmp_path / h["path"]).is_file() for h in drawn)
    assert all(h["max_distance"] < 1e-6 for h in drawn)
    md = (tmp_path / "parity.md").read_text()
    assert "| Page kind | reference | again |" in md
    assert "| Mean |" in md and "## Agreement with reference" in md


class Perturbed:
    """The reference with noise on some outputs: a stand-in for a quantised variant."""

    def __init__(self, inner, scale: float, drop_row: bool = False) -> None:
        self.inner, self.scale, self.drop_row = inner, scale, drop_row
        self.name, self.revision, self.n_parameters = "perturbed", None, None

    def embed(self, items, *, task, multivector, dimensions=None):
        out = []
        for i, v in enumerate(self.inner.embed(items, task=task, multivector=multivector)):
            noise = np.random.default_rng(i).standard_normal(v.shape)
            w = v + self.scale * noise
            w /= np.linalg.norm(w, axis=-1, keepdims=True)
            if multivector and self.drop_row:
                w = w[:-1]
            out.append(w.astype(np.float32))
        return out

    def close(self) -> None:
        pass


def test_perturbed_variant_is_measured(tiny_backend, small_docs, tmp_path: Path) -> None:
    specs = [parse_spec("reference"), parse_spec("noisy=http://variant:1")]
    data = run_parity(
        specs, [tiny_backend, Perturbed(tiny_backend, 0.01)], small_docs, tmp_path, n_heatmaps=1
    )
    agreement = data["agreement"]["noisy"]
    assert 0.9 < agreement["single_cosine_pages"]["mean"] < 0.9999
    assert 0.9 < agreement["row_cosine_pages"]["min"] < 0.9999
    assert agreement["maxsim_scores"]["abs_diff"]["max"] > 0
    (heatmap,) = data["heatmaps"]["noisy"]
    assert heatmap["max_distance"] > 1e-4
    assert (tmp_path / heatmap["path"]).is_file()


def test_row_count_mismatch_is_reported_not_fatal(tiny_backend, small_docs, tmp_path: Path):
    specs = [parse_spec("reference"), parse_spec("short=http://variant:2")]
    variant = Perturbed(tiny_backend, 0.0, drop_row=True)
    data = run_parity(specs, [tiny_backend, variant], small_docs, tmp_path, n_heatmaps=1)
    rows = data["agreement"]["short"]["row_cosine_pages"]
    assert rows["mismatched"] == len(small_docs.corpus)
    assert "row shapes differ" in next(iter(rows["per_item"].values()))["error"]
    assert "expected" in data["heatmaps"]["short"][0]["error"]
