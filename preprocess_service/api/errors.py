"""The one place where errors become HTTP statuses and OpenAI-shaped error bodies.

vlembed's typed errors map through ``STATUS_TABLE`` (which also generates the OpenAPI error
responses); the framework's own refusals (unknown path, wrong method, unparsable or invalid
body) are answered in the same shape, with ``param`` the path of the offending item.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from vlembed.errors import (
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


def openapi_error_responses() -> dict[int, dict]:
    """The error statuses a route may answer, for its OpenAPI ``responses`` (from the table)."""
    from preprocess_service.api.protocol import ErrorResponse

    return {
        status: {"model": ErrorResponse, "description": kind}
        for _, status, kind in STATUS_TABLE
        if status < 500 or status in (502, 503, 504)
    }


# statuses the framework or the server itself answers
_HTTP_KINDS = {
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
}


def status_for(exc: VlembedError) -> tuple[int, str]:
    for cls, status, kind in STATUS_TABLE:
        if isinstance(exc, cls):
            return status, kind
    return 500, "server_error"


def error_body(message: str, kind: str, status: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_response(
    status: int, message: str, kind: str | None = None, param: str | None = None, headers=None
) -> JSONResponse:
    kind = kind or _HTTP_KINDS.get(status, "invalid_request_error" if status < 500 else "error")
    return JSONResponse(error_body(message, kind, status, param), status, headers=headers)


def vlembed_error_response(exc: VlembedError) -> JSONResponse:
    status, kind = status_for(exc)
    headers = {}
    retry_after = getattr(exc, "retry_after", None)
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, round(retry_after)))
    if isinstance(exc, AuthenticationError):
        headers["WWW-Authenticate"] = "Bearer"
    return error_response(status, str(exc), kind, exc.param, headers)


async def vlembed_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, VlembedError)
    return vlembed_error_response(exc)


async def http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """404, 405 and the framework's other refusals, in the OpenAI shape."""
    assert isinstance(exc, StarletteHTTPException)
    message = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {request.url.path}"
    elif exc.status_code == 405:
        message = f"method {request.method} is not allowed on {request.url.path}"
    elif exc.status_code == 400 and "parsing the body" in message:
        message = "request body is not valid JSON (or nested too deeply)"
    return error_response(exc.status_code, message, headers=getattr(exc, "headers", None))


def item_path(loc: tuple) -> str | None:
    """A pydantic error location as the request path of the item: ``input[1].content[0]``.

    Union-member and validator names pydantic puts in the location (``str``, ``TextInput``,
    ``list[...]``, ``function-after[...]``) are not fields of the request and are dropped.
    """
    path, last = "", None
    for part in loc:
        if isinstance(part, int):
            path, last = path + f"[{part}]", None
        elif (
            isinstance(part, str)
            and part.isidentifier()
            and not part[:1].isupper()
            and part not in _NOT_FIELDS
            and part != last  # a discriminated union's tag, then the field of the same name
        ):
            path, last = (path + f".{part}" if path else part), part
    return path or None


_NOT_FIELDS = frozenset({"body", "str", "int", "float", "bool", "list", "dict", "none"})


async def validation_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """Schema violations are a 400 with the first problem spelled out, OpenAI style."""
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    if any(e.get("type") == "json_invalid" for e in errors):
        return error_response(400, "request body is not valid JSON", param=None)
    # a union reports one error per member: the deepest location names the item best
    first = max(
        errors or [{"loc": (), "msg": "invalid request"}],
        key=lambda e: len(item_path(tuple(e.get("loc", ()))) or ""),
    )
    param = item_path(tuple(first.get("loc", ())))
    msg = f"{param}: {first.get('msg')}" if param else str(first.get("msg"))
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more problems)"
    return error_response(400, msg, "invalid_request_error", param)
