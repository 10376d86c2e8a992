"""The serving pipeline, free of HTTP: inputs → prompts → backend rows → pooled vectors.

The API layer turns wire requests into ``EmbedJob``s and results back into responses; this
module does the work and raises only vlembed's typed errors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from preprocess_service import image as image_mod
from preprocess_service.backend import BackendPool
from preprocess_service.backend_wire import Rows
from preprocess_service.errors import (
    BackendTimeoutError,
    BackendUnavailableError,
    InputTooLargeError,
    InvalidInputError,
    OverloadedError,
)
from preprocess_service.metrics import Metrics
from preprocess_service.model import ServedModel
from preprocess_service.pooling import single_vector
from preprocess_service.prompts import (
    TASKS,
    VISION_WRAP,
    Prompt,
    content_prompt,
    image_prompt,
    text_prompt,
)

MARKER_SLOT = "\x00image\x00"  # replaced by the chosen backend's media marker


@dataclass(frozen=True)
class ImagePart:
    data: bytes


Part = str | ImagePart


@dataclass(frozen=True)
class EmbedJob:
    """One embedding to compute: a text, an image, or interleaved parts."""

    parts: tuple[Part, ...]
    kind: str  # "text" | "image" | "content"


@dataclass(frozen=True)
class EmbedOptions:
    task: str = "retrieval.query"
    dimensions: int | None = None
    multivector: bool = False
    normalized: bool = True
    truncate: bool = False


@dataclass
class EmbedResult:
    vector: np.ndarray  # [dim] or [n_tokens, projector_dim]
    n_tokens: int
    n_images: int
    preprocess_s: float = 0.0  # decode + patchify + prompt + token count
    backend_s: float = 0.0  # llama-server round trip, rows decoded


@dataclass
class Limits:
    max_queue: int = 256  # items in flight before 429
    request_timeout: float = 120.0
    retry_wait: float = 15.0  # how long a request waits for a restarted backend
    max_items: int = 2048
    max_text_chars: int = 200_000  # beyond this no text fits any context we serve


@dataclass
class _Prepared:
    prompt: Prompt
    images: list[tuple[np.ndarray, tuple[int, int, int]]]
    n_tokens: int


@dataclass
class EmbeddingService:
    model: ServedModel
    pools: dict[str, BackendPool]
    limits: Limits = field(default_factory=Limits)
    metrics: Metrics = field(default_factory=Metrics)
    in_flight: int = 0

    def resolve_task(self, name: str) -> tuple[str, str]:
        if name not in TASKS:
            raise InvalidInputError(f"unknown task {name!r}; valid: {sorted(TASKS)}", param="task")
        task, role = TASKS[name]
        if task not in self.pools:
            served = sorted({t for t, _ in TASKS.values() if t in self.pools})
            if len(self.pools) == 1 and self.model.manifest.source_kind != "jina-v4":
                task = next(iter(self.pools))  # plain checkpoint: one task serves every name
            else:
                raise InvalidInputError(
                    f"task {name!r} is not served here; served adapter tasks: {served}",
                    param="task",
                )
        return task, role

    def check_options(self, opts: EmbedOptions) -> None:
        m = self.model.manifest
        if opts.multivector:
            if opts.dimensions is not None:
                raise InvalidInputError(
                    "dimensions applies to single vectors; multi-vector rows are "
                    f"{m.multi_vector_dim}-d",
                    param="dimensions",
                )
            if not m.multi_vector_dim:
                raise InvalidInputError(
                    "this model has no multi-vector projector", param="return_multivector"
                )
        if opts.dimensions is not None and opts.dimensions not in m.matryoshka_dims:
            raise InvalidInputError(
                f"dimensions must be one of {m.matryoshka_dims}, got {opts.dimensions}",
                param="dimensions",
            )

    async def embed(self, jobs: Sequence[EmbedJob], opts: EmbedOptions) -> list[EmbedResult]:
        """All jobs of one request, concurrently, within the request deadline."""
        if not jobs:
            raise InvalidInputError("input must not be empty", param="input")
        if len(jobs) > self.limits.max_items:
            raise InvalidInputError(
                f"at most {self.limits.max_items} inputs per request, got {len(jobs)}",
                param="input",
            )
        task, role = self.resolve_task(opts.task)
        self.check_options(opts)
        if self.in_flight + len(jobs) > self.limits.max_queue:
            raise OverloadedError(
                f"{self.in_flight} inputs in flight, limit {self.limits.max_queue}; retry later",
                retry_after=1.0,
            )
        self.in_flight += len(jobs)
        self.metrics.queue_depth.set(self.in_flight)
        try:
            coro = asyncio.gather(*(self._one(i, j, task, role, opts) for i, j in enumerate(jobs)))
            try:
                return await asyncio.wait_for(coro, self.limits.request_timeout)
            except TimeoutError as exc:
                raise BackendTimeoutError(
                    f"request took longer than {self.limits.request_timeout:.0f} s"
                ) from exc
        finally:
            self.in_flight -= len(jobs)
            self.metrics.queue_depth.set(self.in_flight)

    async def _one(
        self, index: int, job: EmbedJob, task: str, role: str, opts: EmbedOptions
    ) -> EmbedResult:
        t0 = time.perf_counter()
        try:
            prepared = await asyncio.to_thread(self._prepare, job, task, role, opts)
        except InvalidInputError as exc:
            exc.param = exc.param or f"input[{index}]"  # point the client at the bad item
            raise
        t1 = time.perf_counter()
        rows = await self._rows(task, prepared)
        t2 = time.perf_counter()
        self.metrics.stage.labels("preprocess").observe(t1 - t0)
        self.metrics.stage.labels("backend").observe(t2 - t1)
        if rows.rows.shape[0] != prepared.n_tokens:
            # the backend tokenized differently than we counted: a bug, never silently pooled
            raise RuntimeError(
                f"backend returned {rows.rows.shape[0]} rows, expected {prepared.n_tokens}"
            )
        if opts.multivector:
            vector = self.model.projectors[task](rows.rows, normalize=opts.normalized)
        else:
            vector = single_vector(rows, prepared.prompt.pool, opts.dimensions, opts.normalized)
        self.metrics.tokens.inc(prepared.n_tokens)
        self.metrics.images.inc(len(prepared.images))
        return EmbedResult(
            vector=vector,
            n_tokens=prepared.n_tokens,
            n_images=len(prepared.images),
            preprocess_s=t1 - t0,
            backend_s=t2 - t1,
        )

    def _prepare(self, job: EmbedJob, task: str, role: str, opts: EmbedOptions) -> _Prepared:
        """Decode/patchify images, build the prompt and count its tokens (CPU work, threaded)."""
        m = self.model.manifest
        images = []
        for part in job.parts:
            if isinstance(part, ImagePart):
                img = image_mod.decode_image(part.data)
                images.append(image_mod.patchify(img, m.min_pixels, m.max_pixels))
            elif len(part) > self.limits.max_text_chars and not opts.truncate:
                raise InputTooLargeError(
                    f"text of {len(part)} characters is over the {self.limits.max_text_chars} "
                    "character limit",
                    param="input",
                )
        if job.kind == "text":
            text = job.parts[0]
            assert isinstance(text, str)
            if not text.strip():
                raise InvalidInputError("text input must not be empty", param="input")
            prompt = text_prompt(text, task, role)  # type: ignore[arg-type]
        elif job.kind == "image":
            prompt = image_prompt(MARKER_SLOT)
        else:
            parts = [None if isinstance(p, ImagePart) else p for p in job.parts]
            prompt = content_prompt(parts, MARKER_SLOT)
        merge2 = m.merge_size**2
        image_tokens = sum(int(np.prod(g)) // merge2 for _, g in images)
        budget = self._context_budget(task)
        n_text = self.model.count_tokens(prompt.text.replace(MARKER_SLOT, VISION_WRAP))
        if n_text + image_tokens > budget:
            if opts.truncate and job.kind == "text" and image_tokens == 0:
                text = self.model.truncate_text(prompt.text, budget)
                prompt = Prompt(text, 0, prompt.pool)
                n_text = self.model.count_tokens(text)
            if n_text + image_tokens > budget:
                raise InputTooLargeError(
                    f"input needs {n_text + image_tokens} tokens ({image_tokens} for images); "
                    f"the maximum context is {budget} tokens",
                    param="input",
                )
        return _Prepared(prompt=prompt, images=images, n_tokens=n_text + image_tokens)

    def _context_budget(self, task: str) -> int:
        ctxs = [b.n_ctx for b in self.pools[task].backends if b.n_ctx]
        # llama.cpp needs the prompt strictly below the slot context
        return (min(ctxs) if ctxs else 4096) - 1

    async def _rows(self, task: str, prepared: _Prepared) -> Rows:
        """Send to the least-busy backend; on a dead backend, retry once after it is back."""
        pool = self.pools[task]
        last: BackendUnavailableError | None = None
        for attempt in range(2):
            if attempt and not await pool.wait_healthy(self.limits.retry_wait):
                break
            try:
                async with pool.acquire() as backend:
                    marker = backend.marker or "<__media__>"
                    text = prepared.prompt.text.replace(MARKER_SLOT, marker)
                    return await backend.embed(text, prepared.images, self.limits.request_timeout)
            except BackendUnavailableError as exc:
                last = exc
        raise BackendUnavailableError(
            f"no backend for task {task!r} answered; it is restarting, retry shortly"
        ) from last
