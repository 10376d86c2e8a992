"""FastAPI glue of the search API: ``POST /v1/search`` and ``GET /v1/search/thumbnail/{id}``.

Both need the API key like every other route (the guard) and answer errors in the OpenAI
shape (``api/errors.py``); without ``--index`` they answer 404. The logic is in
``preprocess_service/search.py``.
"""

from __future__ import annotations

import time

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from preprocess_service.api.errors import openapi_error_responses
from preprocess_service.api.protocol import ErrorResponse
from preprocess_service.api.search_protocol import (
    MatchMap,
    SearchHit,
    SearchRequest,
    SearchResponse,
    SearchUsage,
)
from preprocess_service.search import FoundPage, SearchResult, SearchService

__all__ = ["THUMBNAIL_PATH", "register"]

THUMBNAIL_PATH = "/v1/search/thumbnail"
_ERROR_RESPONSES = openapi_error_responses() | {
    404: {"model": ErrorResponse, "description": "not_found_error"}
}


def register(app: FastAPI) -> None:
    app.add_api_route(
        "/v1/search",
        search,
        methods=["POST"],
        response_model=SearchResponse,
        responses=_ERROR_RESPONSES,
    )
    app.add_api_route(
        THUMBNAIL_PATH + "/{page_id}",
        thumbnail,
        methods=["GET"],
        response_class=Response,
        responses={200: {"content": {"image/png": {}}}} | _ERROR_RESPONSES,
    )


def _searcher(request: Request) -> SearchService:
    searcher = request.app.state.vlembed.search
    if searcher is None:
        raise StarletteHTTPException(
            404, "this service has no document index; start it with --index DIR"
        )
    return searcher


async def search(req: SearchRequest, request: Request) -> JSONResponse:
    searcher = _searcher(request)
    start = time.perf_counter()
    valid = searcher.validate(req)
    result = await searcher.search(valid)
    body = _response(result, searcher.embedder.model.name)
    headers = {"x-total-time": f"{(time.perf_counter() - start) * 1000:.2f}ms"}
    return JSONResponse(body.model_dump(), headers=headers)


def _match_map(page: FoundPage) -> MatchMap | None:
    smap = page.similarity
    if smap is None:
        return None
    h, w = smap.grid
    start = smap.image_row_start
    tokens = smap.matrix[:, start : start + h * w].reshape(-1, h, w)
    return MatchMap(grid=(h, w), values=smap.image_map.tolist(), token_values=tokens.tolist())


def _response(result: SearchResult, model: str) -> SearchResponse:
    hits = [
        SearchHit(
            rank=rank,
            id=p.id,
            source=p.source,
            page=p.page,
            score=p.score,
            width=p.width,
            height=p.height,
            thumbnail_url=f"{THUMBNAIL_PATH}/{p.id}",
            match_map=_match_map(p),
        )
        for rank, p in enumerate(result.hits, start=1)
    ]
    n = result.n_tokens
    return SearchResponse(
        data=hits,
        model=model,
        query_tokens=result.query_tokens,
        usage=SearchUsage(prompt_tokens=n, total_tokens=n),
    )


async def thumbnail(page_id: str, request: Request) -> Response:
    png = await _searcher(request).thumbnail(page_id)
    if png is None:
        raise StarletteHTTPException(404, f"no page with id {page_id!r} in the index")
    return Response(png, media_type="image/png", headers={"Cache-Control": "private, max-age=300"})
