"""The index against the real service on the tiny model: layout, exact scores, crash safety.

One ``vlembed serve`` subprocess per module (as ``vlembed index`` starts it), CLI runs as
subprocesses with ``--server`` so that a kill -9 of the indexer leaves the service up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.vlembed.index.conftest import noise_image, write_encrypted_pdf, write_pdf
from vlembed import Client
from vlembed.index import Index
from vlembed.index.layout import IMAGE_PREFIX_ROWS, IMAGE_SUFFIX_ROWS
from vlembed.index.maxsim import maxsim
from vlembed.index.service import local_service

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def service(tiny_converted: Path) -> Iterator[str]:
    # scores are compared with a second embedding of the same pages to 1e-5: one image per vision
    # forward, so that rows do not depend on what shared a forward (llama_patches/README.md 0009)
    flags = ["--parallel", "2", "--threads", "2", "--vision-batch-tokens", "1"]
    with local_service(str(tiny_converted), flags) as url:
        yield url


@pytest.fixture(scope="module")
def client(service: str) -> Iterator[Client]:
    with Client(service) as c:
        yield c


def _cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vlembed.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _rows(index_dir: Path) -> list[tuple[str, int]]:
    data = Index(index_dir).store.table.search().select(["source", "page"]).limit(None).to_arrow()
    return sorted(zip(data["source"].to_pylist(), data["page"].to_pylist(), strict=True))


def test_image_rows_follow_four_prompt_rows_and_precede_seven(client: Client) -> None:
    """The layout the index assumes, checked on the service: the causal prefix rows do not
    depend on the image; the rest is the grid plus 7 rows."""
    a, b = noise_image(112, 84, 1), noise_image(112, 84, 2)
    ra, rb = client.embed([a, b], task="retrieval.passage", multivector=True)
    assert ra.shape[0] == IMAGE_PREFIX_ROWS + 3 * 4 + IMAGE_SUFFIX_ROWS
    np.testing.assert_allclose(ra[:IMAGE_PREFIX_ROWS], rb[:IMAGE_PREFIX_ROWS], atol=1e-5)
    assert not np.allclose(ra[IMAGE_PREFIX_ROWS], rb[IMAGE_PREFIX_ROWS], atol=1e-3)
    (rc,) = client.embed([noise_image(56, 140, 3)], task="retrieval.passage", multivector=True)
    assert rc.shape[0] - 5 * 2 == IMAGE_PREFIX_ROWS + IMAGE_SUFFIX_ROWS


def test_cli_index_and_search_scores_are_maxsim_of_the_service_vectors(
    service: str, client: Client, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    write_pdf(docs / "report.pdf", 2, seed=1, size=(120, 160))
    noise_image(140, 84, 5).save(docs / "scan.png")
    write_encrypted_pdf(docs / "secret.pdf")
    (docs / "broken.pdf").write_bytes(b"%PDF-1.7\n1 0 obj garbage")
    idx = tmp_path / "idx"

    run = _cli("index", str(docs), "--index", str(idx), "--server", service, "--quiet")
    assert run.returncode == 1, run.stderr
    assert "password-protected" in run.stderr and "broken.pdf" in run.stderr
    assert "2 skipped" in run.stderr
    assert _rows(idx) == [(str(docs / "report.pdf"), 1), (str(docs / "report.pdf"), 2),
                          (str(docs / "scan.png"), 1)]  # fmt: skip

    query = "total amount due"
    run = _cli("search", query, "--index", str(idx), "--server", service, "--json", "-k", "3")
    assert run.returncode == 0, run.stderr
    hits = json.loads(run.stdout)["hits"]
    assert len(hits) == 3

    # by hand: the same pages and query straight from /v1/embeddings
    (q,) = client.embed([query], task="retrieval.query", multivector=True)
    index = Index(idx)
    import pypdfium2 as pdfium

    from vlembed.index.pages import iter_pages

    pages = {(str(docs / "scan.png"), 1): (docs / "scan.png").read_bytes()}
    for page in iter_pages(docs / "report.pdf", client.min_pixels, client.max_pixels):
        pages[(str(docs / "report.pdf"), page.number)] = page.item
    assert pdfium.PdfDocument(docs / "report.pdf")  # the renderer the index used
    keys = list(pages)
    rows = client.embed([pages[k] for k in keys], task="retrieval.passage", multivector=True)
    want = {k: maxsim(q, r) for k, r in zip(keys, rows, strict=True)}
    for hit in hits:
        assert hit["score"] == pytest.approx(want[(hit["source"], hit["page"])], abs=1e-5)
    assert [h["score"] for h in hits] == sorted(want.values(), reverse=True)
    smap = index.similarity_map(hits[0]["id"], q)
    assert smap.image_map.shape == smap.grid
    assert float(smap.matrix.max(1).sum()) == pytest.approx(hits[0]["score"], abs=1e-5)

    # re-index: nothing embedded (the service's request counter does not move)
    before = _embedding_requests(service)
    run = _cli("index", str(docs / "report.pdf"), str(docs / "scan.png"), "--index", str(idx),
               "--server", service, "--quiet")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "0 pages" in run.stderr and "2 unchanged" in run.stderr
    assert _embedding_requests(service) == before


def _embedding_requests(url: str) -> float:
    """The service's ``vlembed_requests_total`` (embedding requests, all outcomes)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vlembed_requests_total")
    )


def test_kill_9_mid_run_then_rerun_keeps_every_page_exactly_once(
    service: str, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for i in range(5):
        write_pdf(docs / f"d{i}.pdf", 2, seed=10 + i, size=(100, 140))
    idx = tmp_path / "idx"
    args = ["index", str(docs), "--index", str(idx), "--server", service, "--concurrency", "2"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "vlembed.cli", *args],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 240
    seen = ""
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen += line
        if "(1 files written)" in line or "(2 files written)" in line or not line:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, seen  # it was really cut short
    partial = _rows(idx)
    assert 0 < len(partial) < 10

    run = _cli("index", str(docs), "--index", str(idx), "--server", service, "--quiet")
    assert run.returncode == 0, run.stderr
    rows = _rows(idx)
    assert rows == sorted((str(docs / f"d{i}.pdf"), p) for i in range(5) for p in (1, 2))
