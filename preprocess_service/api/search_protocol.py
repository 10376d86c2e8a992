"""Wire types of the search API (``POST /v1/search``). Pydantic only.

``preprocess_service/search.py`` turns a parsed request into a search and the search into the
response model here, so the OpenAPI schema is the wire format.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_K = 100
MAX_FILTER_CHARS = 1000


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SearchFilter(_Strict):
    """Which pages may be returned. Every field given must hold (AND)."""

    source: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_FILTER_CHARS,
        description="A substring of the page's source path (case-sensitive, no wildcards).",
    )
    page_min: int | None = Field(None, ge=1, description="Lowest page number (1-based).")
    page_max: int | None = Field(None, ge=1, description="Highest page number (1-based).")


class SearchRequest(_Strict):
    """POST /v1/search: the ``k`` best pages of the index for a text query, by MaxSim."""

    query: str = Field(description="The question; embedded as a retrieval.query.")
    k: int = Field(10, ge=1, le=MAX_K, description=f"Hits to return (1..{MAX_K}).")
    filter: SearchFilter | None = Field(None, description="Restrict the pages searched.")
    match_map: bool = Field(
        False,
        description="Return each hit's match map: for every merged image token of the page, "
        "the best similarity over the query's tokens, and one such map per query token.",
    )


class MatchMap(BaseModel):
    grid: tuple[int, int] = Field(description="(rows, cols) of merged image tokens.")
    values: list[list[float]] = Field(
        description="[rows][cols]: per image token, the max over query tokens of the dot "
        "product (the token's MaxSim contribution candidate)."
    )
    token_values: list[list[list[float]]] = Field(
        description="[query token][rows][cols]: the dot product with each query token."
    )


class SearchHit(BaseModel):
    object: Literal["search.hit"] = "search.hit"
    rank: int = Field(description="1-based position in the ranking.")
    id: str = Field(description="Page id; the thumbnail is at thumbnail_url.")
    source: str = Field(description="Absolute path of the indexed file.")
    page: int = Field(description="1-based page number in the file.")
    score: float = Field(description="MaxSim of the query with the page's stored rows.")
    width: int = Field(description="Width of the page as embedded (pixels).")
    height: int = Field(description="Height of the page as embedded (pixels).")
    thumbnail_url: str = Field(description="GET it (same API key) for the PNG thumbnail.")
    match_map: MatchMap | None = None


class SearchUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class SearchResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[SearchHit]
    model: str
    query_tokens: list[str] | list[int] = Field(
        description="The query's tokens as text, one per multi-vector row (token indices "
        "when the text cannot be recovered)."
    )
    usage: SearchUsage
