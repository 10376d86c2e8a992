"""The service's only HTTP client: the patched llama-servers (and image URLs, when allowed).

Backends are chosen least-outstanding first. All httpx errors and backend statuses are
translated to vlembed's typed errors in this module alone (``_translate`` / ``_check_status`` /
``fetch_url``). A backend that fails to connect is marked unhealthy
until the health monitor sees it answer again; its media marker is re-read then, because
llama-server randomises the marker at every start.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import httpx
import numpy as np

from vlembed.errors import (
    BackendError,
    BackendTimeoutError,
    BackendUnavailableError,
    ImageError,
    InputTooLargeError,
    InvalidInputError,
)
from vlembed.geometry import Grid
from vlembed.wire import (
    PatchLevels,
    Rows,
    WireFormatError,
    decode_rows,
    encode_patches,
    encode_patches_body,
)

log = logging.getLogger("vlembed.backend")


async def fetch_url(url: str, max_bytes: int, timeout: float, param: str) -> bytes:
    """GET an image URL (when the operator allows it), streamed and bounded by ``max_bytes``."""
    try:
        async with httpx.AsyncClient(timeout=timeout, follow_redirects=True) as client:
            async with client.stream("GET", url) as resp:
                if resp.status_code != 200:
                    raise ImageError(
                        f"fetching the image URL gave HTTP {resp.status_code}", param=param
                    )
                chunks, size = [], 0
                async for chunk in resp.aiter_bytes():
                    size += len(chunk)
                    if size > max_bytes:
                        raise InputTooLargeError(
                            f"image URL body is over the {max_bytes} byte limit", param=param
                        )
                    chunks.append(chunk)
                return b"".join(chunks)
    except httpx.HTTPError as exc:
        raise ImageError(
            f"could not fetch the image URL ({type(exc).__name__})", param=param
        ) from exc


@dataclass
class Backend:
    """One llama-server serving one task."""

    url: str
    task: str
    client: httpx.AsyncClient
    healthy: bool = False
    outstanding: int = 0
    marker: str | None = None
    n_ctx: int | None = None  # per-slot context, from /props
    precomputed_patches: bool = False
    compact_patches: bool = False  # the server reads VLP1 bodies (from /props)
    allow_compact: bool = True  # False: always f32 JSON (``--patch-transport f32``)
    served: int = 0
    # liveness, read by the monitor (monotonic seconds): since when a /health probe has gone
    # without any answer (None once one answers, with any status: a loading server answers 503),
    # and since when the server owes an embedding answer: set when a request goes out with none
    # on the wire, moved to the time of each answer while others are still out. Both count from
    # the question, not from the last answer, so a monitor that was itself slow to ask again
    # does not make a server look silent
    probe_since: float | None = None
    owed_since: float | None = None
    sent: int = 0  # /embeddings requests on the wire now

    def stalled_for(self, now: float) -> float:
        """Seconds with requests on the wire and no /embeddings answer; 0 when idle."""
        if not self.sent or self.owed_since is None:
            return 0.0
        return now - self.owed_since

    def forget_liveness(self) -> None:
        """A new process owes nothing: called when the server behind the URL is replaced."""
        self.owed_since = None
        self.probe_since = None
        self.healthy = False
        self.marker = None

    async def refresh(self) -> bool:
        """Health check; props (media marker, context) are re-read whenever the backend was
        not known healthy, since a restarted llama-server has a new random marker."""
        if self.probe_since is None:
            self.probe_since = time.monotonic()
        try:
            health = await self.client.get(f"{self.url}/health", timeout=5.0)
            self.probe_since = None
            if health.status_code != 200:
                self.healthy = False
                return False
            if self.healthy and self.marker is not None:
                return True
            props = (await self.client.get(f"{self.url}/props", timeout=10.0)).json()
        except (httpx.HTTPError, ValueError):
            self.healthy = False
            return False
        self.marker = props.get("media_marker") or "<__media__>"
        settings = props.get("default_generation_settings") or {}
        self.n_ctx = int(settings.get("n_ctx") or 0) or None
        caps = props.get("vlembed") or {}
        self.precomputed_patches = bool(caps.get("precomputed_patches"))
        self.compact_patches = "vlp1_u8" in (caps.get("patch_bodies") or ())
        self.healthy = True
        return True

    async def embed(
        self,
        prompt: str,
        images: Sequence[PatchLevels | tuple[np.ndarray, Grid]],
        timeout: float,
        param: str | None = None,
    ) -> Rows:
        """Every token's row of one prompt (markers in ``prompt`` where the images go).

        Images given as ``PatchLevels`` go as a VLP1 body when this server reads it (and
        ``allow_compact``), else as their f32 rows in JSON; f32 rows always go as JSON.
        ``param`` names the request item, for the errors of a backend that refuses it.
        """
        request = self._request(prompt, images)
        if not self.sent:
            self.owed_since = time.monotonic()
        self.sent += 1
        try:
            if isinstance(request, bytes):
                resp = await self.client.post(
                    f"{self.url}/embeddings",
                    content=request,
                    headers={"Content-Type": "application/octet-stream"},
                    timeout=timeout,
                )
            else:
                resp = await self.client.post(
                    f"{self.url}/embeddings", json=request, timeout=timeout
                )
            # it answered, so it is making progress: what it still owes is counted from now
            self.owed_since = time.monotonic() if self.sent > 1 else None
        except httpx.HTTPError as exc:
            raise self._translate(exc) from exc
        finally:
            self.sent -= 1
        self._check_status(resp, param)
        try:
            rows = decode_rows(resp.content)
        except WireFormatError as exc:
            raise BackendError(f"backend {self.url} sent a malformed rows body: {exc}") from exc
        self.served += 1
        return rows

    def _request(
        self, prompt: str, images: Sequence[PatchLevels | tuple[np.ndarray, Grid]]
    ) -> bytes | dict[str, object]:
        """The request body: VLP1 bytes when every image is levels and the server reads them,
        else the JSON object (levels expanded to the same f32 rows)."""
        request: dict[str, object] = {"content": {"prompt_string": prompt}, "rows_format": "f32"}
        if not images:
            return request
        levels = [image for image in images if isinstance(image, PatchLevels)]
        if self.compact_patches and self.allow_compact and len(levels) == len(images):
            return encode_patches_body(request, levels)
        request["content"] = {
            "prompt_string": prompt,
            "multimodal_patches": [
                encode_patches(image.rows(), image.grid)
                if isinstance(image, PatchLevels)
                else encode_patches(*image)
                for image in images
            ],
        }
        return request

    def _translate(self, exc: httpx.HTTPError) -> Exception:
        log.warning("backend %s: %r", self.url, exc)
        if isinstance(exc, httpx.TimeoutException):
            return BackendTimeoutError(f"backend {self.url} did not answer in time")
        if isinstance(exc, httpx.ConnectError):
            # refused: the process is gone or restarting; the monitor re-reads its props
            self.healthy = False
            self.marker = None
        # a dropped keep-alive connection (RemoteProtocolError, ReadError) is not a dead server:
        # the caller retries, and a real crash shows up as ConnectError on that retry
        return BackendUnavailableError(f"backend {self.url} is unavailable ({type(exc).__name__})")

    def _check_status(self, resp: httpx.Response, param: str | None = None) -> None:
        if resp.status_code == 200:
            return
        try:
            message = str(resp.json()["error"]["message"])
        except (ValueError, KeyError, TypeError):
            message = resp.text[:500]
        if resp.status_code == 400:
            if "too large" in message or "context" in message:
                raise InputTooLargeError(f"input rejected by the backend: {message}", param=param)
            raise InvalidInputError(f"input rejected by the backend: {message}", param=param)
        if resp.status_code == 503:
            self.healthy = False
            raise BackendUnavailableError(f"backend {self.url} is loading or busy: {message}")
        raise BackendError(f"backend {self.url} answered {resp.status_code}: {message}")


@dataclass
class BackendPool:
    """The backends of one task; ``acquire`` picks the healthy one with least in flight."""

    task: str
    backends: list[Backend] = field(default_factory=list)
    _tiebreak: itertools.count = field(default_factory=itertools.count)

    def healthy(self) -> list[Backend]:
        return [b for b in self.backends if b.healthy]

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[Backend]:
        candidates = self.healthy()
        if not candidates:
            raise BackendUnavailableError(f"no healthy backend for task {self.task!r}")
        n = next(self._tiebreak)
        best = min(
            candidates,
            key=lambda b: (b.outstanding, (self.backends.index(b) - n) % len(self.backends)),
        )
        best.outstanding += 1
        try:
            yield best
        finally:
            best.outstanding -= 1

    async def wait_healthy(self, timeout: float) -> bool:
        """Bounded wait for any backend to come (back) up; never waits forever."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self.healthy():
                return True
            await asyncio.sleep(0.2)
        return bool(self.healthy())
