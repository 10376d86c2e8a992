"""The serving pipeline, free of HTTP: validated items -> images -> prompts -> rows -> vectors.

For each item of a request, in its own task: resolve image references (``inputs``), read the
image headers and check the item's token budget before any pixel is decoded (``image``), decode
and reshape into patch levels, build the prompt (``prompts``), fetch every row from the
least-busy llama-server (``backend``), pool (``pooling``). The items of one request run together
in a task group: the first failure cancels the others, so a refused request stops costing work
at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from preprocess_service import image as image_mod
from preprocess_service.backend import BackendPool
from preprocess_service.inputs import InputPolicy, resolve_image
from preprocess_service.metrics import Metrics
from preprocess_service.model import ServedModel
from preprocess_service.pooling import single_vector
from preprocess_service.prompts import IMAGE, Prompt, content_prompt, image_prompt, text_prompt
from preprocess_service.validate import EmbedOptions, ImageRef, Item, ValidRequest
from vlembed.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    InputTooLargeError,
    OverloadedError,
    VlembedError,
)
from vlembed.wire import PatchLevels, Rows


@dataclass
class EmbedResult:
    vector: np.ndarray  # [dim] or [n_tokens, projector_dim]
    n_tokens: int
    preprocess_s: float = 0.0  # decode + patch levels + prompt + token count
    backend_s: float = 0.0  # llama-server round trip, rows decoded
    single: np.ndarray | None = None  # [dim], with a multi-vector when asked for both


@dataclass(frozen=True)
class QueueLimits:
    max_queue: int = 256  # items in flight before a request that does not fit gets 429
    request_timeout: float = 120.0
    retry_wait: float = 15.0  # how long an item waits for a restarted backend
    max_concurrent_items: int = 16  # items being prepared or embedded at once (memory bound)


@dataclass
class _Prepared:
    prompt: Prompt
    images: list[PatchLevels]
    n_tokens: int


@dataclass
class EmbeddingService:
    model: ServedModel
    pools: dict[str, BackendPool]
    limits: QueueLimits = field(default_factory=QueueLimits)
    policy: InputPolicy = field(default_factory=InputPolicy)
    metrics: Metrics = field(default_factory=Metrics)
    in_flight: int = 0

    def __post_init__(self) -> None:
        self._slots = asyncio.Semaphore(max(1, self.limits.max_concurrent_items))

    @property
    def served_tasks(self) -> set[str]:
        return set(self.pools)

    async def embed(self, request: ValidRequest) -> list[EmbedResult]:
        """All items of one request, concurrently, within the request deadline.

        An idle service admits any valid request (up to ``max_items``); a busy one answers 429
        when the request's items would take it past ``max_queue``.
        """
        n = len(request.items)
        if self.in_flight and self.in_flight + n > self.limits.max_queue:
            raise OverloadedError(
                f"{self.in_flight} inputs in flight, limit {self.limits.max_queue}; retry later",
                retry_after=1.0,
            )
        self.in_flight += n
        self.metrics.queue_depth.set(self.in_flight)
        try:
            async with asyncio.timeout(self.limits.request_timeout):
                return await _gather_or_cancel(
                    [self._one(item, request.options) for item in request.items]
                )
        except TimeoutError as exc:
            raise BackendTimeoutError(
                f"request took longer than {self.limits.request_timeout:.0f} s"
            ) from exc
        finally:
            self.in_flight -= n
            self.metrics.queue_depth.set(self.in_flight)

    async def _one(self, item: Item, opts: EmbedOptions) -> EmbedResult:
        async with self._slots:
            t0 = time.perf_counter()
            parts = [
                await resolve_image(p, self.policy) if isinstance(p, ImageRef) else p
                for p in item.parts
            ]
            prepared = await asyncio.to_thread(self._prepare, item, parts, opts)
            t1 = time.perf_counter()
            rows = await self._rows(opts.adapter_task, prepared, item.param)
            t2 = time.perf_counter()
        self.metrics.stage.labels("preprocess").observe(t1 - t0)
        self.metrics.stage.labels("backend").observe(t2 - t1)
        if rows.rows.shape[0] != prepared.n_tokens:
            # the backend tokenized differently than we counted: never silently pooled
            raise BackendError(
                f"backend returned {rows.rows.shape[0]} rows for {item.param}, expected "
                f"{prepared.n_tokens}"
            )
        if rows.rows.shape[1] != self.model.manifest.hidden_size:
            raise BackendError(
                f"backend rows are {rows.rows.shape[1]}-d, the model's hidden size is "
                f"{self.model.manifest.hidden_size}"
            )
        single = None
        if opts.multivector:
            vector = self.model.projectors[opts.adapter_task](rows.rows, normalize=opts.normalized)
            if opts.single_too:
                single = single_vector(rows, prepared.prompt.pool, None, opts.normalized)
        else:
            vector = single_vector(rows, prepared.prompt.pool, opts.dimensions, opts.normalized)
        self.metrics.tokens.inc(prepared.n_tokens)
        self.metrics.images.inc(len(prepared.images))
        return EmbedResult(vector, prepared.n_tokens, t1 - t0, t2 - t1, single)

    def _prepare(self, item: Item, parts: list[str | bytes], opts: EmbedOptions) -> _Prepared:
        """Headers, token budget, then pixels: CPU work, run in a thread."""
        opened, grids = [], []
        for data, ref in zip(parts, item.parts, strict=True):
            if isinstance(data, bytes) and isinstance(ref, ImageRef):
                with _blame(ref.param):
                    img = image_mod.open_image(data)
                    grids.append(image_mod.image_grid(img.width, img.height, *self._pixels))
                opened.append((img, ref.param))
        image_tokens = sum(t * h * w for t, h, w in grids) // self.model.merged_patch_area
        prompt = self._prompt(item, parts, opts)
        budget = self._context_budget(opts.adapter_task)
        if opts.truncate and item.kind == "text":
            # bounded before tokenizing: a huge text costs what a fitting one does
            prompt = Prompt((self.model.truncate_text(prompt.segments[0], budget),), prompt.pool)
        n_text = self.model.count_tokens(prompt.counted_text())
        if n_text + image_tokens > budget:
            raise InputTooLargeError(
                f"input needs {n_text + image_tokens} tokens ({image_tokens} for images); "
                f"the maximum context is {budget} tokens",
                param=item.param,
            )
        images = []
        for img, param in opened:
            with _blame(param):
                images.append(image_mod.patch_levels(image_mod.load_rgb(img), *self._pixels))
        return _Prepared(prompt=prompt, images=images, n_tokens=n_text + image_tokens)

    @property
    def _pixels(self) -> tuple[int, int]:
        return self.model.manifest.min_pixels, self.model.manifest.max_pixels

    @staticmethod
    def _prompt(item: Item, parts: list[str | bytes], opts: EmbedOptions) -> Prompt:
        if item.kind == "text":
            assert isinstance(parts[0], str)
            return text_prompt(parts[0], opts.adapter_task, opts.role)
        if item.kind == "image":
            return image_prompt()
        return content_prompt([p if isinstance(p, str) else IMAGE for p in parts])

    def _context_budget(self, task: str) -> int:
        ctxs = [b.n_ctx for b in self.pools[task].backends if b.n_ctx]
        # llama.cpp needs the prompt strictly below the slot context
        return (min(ctxs) if ctxs else 4096) - 1

    async def _rows(self, task: str, prepared: _Prepared, param: str) -> Rows:
        """Send to the least-busy backend; on a dead backend, retry once after it is back."""
        pool = self.pools[task]
        last: BackendUnavailableError | None = None
        for attempt in range(2):
            if attempt and not await pool.wait_healthy(self.limits.retry_wait):
                break
            try:
                async with pool.acquire() as backend:
                    text = prepared.prompt.for_backend(backend.marker or "<__media__>", param)
                    return await backend.embed(
                        text, prepared.images, self.limits.request_timeout, param
                    )
            except BackendUnavailableError as exc:
                last = exc
        raise BackendUnavailableError(
            f"no backend for task {task!r} answered; it is restarting, retry shortly"
        ) from last


@contextlib.contextmanager
def _blame(param: str) -> Iterator[None]:
    """Errors raised inside name ``param`` as the request item at fault, unless they do."""
    try:
        yield
    except VlembedError as exc:
        exc.param = exc.param or param
        raise


async def _gather_or_cancel(coros: list) -> list:
    """Results in order; the first failure cancels the rest and is raised as itself."""
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(c) for c in coros]
    except BaseExceptionGroup as group_error:
        first = _first_error(group_error)
        raise first from first.__cause__
    return [t.result() for t in tasks]


def _first_error(group: BaseExceptionGroup) -> BaseException:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            return _first_error(exc)
        return exc
    return group
