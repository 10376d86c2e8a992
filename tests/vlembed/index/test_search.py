"""Search and similarity maps on a fake-client index: scores are MaxSim on the stored rows."""

from __future__ import annotations

import numpy as np
import pytest

from tests.vlembed.index.conftest import noise_image
from vlembed.index import Index, StorageOptions
from vlembed.index.maxsim import maxsim


@pytest.fixture
def images(tmp_path):
    paths = []
    for i in range(6):
        p = tmp_path / f"img{i}.png"
        noise_image(56 + 28 * i, 84, i).save(p)
        paths.append(p)
    return paths


def _page_rows(client, path) -> np.ndarray:
    (rows,) = client.embed([path.read_bytes()], task="retrieval.passage", multivector=True)
    return rows


def test_scores_are_exact_maxsim_in_descending_order(images, tmp_path, fake_client):
    index = Index(tmp_path / "idx")
    index.add(images, client=fake_client)
    hits = index.search("where is the total", k=4, client=fake_client)
    (q,) = fake_client.embed(["where is the total"], task="retrieval.query", multivector=True)
    by_hand = sorted((maxsim(q, _page_rows(fake_client, p)), str(p)) for p in images)[::-1]
    assert [(h.source, h.page) for h in hits] == [(s, 1) for _, s in by_hand[:4]]
    for hit, (score, _) in zip(hits, by_hand, strict=False):
        assert hit.score == pytest.approx(score, abs=1e-5)
    assert index.thumbnail(hits[0])[:8] == b"\x89PNG\r\n\x1a\n"


def test_similarity_map_covers_the_image_grid(images, tmp_path, fake_client):
    index = Index(tmp_path / "idx")
    index.add(images[2:3], client=fake_client)  # 112 x 84 -> grid 3 x 4
    (hit,) = index.search("a query", k=1, client=fake_client)
    smap = index.similarity_map(hit, "a query", client=fake_client)
    (q,) = fake_client.embed(["a query"], task="retrieval.query", multivector=True)
    rows = _page_rows(fake_client, images[2])
    np.testing.assert_allclose(smap.matrix, q @ rows.T, atol=1e-6)
    assert smap.grid == (3, 4) and smap.image_row_start == 4
    np.testing.assert_allclose(smap.image_map, (q @ rows[4:16].T).max(0).reshape(3, 4), atol=1e-6)
    assert float(smap.matrix.max(axis=1).sum()) == pytest.approx(hit.score, abs=1e-5)


def test_pooled_binary_index_scores_stored_rows_and_maps_every_token(images, tmp_path, fake_client):
    index = Index(tmp_path / "idx")
    index.add(images, client=fake_client, options=StorageOptions(pool_factor=2, binary=True))
    hits = index.search("query words here", k=3, client=fake_client)
    assert len(hits) == 3 and hits[0].score >= hits[1].score >= hits[2].score
    smap = index.similarity_map(hits[0], "query words here", client=fake_client)
    n_rows = _page_rows(fake_client, __import__("pathlib").Path(hits[0].source)).shape[0]
    assert smap.matrix.shape[1] == n_rows  # expanded back to every original row
    assert float(smap.matrix.max(axis=1).sum()) == pytest.approx(hits[0].score, abs=1e-4)


def test_ann_index_is_built_once_the_table_is_large(images, tmp_path, fake_client):
    index = Index(tmp_path / "idx")
    index.add(images, client=fake_client)
    assert not index.store.has_ann()
    assert index.store.build_ann(min_rows=6)
    assert index.store.has_ann()
    assert len(index.search("q", k=2, client=fake_client)) == 2
