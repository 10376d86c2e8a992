"""Turn request items into pipeline jobs, resolving image references to bytes.

URL fetching and file paths are off unless the operator enables them: an embedding service
that fetches arbitrary URLs or reads arbitrary files on a client's say-so is an SSRF / file
disclosure hole.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from pathlib import Path

import httpx

from preprocess_service.api.protocol import (
    ContentInput,
    EmbeddingRequest,
    ImageInput,
    ImageURLPart,
    TextInput,
    TextPart,
)
from preprocess_service.embedder import EmbedJob, ImagePart, Part
from preprocess_service.errors import ImageError, InputTooLargeError, InvalidInputError

_DATA_URI = re.compile(r"^data:(?P<mime>[\w/+.-]*)(?P<params>(;[\w=.+-]+)*);base64,", re.I)


@dataclass(frozen=True)
class InputPolicy:
    allow_url_fetch: bool = False
    allow_file_dir: Path | None = None
    max_image_bytes: int = 32 << 20
    fetch_timeout: float = 10.0


def _b64(data: str, param: str) -> bytes:
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(
            "image is neither a data URI, a URL, nor valid base64", param=param
        ) from exc


async def resolve_image(ref: str, policy: InputPolicy, param: str) -> bytes:
    ref = ref.strip()
    if not ref:
        raise ImageError("image must not be empty", param=param)
    m = _DATA_URI.match(ref)
    if m:
        data = _b64(ref[m.end() :], param)
    elif ref.startswith(("http://", "https://")):
        if not policy.allow_url_fetch:
            raise InvalidInputError(
                "image URLs are not fetched by this server; send a data URI or base64",
                param=param,
            )
        data = await _fetch(ref, policy, param)
    elif ref.startswith("file://"):
        # only with the explicit scheme: raw base64 of a JPEG starts with "/9j/"
        data = _read_file(ref.removeprefix("file://"), policy, param)
    else:
        data = _b64(ref, param)
    if len(data) > policy.max_image_bytes:
        raise InputTooLargeError(
            f"image of {len(data)} bytes is over the {policy.max_image_bytes} byte limit",
            param=param,
        )
    return data


async def _fetch(url: str, policy: InputPolicy, param: str) -> bytes:
    try:
        async with httpx.AsyncClient(timeout=policy.fetch_timeout, follow_redirects=True) as c:
            async with c.stream("GET", url) as resp:
                if resp.status_code != 200:
                    raise ImageError(
                        f"fetching the image URL gave HTTP {resp.status_code}", param=param
                    )
                chunks, size = [], 0
                async for chunk in resp.aiter_bytes():
                    size += len(chunk)
                    if size > policy.max_image_bytes:
                        raise InputTooLargeError(
                            f"image URL body is over the {policy.max_image_bytes} byte limit",
                            param=param,
                        )
                    chunks.append(chunk)
                return b"".join(chunks)
    except httpx.HTTPError as exc:
        raise ImageError(
            f"could not fetch the image URL ({type(exc).__name__})", param=param
        ) from exc


def _read_file(path: str, policy: InputPolicy, param: str) -> bytes:
    if policy.allow_file_dir is None:
        raise InvalidInputError("file paths are not read by this server", param=param)
    root = policy.allow_file_dir.resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root):
        raise InvalidInputError("image path is outside the allowed directory", param=param)
    if not target.is_file():
        raise ImageError("image file not found", param=param)
    if target.stat().st_size > policy.max_image_bytes:
        raise InputTooLargeError(
            f"image file is over the {policy.max_image_bytes} byte limit", param=param
        )
    return target.read_bytes()


async def to_jobs(req: EmbeddingRequest, policy: InputPolicy) -> list[EmbedJob]:
    items = [req.input] if isinstance(req.input, str) else list(req.input)
    jobs: list[EmbedJob] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        if isinstance(item, str):
            jobs.append(EmbedJob((item,), "text"))
        elif isinstance(item, TextInput):
            jobs.append(EmbedJob((item.text,), "text"))
        elif isinstance(item, ImageInput):
            jobs.append(
                EmbedJob((ImagePart(await resolve_image(item.image, policy, param)),), "image")
            )
        else:
            parts = item.content if isinstance(item, ContentInput) else item
            if not parts:
                raise InvalidInputError("content must not be empty", param=param)
            resolved: list[Part] = []
            for j, part in enumerate(parts):
                if isinstance(part, TextPart):
                    resolved.append(part.text)
                else:
                    assert isinstance(part, ImageURLPart)
                    url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
                    resolved.append(
                        ImagePart(await resolve_image(url, policy, f"{param}.content[{j}]"))
                    )
            if all(isinstance(p, str) for p in resolved):
                text = "".join(resolved)  # type: ignore[arg-type]
                jobs.append(EmbedJob((text,), "text"))
            else:
                jobs.append(EmbedJob(tuple(resolved), "content"))
    return jobs
