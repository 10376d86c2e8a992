"""``Index.add``: files -> pages -> vectors from the service -> rows, incrementally and crash-safe.

1. **Plan.** Expand the paths, hash every file, compare with what the table holds
   (:meth:`PageStore.file_states`). A file whose hash is stored with all its pages, each once, is
   unchanged: nothing is rendered or embedded. Rows of a changed, partial or duplicated file are
   deleted before anything is added, so a run killed at any point is repaired by the next one.
   Unreadable files (corrupt, password-protected) are reported and skipped.
2. **Embed.** Pages are rendered lazily, a few per request, with a bounded number of requests
   in flight (a small thread pool): enough to keep the service's slots busy, never an
   unbounded queue of page images in memory.
3. **Write.** A file's rows are written once all its pages are back, in one atomic ``add`` (or
   a few for very long files, detected as partial if the run dies between them).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np
from PIL import Image

from vlembed.client import Client
from vlembed.constants import MAX_PIXELS, MIN_PIXELS
from vlembed.errors import ServiceError
from vlembed.index.codec import StorageOptions, encode_rows
from vlembed.index.layout import image_row_span
from vlembed.index.pages import Page, UnreadableFileError, count_pages, iter_pages
from vlembed.index.progress import Progress
from vlembed.index.sources import expand_paths, file_hash
from vlembed.index.store import MAX_ROWS_PER_ADD, IndexMeta, PageRecord, PageStore

__all__ = [
    "PASSAGE_TASK",
    "FileJob",
    "IndexReport",
    "add_paths",
    "index_meta",
    "page_record",
    "plan_files",
]

PASSAGE_TASK = "retrieval.passage"


@dataclasses.dataclass
class IndexReport:
    """What one ``add`` did.

    Attributes:
        files_indexed: Files embedded and written in this run.
        files_unchanged: Files already stored with the same content.
        skipped: ``(path, reason)`` of files that could not be indexed.
        missing: Arguments that named no file.
        pages_embedded: Pages sent to the service in this run.
        pages_in_index: Rows in the table at the end.
        seconds: Wall time of the run.
        ann_built: Whether the ANN index was built or refreshed.
    """

    files_indexed: int = 0
    files_unchanged: int = 0
    skipped: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)
    pages_embedded: int = 0
    pages_in_index: int = 0
    seconds: float = 0.0
    ann_built: bool = False

    @property
    def ok(self) -> bool:
        return not self.skipped and not self.missing

    def summary(self) -> str:
        rate = self.pages_embedded / self.seconds if self.seconds > 0 else 0.0
        lines = [
            f"indexed {self.files_indexed} files ({self.pages_embedded} pages, {rate:.2f} pages/s"
            f" in {self.seconds:.1f} s), {self.files_unchanged} unchanged, "
            f"{len(self.skipped)} skipped; {self.pages_in_index} pages in the index"
        ]
        lines += [f"  skipped {path}: {reason}" for path, reason in self.skipped]
        lines += [f"  no such file: {arg}" for arg in self.missing]
        return "\n".join(lines)


@dataclasses.dataclass
class FileJob:
    """A file the plan says to embed: what its rows will carry, and the local run's futures."""

    path: Path
    content_hash: str
    size: int
    n_pages: int
    batches: list[tuple[list[Page], Future]] = dataclasses.field(default_factory=list)
    submitted: bool = False
    error: str | None = None


def page_record(
    job: FileJob, page: Page, single: np.ndarray, multi: np.ndarray, meta: IndexMeta
) -> PageRecord:
    """The stored row of one embedded page (pooling and sign bits applied here).

    Shared by the local indexer and the Ray pipeline, so both write the same rows.
    """
    if single.shape != (meta.dim,) or multi.shape[1] != meta.multi_dim:
        raise ServiceError(
            f"{job.path} page {page.number}: expected a {meta.dim}-d vector and "
            f"{meta.multi_dim}-d rows, got {single.shape} and {multi.shape}"
        )
    start, n_image = image_row_span(multi.shape[0], page.grid)
    enc = encode_rows(multi, meta.options)
    return PageRecord(
        source=str(job.path),
        page=page.number,
        n_pages=job.n_pages,
        content_hash=job.content_hash,
        size=job.size,
        width=page.width,
        height=page.height,
        grid_h=page.grid[0],
        grid_w=page.grid[1],
        image_row_start=start,
        n_image_rows=n_image,
        n_rows=multi.shape[0],
        thumbnail=page.thumbnail,
        vector=single,
        mv=enc.data,
        mv_rows=enc.n_rows,
        mv_labels=enc.labels,
        model=meta.model,
        revision=meta.revision or "",
    )


def _embed_batch(
    client: Client,
    job: FileJob,
    pages: list[Page],
    items: list[Image.Image | bytes],
    meta: IndexMeta,
) -> list[PageRecord]:
    """Worker: both vectors of a few pages (one forward pass each), turned into stored rows."""
    pairs = client.embed_both(items, task=PASSAGE_TASK)
    return [
        page_record(job, page, single, multi, meta)
        for page, (single, multi) in zip(pages, pairs, strict=True)
    ]


def _batched(pages: Iterable[Page], size: int) -> Iterable[list[Page]]:
    batch: list[Page] = []
    for page in pages:
        batch.append(page)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch


def index_meta(store: PageStore, client: Client, options: StorageOptions | None) -> IndexMeta:
    """The index's metadata for pages from ``client``: recorded for a new index, else checked."""
    if client.dim is None or client.multi_dim is None:
        raise ServiceError(f"{client.base_url}/v1/models does not list the model's vector widths")
    if store.meta is not None and options is not None and options != store.meta.options:
        raise ValueError(
            f"index {store.path} stores multi-vectors as {store.meta.options.label()}; "
            f"cannot add pages as {options.label()} (storage options are fixed per index)"
        )
    chosen = options or (store.meta.options if store.meta else StorageOptions())
    return store.ensure_meta(
        IndexMeta(client.name, client.revision, client.dim, client.multi_dim, chosen)
    )


def plan_files(
    store: PageStore, paths: Sequence[str | os.PathLike[str]], report: IndexReport
) -> list[FileJob]:
    """The files to embed: new, changed or damaged ones (step 1 of the module docstring).

    Unchanged files, unreadable files and arguments naming nothing are counted in ``report``.
    Stored rows of every planned file are deleted here, before anything is added.
    """
    files, report.missing = expand_paths(paths)
    states = store.file_states()
    stale: list[str] = []
    plan: list[FileJob] = []
    for path in files:
        source = str(path)
        state = states.get(source)
        try:
            digest = file_hash(path)
            size = path.stat().st_size
        except OSError as exc:
            report.skipped.append((source, f"cannot read ({exc})"))
            continue
        if state is not None and state.complete(digest):
            report.files_unchanged += 1
            continue
        if state is not None:
            stale.append(source)  # changed, partial or duplicated: rebuilt from scratch
        try:
            n_pages = count_pages(path)
        except UnreadableFileError as exc:
            report.skipped.append((source, str(exc)))
            continue
        plan.append(FileJob(path, digest, size, n_pages))
    store.delete_sources(stale)
    return plan


def add_paths(
    store: PageStore,
    paths: Sequence[str | os.PathLike[str]],
    client: Client,
    options: StorageOptions | None = None,
    *,
    concurrency: int = 3,
    pages_per_request: int = 2,
    progress: bool = True,
    on_file_written: Callable[[str], None] | None = None,
) -> IndexReport:
    """Index ``paths`` into ``store`` with ``client``; see the module docstring."""
    started = time.monotonic()
    report = IndexReport()
    meta = index_meta(store, client, options)
    plan = plan_files(store, paths, report)
    bar = Progress(sum(j.n_pages for j in plan), enabled=progress)
    max_in_flight = 2 * concurrency
    in_flight: set[Future] = set()
    lock = threading.Lock()

    def write_ready(jobs: list[FileJob]) -> list[FileJob]:
        """Write every fully embedded file; returns the jobs still waiting."""
        waiting = []
        for job in jobs:
            if not job.submitted or any(not f.done() for _, f in job.batches):
                waiting.append(job)
                continue
            try:
                records = [r for _, f in job.batches for r in f.result()]
            except ServiceError as exc:
                if exc.status is None or exc.status in (429, 503) or exc.status >= 500:
                    raise
                job.error = f"refused by the service ({exc})"
            if job.error is not None:
                report.skipped.append((str(job.path), job.error))
                continue
            for start in range(0, len(records), MAX_ROWS_PER_ADD):
                store.add(records[start : start + MAX_ROWS_PER_ADD])
            report.files_indexed += 1
            report.pages_embedded += len(records)
            bar.advance(files=1)
            if on_file_written is not None:
                on_file_written(str(job.path))
        return waiting

    def count_page(future: Future) -> None:
        if future.exception() is None:
            with lock:
                bar.advance(pages=len(future.result()))

    pending: list[FileJob] = []
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="vlembed-index") as pool:
        try:
            for job in plan:
                pending.append(job)
                try:
                    for batch in _batched(
                        iter_pages(
                            job.path,
                            client.min_pixels or MIN_PIXELS,
                            client.max_pixels or MAX_PIXELS,
                        ),
                        pages_per_request,
                    ):
                        while len(in_flight) >= max_in_flight:
                            done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                            in_flight.difference_update(done)
                            pending = write_ready(pending)
                        items = [page.item for page in batch]
                        future = pool.submit(_embed_batch, client, job, batch, items, meta)
                        future.add_done_callback(count_page)
                        for page in batch:
                            page.item = b""  # the worker holds the only reference
                        job.batches.append((batch, future))
                        in_flight.add(future)
                except UnreadableFileError as exc:
                    job.error = str(exc)
                job.submitted = True
                pending = write_ready(pending)
            while pending:
                if in_flight:
                    done, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                    in_flight.difference_update(done)
                pending = write_ready(pending)
        except BaseException:
            for future in in_flight:
                future.cancel()
            raise
        finally:
            bar.close()
    report.ann_built = store.build_ann()
    report.pages_in_index = store.count()
    report.seconds = time.monotonic() - started
    return report
