"""Inputs: image references resolved to bytes, the stage's only I/O.

Base64 was decoded by validation. URL fetching and file paths are off unless the operator
enables them: an embedding service that fetches arbitrary URLs or reads arbitrary files on a
client's say-so is an SSRF / file disclosure hole.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from preprocess_service.backend import fetch_url
from preprocess_service.validate import ImageRef
from vlembed.errors import ImageError, InputTooLargeError, InvalidInputError


@dataclass(frozen=True)
class InputPolicy:
    allow_url_fetch: bool = False
    allow_file_dir: Path | None = None
    max_image_bytes: int = 32 << 20
    fetch_timeout: float = 10.0


async def resolve_image(ref: ImageRef, policy: InputPolicy) -> bytes:
    """The bytes of one image reference, within ``policy``."""
    if ref.kind == "bytes":
        assert isinstance(ref.value, bytes)
        return ref.value
    assert isinstance(ref.value, str)
    if ref.kind == "url":
        if not policy.allow_url_fetch:
            raise InvalidInputError(
                "image URLs are not fetched by this server; send a data URI or base64",
                param=ref.param,
            )
        return await fetch_url(ref.value, policy.max_image_bytes, policy.fetch_timeout, ref.param)
    return _read_file(ref.value, policy, ref.param)


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
