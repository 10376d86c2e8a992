"""The request guard: what is refused before a request body is read or parsed.

A pure ASGI middleware, so that it sees the body as it streams in: the API key is checked on
the headers (a client without it never gets its body read), a declared ``Content-Length`` over
the limit is refused at once, a chunked body is counted as it arrives and cut off at the limit,
and a body that stalls longer than ``body_timeout`` between chunks is answered 408.
``/health`` is open, everything else (metrics and API docs included) needs the key when one is
set.
"""

from __future__ import annotations

import asyncio
import secrets
from dataclasses import dataclass

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from preprocess_service.api.errors import error_response, vlembed_error_response
from vlembed.errors import AuthenticationError

OPEN_PATHS = frozenset({"/health"})


@dataclass(frozen=True)
class GuardConfig:
    api_key: str | None = None
    max_body_bytes: int = 256 << 20
    body_timeout: float = 30.0  # longest wait for the next chunk of a request body


class RequestGuard:
    def __init__(self, app: ASGIApp, config: GuardConfig) -> None:
        self.app = app
        self.config = config

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        refusal = self._refuse(scope["path"], headers)
        if refusal is not None:
            await refusal(scope, receive, send)
            return
        await self.app(scope, self._bounded(receive), send)

    def _refuse(self, path: str, headers: dict[str, str]):
        cfg = self.config
        if cfg.api_key is not None and path not in OPEN_PATHS:
            auth = headers.get("authorization", "")
            token = auth[7:] if auth.lower().startswith("bearer ") else ""
            if not secrets.compare_digest(token.encode(), cfg.api_key.encode()):
                return vlembed_error_response(
                    AuthenticationError("missing or invalid API key (Authorization: Bearer …)")
                )
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > cfg.max_body_bytes:
            return error_response(
                413, f"request body of {length} bytes is over the {cfg.max_body_bytes} byte limit"
            )
        return None

    def _bounded(self, receive: Receive) -> Receive:
        cfg = self.config
        state = {"size": 0, "done": False}

        async def bounded() -> Message:
            if state["done"]:
                return await receive()  # after the body: disconnect notices, unbounded wait
            try:
                message = await asyncio.wait_for(receive(), cfg.body_timeout)
            except TimeoutError:
                raise HTTPException(
                    408, f"request body stalled for more than {cfg.body_timeout:g} s"
                ) from None
            if message["type"] == "http.request":
                state["size"] += len(message.get("body", b""))
                if state["size"] > cfg.max_body_bytes:
                    raise HTTPException(
                        413, f"request body is over the {cfg.max_body_bytes} byte limit"
                    )
                state["done"] = not message.get("more_body", False)
            return message

        return bounded
