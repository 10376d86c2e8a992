"""``POST /v1/search``, its thumbnails and the page's files, on the fake backend.

The index is written through the store layer with the tiny model's name, revision and widths
(random vectors); the query vectors come from the fake llama-server through the service's own
pipeline, so scores and match maps are checked against the same vectors fetched from
``/v1/embeddings``. The real service and a real browser: tests/integration/test_search_page.py.
"""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from preprocess_service.api.app import create_app
from preprocess_service.api.guard import GuardConfig
from preprocess_service.search import IndexOpenError, SearchService, served_revision
from preprocess_service.validate import Limits
from tests.preprocess_service.api.test_hardening import _shape_ok

GRID = (3, 4)
SOURCES = ["/docs/re%port_2021.pdf", "/docs/it's.png", "/docs/axb.pdf", "/docs/a_b.pdf"]


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (48, 64), (seed * 40 % 256, 90, 160)).save(buf, "PNG")
    return buf.getvalue()


def write_index(path: Path, manifest, model: str | None = None) -> list[str]:
    """Pages of SOURCES (two pages each) in the tiny model's shapes; returns their ids."""
    from vlembed.index.codec import StorageOptions
    from vlembed.index.layout import IMAGE_PREFIX_ROWS, IMAGE_SUFFIX_ROWS
    from vlembed.index.store import IndexMeta, PageRecord, PageStore

    dim, multi_dim = max(manifest.matryoshka_dims), manifest.multi_vector_dim
    rev = served_revision(manifest)
    store = PageStore(path)
    store.ensure_meta(
        IndexMeta(model or manifest.model_name, rev, dim, multi_dim, StorageOptions())
    )
    rng = np.random.default_rng(0)
    n_rows = IMAGE_PREFIX_ROWS + GRID[0] * GRID[1] + IMAGE_SUFFIX_ROWS
    records = []
    for i, source in enumerate(SOURCES):
        for page in (1, 2):
            mv = rng.standard_normal((n_rows, multi_dim)).astype(np.float32)
            mv /= np.linalg.norm(mv, axis=1, keepdims=True)
            vec = rng.standard_normal(dim).astype(np.float32)
            records.append(
                PageRecord(
                    source=source, page=page, n_pages=2, content_hash=f"h{i}", size=1,
                    width=448, height=336, grid_h=GRID[0], grid_w=GRID[1],
                    image_row_start=IMAGE_PREFIX_ROWS, n_image_rows=GRID[0] * GRID[1],
                    n_rows=n_rows, thumbnail=_png(i * 2 + page), vector=vec / np.linalg.norm(vec),
                    mv=mv.tobytes(), mv_rows=n_rows, mv_labels=b"", model=manifest.model_name,
                    revision=rev or "",
                )
            )  # fmt: skip
    store.add(records)
    return [r.id for r in records]


@pytest.fixture
def indexed(fake, tmp_path: Path):
    """(state with an index, fake llama-server, index directory, page ids)."""
    state, server = fake
    ids = write_index(tmp_path / "idx", state.service.model.manifest)
    state.search = SearchService.open(tmp_path / "idx", state.service, state.limits)
    return state, server, tmp_path / "idx", ids


def _search(client: TestClient, **body):
    return client.post("/v1/search", json=body)


def test_hits_are_the_maxsim_ranking_of_the_service_vectors(indexed) -> None:
    from vlembed.index import Index
    from vlembed.index.codec import decode_rows
    from vlembed.index.maxsim import maxsim

    state, _, path, ids = indexed
    with TestClient(create_app(state)) as client:
        r = _search(client, query="total amount due", k=5, match_map=True)
        assert r.status_code == 200, r.text
        body = r.json()
        q = np.asarray(
            client.post(
                "/v1/embeddings",
                json={"input": ["total amount due"], "return_multivector": True},
            ).json()["data"][0]["embedding"],
            np.float32,
        )
    store = Index(path).store
    rows = store.rows(ids, ("id", "mv", "mv_rows"))
    pages = {
        i: decode_rows(mv, n, q.shape[1], False)
        for i, mv, n in zip(rows["id"], rows["mv"], rows["mv_rows"], strict=True)
    }
    want = sorted(((maxsim(q, p), i) for i, p in pages.items()), reverse=True)[:5]
    hits = body["data"]
    assert [h["id"] for h in hits] == [i for _, i in want]
    assert [h["rank"] for h in hits] == [1, 2, 3, 4, 5]
    for hit, (score, _) in zip(hits, want, strict=True):
        assert hit["score"] == pytest.approx(score, abs=1e-5)
        assert hit["thumbnail_url"] == f"/v1/search/thumbnail/{hit['id']}"
        mm = hit["match_map"]
        sim = q @ pages[hit["id"]].T
        image = sim[:, 4 : 4 + GRID[0] * GRID[1]].reshape(-1, *GRID)
        assert tuple(mm["grid"]) == GRID
        np.testing.assert_allclose(mm["values"], image.max(axis=0), atol=1e-5)
        np.testing.assert_allclose(mm["token_values"], image, atol=1e-5)
    assert len(body["query_tokens"]) == q.shape[0]
    assert "".join(body["query_tokens"]).endswith("total amount due")
    assert body["usage"]["prompt_tokens"] == q.shape[0]


def test_no_match_map_unless_asked(indexed) -> None:
    state, *_ = indexed
    with TestClient(create_app(state)) as client:
        hits = _search(client, query="q").json()["data"]
    assert len(hits) == 8 and all(h["match_map"] is None for h in hits)
    assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)


@pytest.mark.parametrize(
    "flt, sources",
    [
        ({"source": "re%port"}, {SOURCES[0]}),
        ({"source": "%"}, {SOURCES[0]}),
        ({"source": "a_b"}, {SOURCES[3]}),  # "_" is no wildcard: not axb
        ({"source": "it's"}, {SOURCES[1]}),
        ({"source": "/docs/"}, set(SOURCES)),
        ({"source": "nowhere"}, set()),
        ({"source": "' OR 1=1 --"}, set()),
    ],
)
def test_source_filter_is_a_literal_substring(indexed, flt, sources) -> None:
    state, *_ = indexed
    with TestClient(create_app(state)) as client:
        r = _search(client, query="q", k=100, filter=flt)
    assert r.status_code == 200, r.text
    assert {h["source"] for h in r.json()["data"]} == sources


def test_page_filter(indexed) -> None:
    state, *_ = indexed
    with TestClient(create_app(state)) as client:
        hits = _search(client, query="q", filter={"page_min": 2, "page_max": 2}).json()["data"]
        assert len(hits) == 4 and {h["page"] for h in hits} == {2}
        hits = _search(client, query="q", k=3, filter={"source": "axb", "page_max": 1}).json()
    assert [(h["source"], h["page"]) for h in hits["data"]] == [(SOURCES[2], 1)]


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"query": "q", "k": 0}, 400, "k"),
        ({"query": "q", "k": 101}, 400, "k"),
        ({"query": "q", "k": "ten"}, 400, "k"),
        ({"query": ""}, 400, "query"),
        ({"query": " \n\t"}, 400, "query"),
        ({"k": 3}, 400, "query"),
        (b'{"query": "\\ud800x"}', 400, "query"),  # a lone surrogate
        ({"query": "q", "filter": "source LIKE '%'"}, 400, "filter"),
        ({"query": "q", "filter": {"where": "1=1"}}, 400, "filter.where"),
        ({"query": "q", "filter": {"source": ""}}, 400, "filter.source"),
        ({"query": "q", "filter": {"source": "a\x00b"}}, 400, "filter.source"),
        ({"query": "q", "filter": {"page_min": 0}}, 400, "filter.page_min"),
        ({"query": "q", "filter": {"page_min": 3, "page_max": 2}}, 400, "filter.page_max"),
        ({"query": "q", "match_map": "please"}, 400, "match_map"),
        ({"query": "q", "sql": "DROP"}, 400, "sql"),
    ],
)
def test_bad_requests_are_400_before_any_work(indexed, body, status: int, param) -> None:
    state, server, *_ = indexed
    with TestClient(create_app(state)) as client:
        if isinstance(body, bytes):
            r = client.post(
                "/v1/search", content=body, headers={"content-type": "application/json"}
            )
        else:
            r = client.post("/v1/search", json=body)
        _shape_ok(r, status, param)
    assert server.calls == 0


def test_over_long_query_is_413_on_query(indexed) -> None:
    state, server, path, _ = indexed
    state.search = SearchService.open(path, state.service, Limits(max_text_chars=10))
    with TestClient(create_app(state)) as client:
        err = _shape_ok(_search(client, query="x" * 11), 413, "query")
    assert "query" in err["message"] and server.calls == 0


def test_backend_failure_is_its_status_not_500(indexed) -> None:
    state, server, *_ = indexed
    server.mode = "status500"
    with TestClient(create_app(state)) as client:
        _shape_ok(_search(client, query="q"), 502)


def test_thumbnail(indexed) -> None:
    state, _, _, ids = indexed
    with TestClient(create_app(state)) as client:
        r = client.get(f"/v1/search/thumbnail/{ids[0]}")
        assert r.status_code == 200 and r.headers["content-type"] == "image/png"
        assert Image.open(io.BytesIO(r.content)).size == (48, 64)
        _shape_ok(client.get("/v1/search/thumbnail/" + "0" * 20), 404)
        _shape_ok(client.get("/v1/search/thumbnail/not-an-id"), 400, "id")


def test_without_an_index_search_is_404_and_there_is_no_page(fake) -> None:
    state, _ = fake
    with TestClient(create_app(state)) as client:
        err = _shape_ok(_search(client, query="q"), 404)
        assert err["type"] == "not_found_error" and "--index" in err["message"]
        _shape_ok(client.get("/v1/search/thumbnail/abc"), 404)
        _shape_ok(client.get("/"), 404)
        _shape_ok(client.get("/ui/search.js"), 404)


def test_api_needs_the_key_the_page_does_not(indexed) -> None:
    state, _, _, ids = indexed
    state.guard = GuardConfig(api_key="sesame")
    auth = {"Authorization": "Bearer sesame"}
    with TestClient(create_app(state)) as client:
        for path in ("/", "/ui", "/ui/", "/ui/search.js", "/ui/search.css"):
            r = client.get(path)
            assert r.status_code == 200, path
            assert "default-src 'none'" in r.headers["content-security-policy"]
        assert "<canvas" in client.get("/").text
        _shape_ok(_search(client, query="q"), 401)
        _shape_ok(client.get(f"/v1/search/thumbnail/{ids[0]}"), 401)
        _shape_ok(client.get("/ui/other.js"), 401)  # only the page's own files are open
        _shape_ok(client.post("/", json={}), 401)
        assert client.post("/v1/search", json={"query": "q"}, headers=auth).status_code == 200
        assert client.get(f"/v1/search/thumbnail/{ids[0]}", headers=auth).status_code == 200


def test_page_has_no_external_references() -> None:
    from importlib import resources

    for name in ("index.html", "search.js", "search.css"):
        text = resources.files("preprocess_service.ui").joinpath(name).read_text()
        assert "http://" not in text and "https://" not in text and "//cdn" not in text, name


def test_open_refuses_another_model_or_no_index(fake, tmp_path: Path) -> None:
    state, _ = fake
    m = state.service.model.manifest
    with pytest.raises(IndexOpenError, match="not a vlembed index"):
        SearchService.open(tmp_path / "missing", state.service, Limits())
    assert not (tmp_path / "missing").exists()  # read-only: nothing created
    write_index(tmp_path / "other", m, model="someone/else")
    with pytest.raises(IndexOpenError, match=r"built with model 'someone/else'.*serves"):
        SearchService.open(tmp_path / "other", state.service, Limits())


def test_serve_refuses_to_start_on_a_foreign_index(tiny_converted: Path, tmp_path: Path) -> None:
    from preprocess_service.model import load_served_model
    from preprocess_service.serve import build_state
    from preprocess_service.settings import parse_settings

    write_index(tmp_path / "idx", load_served_model(tiny_converted).manifest, model="x/y")
    argv = ["--model", str(tiny_converted), "--tasks", "retrieval", "--backend", "http://x:1"]
    settings = parse_settings([*argv, "--index", str(tmp_path / "idx")])
    with pytest.raises(SystemExit, match="vlembed serve: --index .* built with model 'x/y'"):
        build_state(settings, tiny_converted)


def test_serving_without_index_imports_neither_lancedb_nor_the_index(tiny_converted) -> None:
    code = (
        "import sys\n"
        "from preprocess_service.serve import build_state\n"
        "from preprocess_service.settings import parse_settings\n"
        "from preprocess_service.api.app import create_app\n"
        f"s = parse_settings(['--model', {str(tiny_converted)!r}, '--tasks', 'retrieval',\n"
        "                     '--backend', 'http://x:1'])\n"
        "create_app(build_state(s))\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('lancedb', 'lance', 'torch')\n"
        "       or m.startswith('vlembed.index')]\n"
        "print(bad); raise SystemExit(1 if bad else 0)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ui_command_serves_with_index_and_prints_the_url(monkeypatch, capsys) -> None:
    from preprocess_service import serve
    from preprocess_service.ui import cli

    seen = []
    monkeypatch.setattr(serve, "main", lambda argv: seen.append(argv) or 0)
    monkeypatch.setattr(cli, "_announce_when_ready", lambda url: None)
    assert cli.main(["--index", "my-idx", "--port", "8123", "--model", "m"]) == 0
    assert seen == [["--port", "8123", "--model", "m", "--index", "my-idx"]]
    assert "http://127.0.0.1:8123/" in capsys.readouterr().out
    assert cli.page_url("0.0.0.0", 80) == "http://127.0.0.1:80/"
    assert cli.page_url("::1", 80) == "http://[::1]:80/"
