"""``vlembed index --ray``: the indexing job as a Ray Data pipeline over a pool of services.

The same job as :func:`vlembed.index.indexer.add_paths`, spread over a Ray cluster:

1. **Plan, on the driver.** The same planning (:func:`plan_files`): files are listed and hashed,
   unchanged ones are skipped, rows of changed or damaged ones are deleted first. With nothing to
   embed, Ray is not even started.
2. **Render, in CPU tasks.** One task per file (``flat_map``) turns it into page rows: PNG bytes
   of each rendered PDF page (lossless, so the service sees the pixels the local path sends) or
   the image file's own bytes, the token grid and the thumbnail.
3. **Embed, in an actor pool.** ``map_batches`` with :class:`_Embedder`: each actor holds a
   :class:`ServicePool` over every ``--server`` and sends one request at a time, so the requests
   in flight are ``replicas x per_server``; a dead or full replica costs a retry on another one.
   An actor killed with its worker is restarted by Ray and its batch runs again.
4. **Write, on the driver.** Rows stream back to the driver, keyed by ``(source, page)``: a page
   that comes back twice (a retried batch) is one key. A file is committed when every page is
   back, in one atomic ``add`` (as the local path does), so the table never holds a page twice,
   and a killed driver leaves at most a partial long file that the next run's plan rebuilds.

The index is an ordinary index directory: ``vlembed search`` and :class:`vlembed.Index` read it
unchanged. Ray is imported only here, from the ``ray`` extra.
"""

from __future__ import annotations

import dataclasses
import io
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from vlembed.client import Client
from vlembed.constants import MAX_PIXELS, MIN_PIXELS
from vlembed.errors import ServiceError
from vlembed.index.codec import StorageOptions
from vlembed.index.indexer import (
    PASSAGE_TASK,
    FileJob,
    IndexReport,
    index_meta,
    page_record,
    plan_files,
)
from vlembed.index.pages import Page, UnreadableFileError, iter_pages
from vlembed.index.pool import ServicePool, retryable
from vlembed.index.progress import Progress
from vlembed.index.store import MAX_ROWS_PER_ADD, IndexMeta, PageRecord, PageStore

__all__ = ["RayUnavailableError", "add_paths_ray", "check_replicas", "init_ray"]

_RECORD_FIELDS = [f.name for f in dataclasses.fields(PageRecord)]


class RayUnavailableError(RuntimeError):
    """``--ray`` was asked for but Ray is not installed."""


def _import_ray():
    try:
        import ray
        import ray.data
    except ImportError as exc:
        raise RayUnavailableError(
            "vlembed index --ray needs Ray: pip install 'vlembed[ray]'"
        ) from exc
    return ray


def init_ray(address: str | None = None, **kwargs: Any) -> None:
    """Connect to ``address`` (``auto``, ``ray://host:port``) or start a local Ray.

    Nothing happens when Ray is already initialised (a caller that set its own options, as the
    tests do). The dashboard is off: the job needs none and it costs memory and a port.
    """
    ray = _import_ray()
    if ray.is_initialized():
        return
    kwargs.setdefault("include_dashboard", False)
    kwargs.setdefault("log_to_driver", False)
    ray.init(address=address or None, **kwargs)


def check_replicas(urls: Sequence[str], api_key: str | None = None) -> Client:
    """A client of the first reachable replica, after checking every reachable one serves the
    same model (id, revision, widths, pixel bounds): pages embedded by two models would not be
    comparable. Replicas that do not answer now are left to the pool's failover.

    Raises:
        ServiceError: No replica answers, or two serve different models.
    """
    clients: list[Client] = []
    errors: list[str] = []
    for url in urls:
        try:
            clients.append(Client(url, api_key=api_key, max_retries=2))
        except ServiceError as exc:
            errors.append(str(exc))
    if not clients:
        raise ServiceError("no --server answers: " + "; ".join(errors))

    def key(c: Client) -> tuple:
        return (c.name, c.revision, c.dim, c.multi_dim, c.min_pixels, c.max_pixels)

    first = clients[0]
    for other in clients[1:]:
        if key(other) != key(first):
            raise ServiceError(
                f"{first.base_url} serves {key(first)} but {other.base_url} serves {key(other)} "
                "(model, revision, widths, pixel bounds): every --server must serve the same model"
            )
        other.close()
    return first


# --- stage 2: pages, in CPU tasks ------------------------------------------------------------


def _png(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def render_file(row: Mapping[str, Any], min_pixels: int, max_pixels: int) -> list[dict[str, Any]]:
    """The page rows of one planned file; a file that fails to render gives one error row."""
    base = {k: row[k] for k in ("source", "content_hash", "size", "n_pages")}
    rows: list[dict[str, Any]] = []
    try:
        for page in iter_pages(Path(row["source"]), min_pixels, max_pixels):
            item = page.item if isinstance(page.item, bytes) else _png(page.item)
            rows.append(
                {
                    **base,
                    "page": page.number,
                    "item": item,
                    "width": page.width,
                    "height": page.height,
                    "grid_h": page.grid[0],
                    "grid_w": page.grid[1],
                    "thumbnail": page.thumbnail,
                    "error": "",
                }
            )
    except UnreadableFileError as exc:
        empty = {"item": b"", "width": 0, "height": 0, "grid_h": 0, "grid_w": 0, "thumbnail": b""}
        return [{**base, "page": 0, **empty, "error": str(exc)}]
    return rows


# --- stage 3: vectors, in an actor pool ------------------------------------------------------


class _Embedder:
    """A Ray Data actor: page rows in, stored rows out (pooling and sign bits applied here)."""

    def __init__(self, urls: Sequence[str], api_key: str | None, meta: IndexMeta) -> None:
        import random

        self.meta = meta
        # actors start at different replicas so that their first requests are spread too
        self.pool = ServicePool(urls, api_key=api_key, start=random.randrange(len(urls)))

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, list]:
        n = len(batch["page"])
        rows = [{k: batch[k][i] for k in batch} for i in range(n)]
        todo = [r for r in rows if not r["error"]]
        out: list[dict[str, Any]] = [
            self._error_row(r, str(r["error"])) for r in rows if r["error"]
        ]
        if todo:
            items = [bytes(r["item"]) for r in todo]
            try:
                pairs = self.pool.embed_both(items, task=PASSAGE_TASK)
            except ServiceError as exc:
                if retryable(exc):
                    raise  # the job fails; a re-run resumes where it stopped
                out += [self._error_row(r, f"refused by the service ({exc})") for r in todo]
            else:
                for r, (single, multi) in zip(todo, pairs, strict=True):
                    record = page_record(_job(r), _page(r), single, multi, self.meta)
                    out.append({**dataclasses.asdict(record), "error": ""})
        return {k: [r[k] for r in out] for k in [*_RECORD_FIELDS, "error"]}

    def _error_row(self, row: Mapping[str, Any], error: str) -> dict[str, Any]:
        record = PageRecord(
            source=str(row["source"]),
            page=int(row["page"]),
            n_pages=int(row["n_pages"]),
            content_hash=str(row["content_hash"]),
            size=int(row["size"]),
            **dict.fromkeys(
                ("width", "height", "grid_h", "grid_w", "image_row_start", "n_image_rows"), 0
            ),
            n_rows=0,
            thumbnail=b"",
            vector=np.zeros(self.meta.dim, np.float32),
            mv=b"",
            mv_rows=0,
            mv_labels=b"",
            model=self.meta.model,
            revision=self.meta.revision or "",
        )
        return {**dataclasses.asdict(record), "error": error}


def _job(row: Mapping[str, Any]) -> FileJob:
    return FileJob(
        Path(str(row["source"])), str(row["content_hash"]), int(row["size"]), int(row["n_pages"])
    )


def _page(row: Mapping[str, Any]) -> Page:
    grid = (int(row["grid_h"]), int(row["grid_w"]))
    return Page(
        int(row["page"]), b"", int(row["width"]), int(row["height"]), grid, bytes(row["thumbnail"])
    )


# --- stage 4: rows, committed by the driver --------------------------------------------------


def _record(row: Mapping[str, Any]) -> PageRecord:
    values = {k: row[k] for k in _RECORD_FIELDS}
    values["vector"] = np.asarray(values["vector"], np.float32)
    for k in ("thumbnail", "mv", "mv_labels"):
        values[k] = bytes(values[k])
    return PageRecord(**values)


class _Collector:
    """Pages of each file as they come back; a file is written once all of them are in."""

    def __init__(
        self,
        store: PageStore,
        report: IndexReport,
        bar: Progress,
        on_file_written: Callable[[str], None] | None,
    ) -> None:
        self.store = store
        self.report = report
        self.bar = bar
        self.on_file_written = on_file_written
        self.pages: dict[str, dict[int, PageRecord]] = {}
        self.closed: set[str] = set()  # written or skipped: late duplicates are dropped

    def take(self, row: Mapping[str, Any]) -> None:
        source = str(row["source"])
        if source in self.closed:
            return
        if row["error"]:
            self.closed.add(source)
            self.pages.pop(source, None)
            self.report.skipped.append((source, str(row["error"])))
            return
        record = _record(row)
        pages = self.pages.setdefault(source, {})
        if record.page not in pages:
            self.bar.advance(pages=1)
        pages[record.page] = record
        if len(pages) == record.n_pages:
            self._write(source, [pages[p] for p in sorted(pages)])

    def _write(self, source: str, records: list[PageRecord]) -> None:
        for start in range(0, len(records), MAX_ROWS_PER_ADD):
            self.store.add(records[start : start + MAX_ROWS_PER_ADD])
        self.closed.add(source)
        del self.pages[source]
        self.report.files_indexed += 1
        self.report.pages_embedded += len(records)
        self.bar.advance(files=1)
        if self.on_file_written is not None:
            self.on_file_written(source)


def _pipeline(
    plan: Sequence[FileJob],
    urls: Sequence[str],
    api_key: str | None,
    meta: IndexMeta,
    pixels: tuple[int, int],
    per_server: int,
    pages_per_request: int,
) -> Iterator[dict[str, Any]]:
    ray = _import_ray()
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False  # the job's own progress line is enough
    context.print_on_execution_start = False
    files = [
        {
            "source": str(j.path),
            "content_hash": j.content_hash,
            "size": j.size,
            "n_pages": j.n_pages,
        }
        for j in plan
    ]
    actors = per_server * len(urls)
    dataset = (
        ray.data.from_items(files, override_num_blocks=len(files))
        .flat_map(render_file, fn_kwargs={"min_pixels": pixels[0], "max_pixels": pixels[1]})
        .map_batches(
            _Embedder,
            fn_constructor_kwargs={"urls": list(urls), "api_key": api_key, "meta": meta},
            batch_size=pages_per_request,
            compute=ray.data.ActorPoolStrategy(size=actors),
            num_cpus=0,  # the actors wait on HTTP: the CPUs belong to rendering
        )
    )
    yield from dataset.iter_rows()


def add_paths_ray(
    store: PageStore,
    paths: Sequence[str],
    servers: Sequence[str],
    options: StorageOptions | None = None,
    *,
    address: str | None = None,
    api_key: str | None = None,
    per_server: int = 2,
    pages_per_request: int = 2,
    progress: bool = True,
    on_file_written: Callable[[str], None] | None = None,
) -> IndexReport:
    """Index ``paths`` into ``store`` with Ray; see the module docstring.

    Ray is initialised (:func:`init_ray`) only once the plan has pages to embed, and left as
    it is when the caller initialised it already.

    Args:
        store: The index.
        paths: Files, folders (recursive), globs, as seen by the driver and every worker (on a
            cluster: shared storage mounted at the same path).
        servers: Replicas of one ``vlembed serve``.
        options: Storage options for a new index.
        address: Ray cluster to join (``auto``, ``ray://host:port``); None: a local Ray.
        api_key: Bearer token of the services.
        per_server: Embedding actors per replica (each has one request in flight).
        pages_per_request: Pages per request.
        progress: Print a progress line on stderr.
        on_file_written: Called with each file's source once its rows are committed.
    """
    if per_server < 1 or pages_per_request < 1:
        raise ValueError(
            f"per_server and pages_per_request must be >= 1, got {per_server}, {pages_per_request}"
        )
    started = time.monotonic()
    report = IndexReport()
    client = check_replicas(servers, api_key)
    try:
        meta = index_meta(store, client, options)
        pixels = (client.min_pixels or MIN_PIXELS, client.max_pixels or MAX_PIXELS)
    finally:
        client.close()
    plan = plan_files(store, paths, report)
    bar = Progress(sum(j.n_pages for j in plan), enabled=progress)
    collector = _Collector(store, report, bar, on_file_written)
    try:
        if plan:
            init_ray(address)
            rows = _pipeline(plan, servers, api_key, meta, pixels, per_server, pages_per_request)
            for row in rows:
                collector.take(row)
    finally:
        bar.close()
    left = sorted(set(collector.pages))
    if left:  # a page never came back: a defect, not a file problem
        raise RuntimeError(f"the pipeline ended with incomplete files: {left}")
    report.ann_built = store.build_ann()
    report.pages_in_index = store.count()
    report.seconds = time.monotonic() - started
    return report
