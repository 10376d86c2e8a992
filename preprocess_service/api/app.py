"""FastAPI glue: the routes, each a few lines from validated request to declared response.

Request flow: ``guard`` (key, body size and pace) → ``protocol`` (parse) → ``validate`` (every
check that needs no I/O) → ``embedder`` (inputs → image → prompts → backend → pooling) →
``encoding`` → the response model. Errors are raised, never returned, and become HTTP responses
in ``errors`` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from preprocess_service.api import errors as api_errors
from preprocess_service.api import search as api_search
from preprocess_service.api.guard import RequestGuard
from preprocess_service.api.lifecycle import AppState, lifespan
from preprocess_service.api.protocol import (
    EmbeddingData,
    EmbeddingRequest,
    EmbeddingResponse,
    ModelCard,
    ModelList,
    Usage,
)
from preprocess_service.embedder import EmbeddingService, EmbedResult
from preprocess_service.encoding import encode_any
from preprocess_service.validate import ValidRequest, validate
from vlembed.errors import VlembedError

__all__ = ["AppState", "create_app"]

_ERROR_RESPONSES = api_errors.openapi_error_responses()


def create_app(state: AppState) -> FastAPI:
    app = FastAPI(
        title="vlembed",
        description="jina-embeddings-v4 style multimodal embeddings on a patched llama.cpp",
        version="0.1.0",
        lifespan=lifespan(state),
    )
    app.state.vlembed = state
    app.add_exception_handler(VlembedError, api_errors.vlembed_error_handler)
    app.add_exception_handler(RequestValidationError, api_errors.validation_error_handler)
    app.add_exception_handler(StarletteHTTPException, api_errors.http_error_handler)
    app.add_middleware(RequestGuard, config=state.guard)
    if state.search is not None:
        from preprocess_service.ui import PageFiles

        app.add_middleware(PageFiles)  # outside the guard: the page loads without the key
    app.add_api_route(
        "/v1/embeddings",
        embeddings,
        methods=["POST"],
        response_model=EmbeddingResponse,
        responses=_ERROR_RESPONSES,
    )
    app.add_api_route("/v1/models", models, methods=["GET"], response_model=ModelList)
    app.add_api_route(
        "/v1/models/{model_id:path}", model, methods=["GET"], response_model=ModelCard
    )
    api_search.register(app)
    app.add_api_route("/health", health, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    return app


def _state(request: Request) -> AppState:
    return request.app.state.vlembed


async def embeddings(req: EmbeddingRequest, request: Request) -> JSONResponse:
    state = _state(request)
    svc = state.service
    start = time.perf_counter()
    status = "error"
    try:
        valid = validate(req, svc.model.manifest, svc.served_tasks, state.limits)
        results = await _unless_disconnected(request, svc.embed(valid))
        body = _response(valid, results, svc)
        status = "ok"
        elapsed = time.perf_counter() - start
        # per-stage timings (summed over the request's items, which run concurrently)
        headers = {
            "x-total-time": f"{elapsed * 1000:.2f}ms",
            "x-preprocess-time": f"{sum(r.preprocess_s for r in results) * 1000:.2f}ms",
            "x-backend-time": f"{sum(r.backend_s for r in results) * 1000:.2f}ms",
        }
        # single_embedding only where asked for: plain OpenAI responses keep their shape
        return JSONResponse(body.model_dump(exclude_none=True), headers=headers)
    finally:
        svc.metrics.requests.labels(status).inc()
        svc.metrics.latency.observe(time.perf_counter() - start)


def _response(
    valid: ValidRequest, results: list[EmbedResult], svc: EmbeddingService
) -> EmbeddingResponse:
    opts = valid.options
    n_tokens = sum(r.n_tokens for r in results)
    data = [
        EmbeddingData(
            index=i,
            embedding=encode_any(r.vector, opts.embedding_type, opts.encoding_format),
            single_embedding=None
            if r.single is None
            else encode_any(r.single, opts.embedding_type, opts.encoding_format),
        )
        for i, r in enumerate(results)
    ]
    return EmbeddingResponse(
        data=data,
        model=svc.model.name,
        usage=Usage(prompt_tokens=n_tokens, total_tokens=n_tokens),
    )


async def _unless_disconnected(request: Request, work):
    """Run ``work``; cancel it when the client goes away (its items stop costing anything)."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
            raise StarletteHTTPException(499, "client closed the request")
    return task.result()


async def _disconnected(request: Request) -> None:
    while not await request.is_disconnected():
        await asyncio.sleep(0.2)


def _card(svc: EmbeddingService) -> ModelCard:
    m = svc.model.manifest
    return ModelCard(
        id=m.model_name,
        tasks=sorted(svc.pools),
        dimensions=m.matryoshka_dims,
        multi_vector_dim=m.multi_vector_dim,
        revision=m.source_fingerprint[:16] or None,
        min_pixels=m.min_pixels,
        max_pixels=m.max_pixels,
    )


async def models(request: Request) -> ModelList:
    return ModelList(data=[_card(_state(request).service)])


async def model(model_id: str, request: Request) -> ModelCard:
    card = _card(_state(request).service)
    if model_id != card.id:
        raise StarletteHTTPException(404, f"model {model_id!r} is not served here")
    return card


async def health(request: Request) -> JSONResponse:
    svc = _state(request).service
    tasks = {t: len(p.healthy()) for t, p in svc.pools.items()}
    ready = all(tasks.values())
    body = {"status": "ok" if ready else "unavailable", "healthy_backends": tasks}
    return JSONResponse(body, 200 if ready else 503)


async def metrics(request: Request) -> Response:
    registry = _state(request).service.metrics.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)
