"""The search page and ``/v1/search`` on the real service (tiny model), in a real browser.

An index is built from generated PDFs and images through one ``vlembed serve``; a second one
serves it with ``--index`` and an API key. Headless Chromium from the system packages
(``/usr/bin/chromium``, driven by Playwright; no browser download) loads the page, searches,
opens a hit and reads the heatmap canvas. The match map the API returns is checked against
MaxSim computed by hand from the stored rows and the query rows of ``/v1/embeddings``.

``VLEMBED_SEARCH_SCREENSHOT=FILE`` saves a screenshot of the page with an open heatmap.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from vlembed import Client
from vlembed.index import Index
from vlembed.index.codec import decode_labels, decode_rows
from vlembed.index.maxsim import maxsim
from vlembed.index.service import local_service

pytestmark = pytest.mark.integration
KEY = "page-test-key"
QUERY = "quarterly revenue by region"
# Scores are compared with a second embedding of the same pages to 1e-5: one image per vision
# forward, so that rows do not depend on what shared a forward (llama_patches/README.md 0009).
SERVE = ["--parallel", "2", "--threads", "2", "--tasks", "retrieval", "--vision-batch-tokens", "1"]
PAGES = [
    ("report.pdf", "Quarterly report", ["Revenue by region", "North 41%", "South 23%"]),
    ("report.pdf", "Headcount", ["Engineering 120", "Sales 64", "Support 31"]),
    ("invoice.pdf", "Invoice 2021-044", ["Total amount due: 1,240.00 EUR", "Due in 30 days"]),
    ("slide.png", "Roadmap 2022", ["Q1 search page", "Q2 heatmaps", "Q3 binary index"]),
    ("scan.png", "Meeting notes", ["Budget approved", "Hiring freeze lifted"]),
]


def _page(title: str, lines: list[str], seed: int) -> Image.Image:
    """A document-like page: a title, a few lines, a bar chart."""
    img = Image.new("RGB", (420, 560), "white")
    draw = ImageDraw.Draw(img)
    draw.rectangle((0, 0, 420, 70), fill=(30 + 40 * seed % 200, 60, 120))
    draw.text((24, 18), title, fill="white", font=ImageFont.load_default(size=28))
    body = ImageFont.load_default(size=20)
    for i, line in enumerate(lines):
        draw.text((24, 100 + 36 * i), line, fill=(20, 20, 20), font=body)
    rng = np.random.default_rng(seed)
    for i, h in enumerate(rng.integers(40, 200, 5)):
        x = 40 + 70 * i
        draw.rectangle((x, 520 - int(h), x + 44, 520), fill=(60, 130 + 20 * i, 200 - 30 * i))
    return img


def write_docs(folder: Path) -> None:
    by_file: dict[str, list[Image.Image]] = {}
    for seed, (name, title, lines) in enumerate(PAGES):
        by_file.setdefault(name, []).append(_page(title, lines, seed))
    for name, pages in by_file.items():
        if name.endswith(".pdf"):
            pages[0].save(folder / name, "PDF", save_all=True, append_images=pages[1:])
        else:
            pages[0].save(folder / name)


@pytest.fixture(scope="module")
def index_dir(tiny_converted: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    docs = tmp_path_factory.mktemp("docs")
    write_docs(docs)
    idx = tmp_path_factory.mktemp("search") / "idx"
    with local_service(str(tiny_converted), SERVE) as url, Client(url) as client:
        report = Index(idx).add([docs], client=client)
    assert report.skipped == [] and report.pages_in_index == len(PAGES)
    return idx


@pytest.fixture(scope="module")
def service(tiny_converted: Path, index_dir: Path) -> Iterator[str]:
    extra = [*SERVE, "--index", str(index_dir), "--api-key", KEY]
    with local_service(str(tiny_converted), extra) as url:
        yield url


AUTH = {"Authorization": f"Bearer {KEY}"}


def _search(url: str, **body) -> dict:
    r = httpx.post(url + "/v1/search", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_match_map_is_maxsim_of_the_stored_rows(service: str, index_dir: Path) -> None:
    body = _search(service, query=QUERY, k=len(PAGES), match_map=True)
    r = httpx.post(
        service + "/v1/embeddings",
        json={"input": [QUERY], "task": "retrieval.query", "return_multivector": True},
        headers=AUTH,
        timeout=120,
    )
    q = np.asarray(r.json()["data"][0]["embedding"], np.float32)
    store = Index(index_dir).store
    cols = ("mv", "mv_rows", "mv_labels", "n_rows", "image_row_start", "grid_h", "grid_w")
    scores = []
    for hit in body["data"]:
        row = {c: v[0] for c, v in store.rows([hit["id"]], cols).items()}
        page = decode_rows(row["mv"], row["mv_rows"], q.shape[1], False)
        sim = (q @ page.T)[:, decode_labels(row["mv_labels"], row["n_rows"])]
        h, w = row["grid_h"], row["grid_w"]
        start = row["image_row_start"]
        image = sim[:, start : start + h * w].reshape(-1, h, w)
        mm = hit["match_map"]
        assert tuple(mm["grid"]) == (h, w)
        np.testing.assert_allclose(mm["values"], image.max(axis=0), rtol=0, atol=1e-5)
        np.testing.assert_allclose(mm["token_values"], image, rtol=0, atol=1e-5)
        assert hit["score"] == pytest.approx(maxsim(q, page), abs=1e-5)
        scores.append(hit["score"])
    assert scores == sorted(scores, reverse=True)
    assert len(body["query_tokens"]) == q.shape[0]
    assert all(isinstance(t, str) for t in body["query_tokens"])
    assert "".join(body["query_tokens"]).endswith(QUERY)


def test_search_needs_the_key_and_refuses_bad_input(service: str) -> None:
    r = httpx.post(service + "/v1/search", json={"query": QUERY}, timeout=30)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    r = httpx.post(service + "/v1/search", json={"query": QUERY, "k": 0}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == "k"
    assert httpx.get(service + "/", timeout=30).status_code == 200  # the page itself is open


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    executable = shutil.which("chromium")
    if executable is None:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install -e '.[dev]'")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=executable, headless=True, args=["--no-sandbox"]
        )
        yield browser
        browser.close()


_PAINTED = """() => {
  const c = document.getElementById('heatmap');
  if (!c.width || !c.height) return {pixels: 0, sum: 0};
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let pixels = 0, sum = 0;
  for (let i = 0; i < d.length; i += 4) {
    if (d[i + 3] > 0) pixels++;
    sum = (sum * 31 + d[i] + 7 * d[i + 1] + 13 * d[i + 2]) % 1000000007;
  }
  return {pixels, sum, w: c.width, h: c.height};
}"""


def test_page_searches_opens_a_hit_and_draws_its_heatmap(service: str, browser) -> None:
    k = 4
    want = [h["score"] for h in _search(service, query=QUERY, k=k)["data"]]
    # the page's own Content-Security-Policy stays on: Playwright gets functions, never strings
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(service + "/")

    # without the key the page says so and opens the key field
    page.fill("#q", QUERY)
    page.press("#q", "Enter")
    page.wait_for_selector("#status.error")
    assert "API key" in page.inner_text("#status")
    assert page.evaluate("() => document.activeElement.id") == "api-key"
    errors.clear()  # the 401 is logged by the browser as a failed resource

    page.fill("#api-key", KEY)
    page.fill("#k", str(k))
    page.fill("#q", QUERY)
    page.press("#q", "Enter")
    page.wait_for_function("k => document.querySelectorAll('#results .hit').length === k", arg=k)
    scores = page.eval_on_selector_all(
        "#results .hit", "els => els.map(e => parseFloat(e.dataset.score))"
    )
    assert scores == pytest.approx(want, abs=1e-6)
    assert scores == sorted(scores, reverse=True)
    page.wait_for_function(
        "() => [...document.querySelectorAll('#results .hit img')].every(i => i.complete && "
        "i.naturalWidth > 0)"
    )

    # keyboard: arrows move between results, Enter opens, Escape closes
    page.focus("#results .hit")
    page.keyboard.press("ArrowRight")
    assert page.evaluate("() => document.activeElement.dataset.index") == "1"
    page.keyboard.press("ArrowLeft")
    assert page.evaluate("() => document.activeElement.dataset.index") == "0"
    page.keyboard.press("Enter")
    page.wait_for_selector("#viewer[open]")
    page.wait_for_function("() => document.getElementById('heatmap').width > 0")
    whole = page.evaluate(_PAINTED)
    assert whole["pixels"] == whole["w"] * whole["h"] > 0
    n_tokens = page.eval_on_selector_all("#token option", "els => els.length") - 1
    assert n_tokens > 1
    page.select_option("#token", "1")
    one = page.evaluate(_PAINTED)
    assert one["pixels"] == whole["pixels"] and one["sum"] != whole["sum"]
    page.select_option("#token", "-1")
    shot = os.environ.get("VLEMBED_SEARCH_SCREENSHOT")
    if shot:
        page.screenshot(path=shot, type="png")
    page.keyboard.press("Escape")
    page.wait_for_selector("#viewer", state="hidden")
    assert page.evaluate("() => document.activeElement.dataset.index") == "0"
    page.keyboard.press("Space")  # Space opens as well
    page.wait_for_selector("#viewer[open]")
    page.keyboard.press("Escape")
    assert errors == []
    page.close()
