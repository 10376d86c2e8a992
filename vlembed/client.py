"""``vlembed.Client``: the Python client of a running ``vlembed serve`` (``/v1/embeddings``).

Users, the evaluation harness, the benchmark and the index all talk to the service through it.

- **Start-up check.** ``GET /v1/models`` is called once in the constructor, so a wrong URL or a
  server serving no model fails before any work starts; the served model id, its Matryoshka
  widths and multi-vector width become attributes.
- **Retries only where waiting helps.** Timeouts, the client's own and the service's (``504``:
  a backend that answered nothing in time is restarted by the service), and ``429``/``503`` (the
  service's answer when it is full or a backend is starting) are retried with backoff, honouring
  ``Retry-After``. Any other 4xx/5xx fails at once with the server's own message: an invalid
  request does not become valid by sending it again.
- **One exception type.** Every failure surfaces as :class:`vlembed.errors.ServiceError`,
  chained to the httpx exception that caused it; httpx errors are translated only here.
- **Bounded requests.** Inputs are sent in chunks (item count and payload bytes).
- **Images.** A PIL image is sent as lossless PNG after the Hugging Face processor's RGB
  conversion (transparency composited onto white), so the service sees the pixels the reference
  model sees for the same object. Bytes and paths are sent as the file's own bytes: the service
  then opens them as jina-embeddings-v4's loader opens a file (``Image.open(...).convert("RGB")``).
"""

from __future__ import annotations

import base64
import email.utils
import io
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
from PIL import Image

from vlembed.errors import ServiceError
from vlembed.pixels import to_rgb
from vlembed.tasks import API_TASKS

_T = TypeVar("_T")

__all__ = ["Client", "Item", "image_data_uri"]

Item = str | Image.Image | bytes | os.PathLike | Mapping[str, Any]
"""One input: a text; an image as a PIL object, file bytes or a path; or a wire item dict
(``{"text": …}``, ``{"image": …}``, ``{"content": [...]}``) passed through as is."""

RETRY_STATUSES = (429, 503, 504)


def image_data_uri(image: Image.Image) -> str:
    """PNG data URI of an image as the reference processor sees it (lossless RGB)."""
    buf = io.BytesIO()
    to_rgb(image).save(buf, format="PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def bytes_data_uri(data: bytes) -> str:
    """The file's own bytes as base64; the service detects the format from its header."""
    return "data:application/octet-stream;base64," + base64.b64encode(data).decode("ascii")


def _wire_item(item: Item) -> dict[str, Any]:
    if isinstance(item, str):
        return {"text": item}
    if isinstance(item, Image.Image):
        return {"image": image_data_uri(item)}
    if isinstance(item, bytes | bytearray | memoryview):
        return {"image": bytes_data_uri(bytes(item))}
    if isinstance(item, os.PathLike):
        return {"image": bytes_data_uri(Path(item).read_bytes())}
    if isinstance(item, Mapping):
        return dict(item)
    raise TypeError(
        f"cannot send a {type(item).__name__}; expected str, PIL image, bytes, path or dict"
    )


def _wire_size(item: dict[str, Any]) -> int:
    """Approximate JSON size of a text or image item (its one string dominates)."""
    return sum(len(v) if isinstance(v, str) else 16 for v in item.values()) + 16


def _error_from(response: httpx.Response, note: str = "") -> ServiceError:
    """A ServiceError carrying the server's message (OpenAI-shaped body, else its text)."""
    message, error_type, code = response.text[:500], None, None
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        message = str(err.get("message", message))
        error_type = err.get("type")
        code = err.get("code")
    request = response.request
    text = f"{request.method} {request.url} -> {response.status_code}: {message}"
    return ServiceError(
        text + (f" ({note})" if note else ""),
        status=response.status_code,
        error_type=error_type,
        code=code,
    )


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds (delta-seconds or HTTP date), or None if absent/invalid."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


class Client:
    """A running ``vlembed serve``; also an :class:`eval.backends.Backend`.

    Args:
        base_url: Service root, e.g. ``http://localhost:8080`` (``/v1/...`` is appended).
        model: Model id to request; default: the first id ``/v1/models`` lists.
        timeout: Seconds per request (a page image can take seconds on CPU).
        max_retries: Retries after the first attempt, for timeouts and 429/503/504.
        max_wait: Upper bound on one wait between retries, whatever ``Retry-After`` says.
        max_items: Inputs per request.
        max_request_bytes: Approximate JSON payload bound per request (images dominate).
        concurrency: Requests in flight at once (order of results is kept).
        api_key: Sent as ``Authorization: Bearer …`` when the service requires a key.
        transport: httpx transport (tests pass ``httpx.MockTransport``).
        sleep: Called with the seconds to wait between retries (tests pass a recorder).
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:8000",
        *,
        model: str | None = None,
        timeout: float = 300.0,
        max_retries: int = 5,
        max_wait: float = 120.0,
        max_items: int = 16,
        max_request_bytes: int = 16 << 20,
        concurrency: int = 1,
        api_key: str | None = None,
        transport: httpx.BaseTransport | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if concurrency < 1 or max_items < 1 or max_retries < 0:
            raise ValueError(
                f"need concurrency >= 1, max_items >= 1, max_retries >= 0; got {concurrency}, "
                f"{max_items}, {max_retries}"
            )
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_wait = max_wait
        self.max_items = max_items
        self.max_request_bytes = max_request_bytes
        self.concurrency = concurrency
        self._sleep = sleep
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self._client = httpx.Client(
            base_url=self.base_url, timeout=timeout, transport=transport, headers=headers
        )
        self.n_parameters: int | None = None
        self.revision: str | None = None
        self.dim: int | None = None
        self.multi_dim: int | None = None
        self.min_pixels: int | None = None  # the served model's resize bounds (``/v1/models``)
        self.max_pixels: int | None = None
        self.name = self._check_models(model)

    # --- requests -------------------------------------------------------------------------

    def _send(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        """One API call with the retry policy of the module docstring; returns the JSON body."""
        url = self.base_url + path
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                response = self._client.request(method, path, json=payload)
            except httpx.TimeoutException as exc:
                if last:
                    raise ServiceError(
                        f"{method} {url} timed out {attempt + 1} times ({self.timeout:g} s each)"
                    ) from exc
                self._sleep(self._backoff(attempt))
                continue
            except httpx.TransportError as exc:
                raise ServiceError(f"cannot reach {url}: {exc}") from exc
            if response.status_code in RETRY_STATUSES:
                if last:
                    raise _error_from(response, f"gave up after {attempt + 1} attempts")
                wait = _retry_after(response)
                if wait is None:
                    wait = self._backoff(attempt)
                self._sleep(min(self.max_wait, wait))
                continue
            if response.status_code >= 400:
                raise _error_from(response)
            try:
                return response.json()
            except ValueError as exc:
                raise ServiceError(
                    f"{method} {url} -> {response.status_code}: body is not JSON: "
                    f"{response.text[:200]!r}",
                    status=response.status_code,
                ) from exc
        raise AssertionError("unreachable")  # the loop returns or raises

    def _backoff(self, attempt: int) -> float:
        return min(self.max_wait, 0.5 * 2**attempt)

    def _check_models(self, wanted: str | None) -> str:
        body = self._send("GET", "/v1/models")
        entries = body.get("data") if isinstance(body, dict) else None
        if not isinstance(entries, list):
            raise ServiceError(f"{self.base_url}/v1/models: expected a 'data' list, got {body!r}")
        ids = [str(e["id"]) for e in entries if isinstance(e, dict) and "id" in e]
        if not ids:
            raise ServiceError(f"{self.base_url}/v1/models lists no model")
        name = wanted if wanted is not None else ids[0]
        if name not in ids:
            raise ServiceError(f"{self.base_url} does not serve model {name!r}; it serves {ids}")
        entry = next(e for e in entries if isinstance(e, dict) and e.get("id") == name)
        revision = entry.get("revision")
        self.revision = str(revision) if revision else None
        dims = entry.get("dimensions")
        if isinstance(dims, list) and dims and all(isinstance(d, int) for d in dims):
            self.dim = max(dims)
        multi = entry.get("multi_vector_dim")
        self.multi_dim = multi if isinstance(multi, int) else None
        for key in ("min_pixels", "max_pixels"):
            value = entry.get(key)
            setattr(self, key, value if isinstance(value, int) else None)
        return name

    # --- embeddings -----------------------------------------------------------------------

    def embed(
        self,
        items: Sequence[Item],
        *,
        task: str = "retrieval.query",
        multivector: bool = False,
        dimensions: int | None = None,
    ) -> list[np.ndarray]:
        """Embed ``items`` in as few requests as the bounds allow, results in input order.

        Args:
            items: Texts, images (PIL, bytes, paths) or wire item dicts; see :data:`Item`.
            task: One of :data:`vlembed.tasks.API_TASKS`.
            multivector: One L2-normalised row per token (``[n_tokens, dim]``) instead of one
                ``[dim]`` vector per item.
            dimensions: Matryoshka width of single vectors (one of the model's dimensions).
        """
        if task not in API_TASKS:
            raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(API_TASKS)}")

        def run(chunk: list[dict[str, Any]]) -> list[np.ndarray]:
            return self._embed_chunk(chunk, task, multivector, dimensions)

        return self._in_requests(items, run)

    def embed_both(
        self, items: Sequence[Item], *, task: str = "retrieval.passage"
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """``(single vector, multi-vector)`` of every item from one forward pass each.

        A document index stores both; asking for them in one request (the service's
        ``return_single_vector`` extension) halves the work per page. A service that predates
        the extension answers the multi-vector alone; the single vectors are then fetched with
        a second request, as two calls of :meth:`embed` would.
        """
        if task not in API_TASKS:
            raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(API_TASKS)}")

        def run(chunk: list[dict[str, Any]]) -> list[tuple[np.ndarray, np.ndarray]]:
            payload = self._payload(chunk, task, True, None)
            body = self._send("POST", "/v1/embeddings", {**payload, "return_single_vector": True})
            multis = _parse_embeddings(body, len(chunk), True, self.base_url)
            singles = _parse_singles(body, len(chunk), self.base_url)
            if singles is None:
                singles = self._embed_chunk(chunk, task, False, None)
            return list(zip(singles, multis, strict=True))

        return self._in_requests(items, run)

    def _in_requests(
        self, items: Sequence[Item], run: Callable[[list[dict[str, Any]]], list[_T]]
    ) -> list[_T]:
        """``run`` over the items cut into requests (in flight together), results in order."""
        wire = [_wire_item(item) for item in items]
        # with several requests in flight, split even a small batch across them
        per_request = min(self.max_items, max(1, -(-len(wire) // self.concurrency)))
        chunks = self._chunks(wire, per_request)
        if self.concurrency == 1 or len(chunks) == 1:
            parts = [run(c) for c in chunks]
        else:
            with ThreadPoolExecutor(max_workers=self.concurrency) as pool:
                parts = list(pool.map(run, chunks))
        return [out for part in parts for out in part]

    def _chunks(self, wire: list[dict[str, Any]], per_request: int) -> list[list[dict[str, Any]]]:
        """Consecutive runs of at most ``per_request`` items and ``max_request_bytes``."""
        chunks: list[list[dict[str, Any]]] = []
        current: list[dict[str, Any]] = []
        size = 0
        for item in wire:
            item_size = len(json.dumps(item)) if "content" in item else _wire_size(item)
            full = len(current) >= per_request or size + item_size > self.max_request_bytes
            if current and full:
                chunks.append(current)
                current, size = [], 0
            current.append(item)
            size += item_size
        if current:
            chunks.append(current)
        return chunks

    def _embed_chunk(
        self,
        chunk: list[dict[str, Any]],
        task: str,
        multivector: bool,
        dimensions: int | None,
    ) -> list[np.ndarray]:
        body = self._send(
            "POST", "/v1/embeddings", self._payload(chunk, task, multivector, dimensions)
        )
        return _parse_embeddings(body, len(chunk), multivector, self.base_url)

    def _payload(
        self, chunk: list[dict[str, Any]], task: str, multivector: bool, dimensions: int | None
    ) -> dict[str, Any]:
        return {
            "model": self.name,
            "input": chunk,
            "task": task,
            "return_multivector": multivector,
            "dimensions": dimensions,
            "embedding_type": "float",
        }

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _parse_singles(body: dict[str, Any], n: int, where: str) -> list[np.ndarray] | None:
    """The ``single_embedding`` of every entry (already checked by ``_parse_embeddings``), or
    None when the service sent none (it predates ``return_single_vector``)."""
    by_index = sorted(body["data"], key=lambda d: d["index"])
    if all("single_embedding" not in d for d in by_index):
        return None
    out = []
    for d in by_index:
        try:
            vec = np.asarray(d.get("single_embedding"), dtype=np.float32)
        except (TypeError, ValueError):
            vec = np.zeros((0,), dtype=np.float32)
        if vec.ndim != 1 or vec.size == 0 or not bool(np.isfinite(vec).all()):
            raise ServiceError(
                f"{where}/v1/embeddings: item {d['index']} has a single_embedding of shape "
                f"{vec.shape}; expected a [dim] vector of finite floats"
            )
        out.append(vec)
    return out


def _parse_embeddings(body: Any, n: int, multivector: bool, where: str) -> list[np.ndarray]:
    """Check and convert a ``/v1/embeddings`` body: n entries, indices 0..n-1, right rank."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or len(data) != n:
        got = len(data) if isinstance(data, list) else type(data).__name__
        raise ServiceError(f"{where}/v1/embeddings: expected {n} embeddings, got {got}")
    by_index = sorted(data, key=lambda d: d.get("index", -1) if isinstance(d, dict) else -1)
    if [d.get("index") for d in by_index] != list(range(n)):
        raise ServiceError(f"{where}/v1/embeddings: indices are not 0..{n - 1}")
    want_ndim = 2 if multivector else 1
    out = []
    for d in by_index:
        try:
            vec = np.asarray(d.get("embedding"), dtype=np.float32)
        except (TypeError, ValueError):  # ragged rows, strings, None
            vec = np.zeros((0,), dtype=np.float32)
        if vec.ndim != want_ndim or vec.size == 0 or not bool(np.isfinite(vec).all()):
            raise ServiceError(
                f"{where}/v1/embeddings: item {d['index']} has shape {vec.shape}; expected a "
                f"{'[n_tokens, dim] multi-vector' if multivector else '[dim] vector'} of "
                "finite floats"
            )
        out.append(vec)
    return out
