"""``vlembed index --ray`` on a real local Ray cluster (2 CPUs) against real service replicas.

The replicas serve the tiny model with a smaller ``max_pixels`` in its manifest (64 merged
tokens instead of 768): PDF pages are rendered to fill that budget, and small pages keep the
module within a few minutes on two cores. What is checked: every page once and search equal to
the local path's; a replica killed with SIGKILL mid-run, then a Ray worker killed mid-run, and
each job still ends with every page once; a re-run through the command line embeds nothing.
"mid-run" is observed, not timed: the kill happens once the services have answered some
requests and before the driver has committed every file (asserted).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.vlembed.index.conftest import noise_image, write_pdf
from vlembed import Client
from vlembed.index import Index
from vlembed.index.service import LocalService, local_service_process
from vlembed.index.store import PageStore

ray = pytest.importorskip("ray")

from vlembed.index.distributed import add_paths_ray  # noqa: E402  (after the skip)

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]
# Search scores are compared with the local path's to 1e-5, which needs every image's rows to be
# independent of what else is in flight. A shared vision forward pads an image's windows to the
# largest of the forward, which moves the rows of images with small windows by rounding (f16
# tiny model: min row cos 0.9999996, llama_patches/README.md 0009): one image per forward here.
SERVE = ["--parallel", "2", "--threads", "1", "--vision-batch-tokens", "1"]
SMALL_MAX_PIXELS = 64 * 28 * 28
EMBEDDER = b"ray::MapWorker(MapBatches(_Embedder))"


@pytest.fixture(scope="module")
def small_model(tiny_converted: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with a 64-token page budget (same weights, linked)."""
    out = tmp_path_factory.mktemp("small-pages") / "tiny-small"
    out.mkdir()
    for file in tiny_converted.iterdir():
        if file.name != "manifest.json":
            (out / file.name).symlink_to(file)
    manifest = json.loads((tiny_converted / "manifest.json").read_text())
    assert manifest["max_pixels"] > SMALL_MAX_PIXELS
    manifest["max_pixels"] = SMALL_MAX_PIXELS
    (out / "manifest.json").write_text(json.dumps(manifest))
    return out


@pytest.fixture(scope="module")
def replicas(small_model: Path) -> Iterator[list[str]]:
    """Two replicas of the service for the whole module (never killed)."""
    with contextlib.ExitStack() as stack:
        yield [
            stack.enter_context(local_service_process(str(small_model), SERVE)).url
            for _ in range(2)
        ]


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """A local Ray cluster sized for a small sandbox: 2 CPUs, 200 MB object store, no dashboard.

    Workers get this checkout on their path (they start from the Ray session's directory).
    """
    temp = tempfile.mkdtemp(prefix="ray-")  # short: Ray's socket paths must stay < 108 bytes
    ray.init(
        num_cpus=2,
        object_store_memory=200 * 1024 * 1024,
        include_dashboard=False,
        log_to_driver=False,
        _temp_dir=temp,
        runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
    )
    yield
    ray.shutdown()


def _docs(folder: Path, n_images: int, pdfs: tuple[int, ...] = (2, 1)) -> list[tuple[str, int]]:
    """PDFs with the given page counts and small PNG images; returns every (source, page)."""
    folder.mkdir()
    pages = []
    for i, n in enumerate(pdfs):
        write_pdf(folder / f"doc{i}.pdf", n, seed=30 + i, size=(120, 160))
        pages += [(str(folder / f"doc{i}.pdf"), p) for p in range(1, n + 1)]
    for i in range(n_images):
        noise_image(56 + 28 * (i % 3), 84, 60 + i).save(folder / f"scan{i:02d}.png")
        pages.append((str(folder / f"scan{i:02d}.png"), 1))
    return sorted(pages)


def _rows(index_dir: Path) -> list[tuple[str, int]]:
    data = PageStore(index_dir).table.search().select(["source", "page"]).limit(None).to_arrow()
    return sorted(zip(data["source"].to_pylist(), data["page"].to_pylist(), strict=True))


def _requests(url: str) -> float:
    """The service's ``vlembed_requests_total`` (embedding requests answered, all outcomes)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vlembed_requests_total")
    )


class _Run:
    """``add_paths_ray`` in a thread, counting committed files, so the test can act mid-run."""

    def __init__(self, index_dir: Path, docs: Path, servers: list[str]) -> None:
        self.files_written = 0
        self.error: BaseException | None = None
        self.report = None
        self.thread = threading.Thread(
            target=self._run, args=(index_dir, docs, servers), daemon=True
        )
        self.thread.start()

    def _run(self, index_dir: Path, docs: Path, servers: list[str]) -> None:
        def written(_: str) -> None:
            self.files_written += 1

        try:
            self.report = add_paths_ray(
                PageStore(index_dir),
                [str(docs)],
                servers,
                per_server=1,
                progress=False,
                on_file_written=written,
            )
        except BaseException as exc:  # handed to the test thread
            self.error = exc

    def wait_until(self, condition: Callable[[], bool], what: str) -> None:
        """Poll ``condition`` while the job runs; fail if the job ends first."""
        while not condition():
            self.thread.join(0.05)
            if not self.thread.is_alive():
                raise AssertionError(f"the job ended before {what} ({self.error!r})")

    def result(self):
        self.thread.join(600)
        assert not self.thread.is_alive(), "the job did not end"
        if self.error is not None:
            raise self.error
        return self.report


def _descendants(root: int) -> list[tuple[int, bytes]]:
    """``(pid, argv[0])`` of every process under ``root`` (Linux /proc): Ray's workers carry
    their role in argv[0] (``ray::<actor class>``)."""
    parents: dict[int, int] = {}
    names: dict[int, bytes] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            names[int(entry.name)] = (entry / "cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            continue
        parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = [], [root]
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid:
                found.append((child, names[child]))
                frontier.append(child)
    return found


# --- tests -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_indexed(
    cluster: None, replicas: list[str], tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, list[tuple[str, int]], Path]:
    """PDFs and images indexed once with Ray: ``(docs, every (source, page), index)``."""
    root = tmp_path_factory.mktemp("ray-indexed")
    docs, index_dir = root / "docs", root / "ray-idx"
    pages = _docs(docs, n_images=3)
    # written through a file:// URI (the object-store code path), read back as a directory
    report = add_paths_ray(PageStore(index_dir.as_uri()), [str(docs)], replicas, progress=False)
    assert report.ok and report.pages_embedded == len(pages) == report.pages_in_index
    return docs, pages, index_dir


def test_every_page_once_and_search_equal_to_the_local_path(
    ray_indexed: tuple[Path, list[tuple[str, int]], Path], replicas: list[str], tmp_path: Path
) -> None:
    docs, pages, ray_index = ray_indexed
    assert _rows(ray_index) == pages
    local_index = tmp_path / "local-idx"
    with Client(replicas[0]) as client:
        Index(local_index).add([str(docs)], client=client)
        assert _rows(local_index) == pages
        for query in ("total amount due", "signature page"):
            got = Index(ray_index).search(query, k=5, client=client)
            want = Index(local_index).search(query, k=5, client=client)
            assert [(h.source, h.page, h.id) for h in got] == [
                (h.source, h.page, h.id) for h in want
            ]
            assert [h.score for h in got] == pytest.approx([h.score for h in want], abs=1e-5)


def test_a_replica_killed_mid_run_costs_retries_not_pages(
    cluster: None, replicas: list[str], small_model: Path, tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    pages = _docs(docs, n_images=16)
    index_dir = tmp_path / "idx"
    with local_service_process(str(small_model), SERVE) as doomed:
        run = _Run(index_dir, docs, [replicas[0], doomed.url])
        run.wait_until(lambda: _requests(doomed.url) >= 2, "the doomed replica answered")
        assert run.files_written < len(pages)
        _kill_replica(doomed)
        report = run.result()
    assert report.ok and report.pages_embedded == len(pages)
    assert _rows(index_dir) == pages


def _kill_replica(service: LocalService) -> None:
    os.killpg(service.pid, signal.SIGKILL)  # the service and its llama-servers, at once


def test_a_ray_worker_killed_mid_run_costs_retries_not_pages(
    cluster: None, replicas: list[str], tmp_path: Path
) -> None:
    docs = tmp_path / "docs"
    pages = _docs(docs, n_images=16)
    index_dir = tmp_path / "idx"
    before = sum(_requests(url) for url in replicas)
    run = _Run(index_dir, docs, replicas)
    run.wait_until(
        lambda: sum(_requests(url) for url in replicas) >= before + 2, "pages were embedded"
    )
    workers = [pid for pid, name in _descendants(os.getpid()) if name.startswith(EMBEDDER)]
    assert workers, _descendants(os.getpid())
    assert run.files_written < len(pages)
    os.kill(workers[0], signal.SIGKILL)
    report = run.result()
    assert report.ok and report.pages_embedded == len(pages)
    assert _rows(index_dir) == pages


def test_rerun_from_the_command_line_embeds_nothing(
    ray_indexed: tuple[Path, list[tuple[str, int]], Path], replicas: list[str]
) -> None:
    docs, pages, index_dir = ray_indexed
    before = [_requests(url) for url in replicas]
    servers = [arg for url in replicas for arg in ("--server", url)]
    run = subprocess.run(
        [sys.executable, "-m", "vlembed.cli", "index", str(docs), "--index", str(index_dir),
         *servers, "--quiet", "--ray"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    n_files = len({source for source, _ in pages})
    assert "0 pages" in run.stderr and f"{n_files} unchanged" in run.stderr
    assert [_requests(url) for url in replicas] == before
    assert "Ray instance" not in run.stderr  # nothing to embed: Ray was not even started
    assert _rows(index_dir) == pages
