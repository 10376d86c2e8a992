"""FastAPI glue: routes, auth, error handlers, lifespan. The work happens in ``embedder``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from preprocess_service.api import errors as api_errors
from preprocess_service.api.inputs import InputPolicy, to_jobs
from preprocess_service.api.protocol import (
    EmbeddingRequest,
    EmbeddingResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from preprocess_service.embedder import EmbeddingService, EmbedOptions
from preprocess_service.encoding import encode_any
from preprocess_service.errors import AuthenticationError, InputTooLargeError, VlembedError
from preprocess_service.supervisor import ManagedServer

log = logging.getLogger("vlembed.api")

_ERROR_RESPONSES = {
    status: {"model": ErrorResponse, "description": kind}
    for _, status, kind in api_errors.STATUS_TABLE
    if status < 500 or status in (502, 503, 504)
}


@dataclass
class AppState:
    service: EmbeddingService
    policy: InputPolicy = field(default_factory=InputPolicy)
    api_key: str | None = None
    managed: list[tuple[ManagedServer, str]] = field(default_factory=list)  # (server, task)
    startup_timeout: float = 180.0
    max_body_bytes: int = 256 << 20
    monitor_interval: float = 0.5


async def _monitor(state: AppState) -> None:
    """Restart dead local servers; keep every backend's health (and media marker) current."""
    svc = state.service
    last_full = 0.0
    while True:
        for server, _task in state.managed:
            if server.maybe_restart():
                svc.metrics.restarts.inc()
        now = time.monotonic()
        full = now - last_full > 2.0
        checks = [
            b.refresh()
            for pool in svc.pools.values()
            for b in pool.backends
            if full or not b.healthy
        ]
        if checks:
            await asyncio.gather(*checks, return_exceptions=True)
        if full:
            last_full = now
        for task, pool in svc.pools.items():
            svc.metrics.backends_healthy.labels(task).set(len(pool.healthy()))
        await asyncio.sleep(state.monitor_interval)


def create_app(state: AppState) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        for server, _ in state.managed:
            server.start()
        pools = list(state.service.pools.values())
        deadline = time.monotonic() + state.startup_timeout
        while time.monotonic() < deadline:
            await asyncio.gather(*(b.refresh() for p in pools for b in p.backends))
            if all(p.healthy() for p in pools):
                break
            if any(s.exited() is not None for s, _ in state.managed):
                break  # a crash at start: the monitor restarts it; /health says so meanwhile
            await asyncio.sleep(0.25)
        monitor = asyncio.create_task(_monitor(state))
        try:
            yield
        finally:
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor
            for server, _ in state.managed:
                server.stop()
            for p in pools:
                for b in p.backends:
                    await b.client.aclose()

    app = FastAPI(
        title="vlembed",
        description="jina-embeddings-v4 style multimodal embeddings on a patched llama.cpp",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.add_exception_handler(VlembedError, api_errors.vlembed_error_handler)
    app.add_exception_handler(RequestValidationError, api_errors.validation_error_handler)

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        length = request.headers.get("content-length")
        if length and length.isdigit() and int(length) > state.max_body_bytes:
            exc = InputTooLargeError(
                f"request body of {length} bytes is over the {state.max_body_bytes} byte limit"
            )
            return await api_errors.vlembed_error_handler(request, exc)
        return await call_next(request)

    async def check_key(request: Request) -> None:
        if state.api_key is None:
            return
        auth = request.headers.get("authorization", "")
        token = auth[7:] if auth.lower().startswith("bearer ") else ""
        if not secrets.compare_digest(token.encode(), state.api_key.encode()):
            raise AuthenticationError("missing or invalid API key (Authorization: Bearer …)")

    svc = state.service

    @app.post(
        "/v1/embeddings",
        response_model=EmbeddingResponse,
        responses=_ERROR_RESPONSES,
        dependencies=[Depends(check_key)],
    )
    async def embeddings(req: EmbeddingRequest) -> Response:
        start = time.perf_counter()
        status = "error"
        try:
            kind = req.resolved_embedding_type()
            opts = EmbedOptions(
                task=req.task,
                dimensions=req.dimensions,
                multivector=req.return_multivector,
                normalized=req.normalized,
                truncate=req.truncate,
            )
            svc.resolve_task(opts.task)
            svc.check_options(opts)
            jobs = await to_jobs(req, state.policy)
            results = await svc.embed(jobs, opts)
            n_tokens = sum(r.n_tokens for r in results)
            body = {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": encode_any(r.vector, kind)}
                    for i, r in enumerate(results)
                ],
                "model": svc.model.name,
                "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
            }
            status = "ok"
            elapsed = time.perf_counter() - start
            # per-stage timings (summed over the request's items, which run concurrently)
            headers = {
                "x-total-time": f"{elapsed * 1000:.2f}ms",
                "x-preprocess-time": f"{sum(r.preprocess_s for r in results) * 1000:.2f}ms",
                "x-backend-time": f"{sum(r.backend_s for r in results) * 1000:.2f}ms",
            }
            return JSONResponse(body, headers=headers)
        finally:
            svc.metrics.requests.labels(status).inc()
            svc.metrics.latency.observe(time.perf_counter() - start)

    @app.get("/v1/models", response_model=ModelList, dependencies=[Depends(check_key)])
    async def models() -> ModelList:
        m = svc.model.manifest
        card = ModelCard(
            id=m.model_name,
            tasks=list(svc.pools),
            dimensions=m.matryoshka_dims,
            multi_vector_dim=m.multi_vector_dim,
        )
        return ModelList(data=[card])

    @app.get("/health")
    async def health() -> JSONResponse:
        tasks = {t: len(p.healthy()) for t, p in svc.pools.items()}
        ready = all(tasks.values())
        body = {"status": "ok" if ready else "unavailable", "healthy_backends": tasks}
        return JSONResponse(body, 200 if ready else 503)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(svc.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return app
