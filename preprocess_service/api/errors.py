"""The one place where vlembed's typed errors become HTTP statuses and OpenAI error bodies."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from preprocess_service.errors import (
    AuthenticationError,
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    InputTooLargeError,
    InvalidInputError,
    OverloadedError,
    VlembedError,
)

# most specific first: the first matching class decides (status, OpenAI error type)
STATUS_TABLE: tuple[tuple[type[VlembedError], int, str], ...] = (
    (InputTooLargeError, 413, "invalid_request_error"),
    (InvalidInputError, 400, "invalid_request_error"),
    (AuthenticationError, 401, "authentication_error"),
    (OverloadedError, 429, "rate_limit_error"),
    (BackendUnavailableError, 503, "service_unavailable"),
    (BackendTimeoutError, 504, "timeout_error"),
    (BackendError, 502, "backend_error"),
    (VlembedError, 500, "server_error"),
)


def status_for(exc: VlembedError) -> tuple[int, str]:
    for cls, status, kind in STATUS_TABLE:
        if isinstance(exc, cls):
            return status, kind
    return 500, "server_error"


def error_body(message: str, kind: str, status: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


async def vlembed_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, VlembedError)
    status, kind = status_for(exc)
    headers = {}
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, round(retry_after)))
    if isinstance(exc, AuthenticationError):
        headers["WWW-Authenticate"] = "Bearer"
    return JSONResponse(error_body(str(exc), kind, status, exc.param), status, headers=headers)


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Schema violations are a 400 with the first problem spelled out, OpenAI style."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    msg = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more problems)"
    return JSONResponse(error_body(msg, "invalid_request_error", 400, param), 400)
