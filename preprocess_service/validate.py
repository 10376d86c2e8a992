"""Validation: one step, before any I/O or decoding, from a wire request to the pipeline's input.

Everything that can be judged from the request alone is judged here, and every refusal names the
path of the offending item (``input[3]``, ``input[1].content[0]``) in the OpenAI error's
``param``: the task and options against what this service serves, the encodings, the item count,
empty and over-long texts, texts the tokenizer cannot take, and image references too large to be
worth decoding. Only what needs the image bytes (format, geometry, the token budget of images)
is left to the stages after it.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass
from typing import Literal

from preprocess_service.api.protocol import (
    ContentInput,
    EmbeddingRequest,
    ImageInput,
    ImageURLPart,
    TextInput,
    TextPart,
)
from vlembed.errors import ImageError, InputTooLargeError, InvalidInputError
from vlembed.manifest import Manifest
from vlembed.tasks import TASKS, Role

_DATA_URI = re.compile(r"^data:(?P<mime>[\w/+.-]*)(?P<params>(;[\w=.+-]+)*);base64,", re.I)


@dataclass(frozen=True)
class ImageRef:
    """An image as the client named it: base64 bytes (decoded here), a URL or a file path."""

    kind: Literal["bytes", "url", "file"]
    value: str | bytes
    param: str


Part = str | ImageRef


@dataclass(frozen=True)
class Item:
    """One embedding to compute: a text, an image, or interleaved parts (one prompt)."""

    parts: tuple[Part, ...]
    kind: Literal["text", "image", "content"]
    param: str


@dataclass(frozen=True)
class EmbedOptions:
    """What the client asked for, checked against the served model."""

    task: str = "retrieval.query"  # API task name
    adapter_task: str = "retrieval"  # the GGUF / projector that serves it
    role: Role = "query"
    dimensions: int | None = None
    multivector: bool = False
    single_too: bool = False  # with multivector: the single vector as well, same rows
    normalized: bool = True
    truncate: bool = False
    embedding_type: Literal["float", "binary", "ubinary"] = "float"
    encoding_format: Literal["float", "base64"] = "float"


@dataclass(frozen=True)
class Limits:
    """Per-request bounds, all checked before any work (see docs/limits.md)."""

    max_items: int = 2048
    max_text_chars: int = 200_000  # beyond this no text fits any context we serve
    max_image_bytes: int = 32 << 20


@dataclass(frozen=True)
class ValidRequest:
    items: tuple[Item, ...]
    options: EmbedOptions


def validate(
    req: EmbeddingRequest, manifest: Manifest, served: set[str], limits: Limits
) -> ValidRequest:
    """The request as the pipeline's input, or the first reason it cannot be served.

    Args:
        req: The parsed wire request.
        manifest: The served model (dimensions, multi-vector width, kind of checkpoint).
        served: Adapter tasks with backends here.
        limits: Per-request bounds.
    """
    options = _options(req, manifest, served)
    raw = [req.input] if isinstance(req.input, str) else list(req.input)
    if not raw:
        raise InvalidInputError("input must not be empty", param="input")
    if len(raw) > limits.max_items:
        raise InvalidInputError(
            f"at most {limits.max_items} inputs per request, got {len(raw)}", param="input"
        )
    single = isinstance(req.input, str)
    items = tuple(
        _item(x, "input" if single else f"input[{i}]", options, limits) for i, x in enumerate(raw)
    )
    return ValidRequest(items=items, options=options)


def resolve_task(name: str, manifest: Manifest, served: set[str]) -> tuple[str, Role]:
    """API task name -> (adapter task served here, text role)."""
    if name not in TASKS:
        raise InvalidInputError(f"unknown task {name!r}; valid: {sorted(TASKS)}", param="task")
    task, role = TASKS[name]
    if task in served:
        return task, role
    if len(served) == 1 and manifest.source_kind != "jina-v4":
        return next(iter(served)), role  # a plain checkpoint: its one model serves every name
    valid = sorted(n for n, (t, _) in TASKS.items() if t in served)
    raise InvalidInputError(f"task {name!r} is not served here; served: {valid}", param="task")


def _options(req: EmbeddingRequest, m: Manifest, served: set[str]) -> EmbedOptions:
    task, role = resolve_task(req.task, m, served)
    if req.late_chunking:
        raise InvalidInputError(
            "late_chunking is not supported by this server; embed each chunk as its own input",
            param="late_chunking",
        )
    if req.return_multivector:
        if req.dimensions is not None:
            raise InvalidInputError(
                f"dimensions applies to single vectors; multi-vector rows are "
                f"{m.multi_vector_dim}-d",
                param="dimensions",
            )
        if not m.multi_vector_dim:
            raise InvalidInputError(
                "this model has no multi-vector projector", param="return_multivector"
            )
    if req.return_single_vector and not req.return_multivector:
        raise InvalidInputError(
            "return_single_vector adds the single vector to a multi-vector response; "
            "set return_multivector too (a single vector alone is the default response)",
            param="return_single_vector",
        )
    if req.dimensions is not None and req.dimensions not in m.matryoshka_dims:
        raise InvalidInputError(
            f"dimensions must be one of {m.matryoshka_dims}, got {req.dimensions}",
            param="dimensions",
        )
    # Jina's embedding_type "base64" predates encoding_format: float32 numbers, base64 transport
    numeric = "float" if req.embedding_type in (None, "base64") else req.embedding_type
    transport = req.encoding_format or ("base64" if req.embedding_type == "base64" else "float")
    return EmbedOptions(
        task=req.task,
        adapter_task=task,
        role=role,
        dimensions=req.dimensions,
        multivector=req.return_multivector,
        single_too=req.return_single_vector,
        normalized=req.normalized,
        truncate=req.truncate,
        embedding_type=numeric,  # type: ignore[arg-type]
        encoding_format=transport,  # type: ignore[arg-type]
    )


def _item(x: object, param: str, options: EmbedOptions, limits: Limits) -> Item:
    if isinstance(x, str):
        return Item((_text(x, param, options, limits),), "text", param)
    if isinstance(x, TextInput):
        return Item((_text(x.text, f"{param}.text", options, limits),), "text", param)
    if isinstance(x, ImageInput):
        return Item((_image_ref(x.image, f"{param}.image", limits),), "image", param)
    parts = x.content if isinstance(x, ContentInput) else x
    prefix = f"{param}.content" if isinstance(x, ContentInput) else param
    if not isinstance(parts, list) or not parts:
        raise InvalidInputError("content must not be empty", param=prefix)
    resolved: list[Part] = []
    for j, part in enumerate(parts):
        where = f"{prefix}[{j}]"
        if isinstance(part, TextPart):
            resolved.append(_text(part.text, f"{where}.text", options, limits, allow_empty=True))
        elif isinstance(part, ImageURLPart):
            url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
            resolved.append(_image_ref(url, f"{where}.image_url", limits))
        else:  # pragma: no cover - the protocol's discriminated union admits nothing else
            raise InvalidInputError("unknown content part", param=where)
    if all(isinstance(p, str) for p in resolved):
        text = "".join(resolved)  # type: ignore[arg-type]
        return Item((_text(text, prefix, options, limits),), "text", param)
    return Item(tuple(resolved), "content", param)


def _text(
    text: str, param: str, options: EmbedOptions, limits: Limits, allow_empty: bool = False
) -> str:
    if not allow_empty and not text.strip():
        raise InvalidInputError("text input must not be empty", param=param)
    if len(text) > limits.max_text_chars and not options.truncate:
        raise InputTooLargeError(
            f"text of {len(text)} characters is over the {limits.max_text_chars} character "
            "limit (set truncate to cut it)",
            param=param,
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # lone surrogates survive JSON parsing
        raise InvalidInputError(
            f"text is not valid Unicode: {exc.reason} at position {exc.start}", param=param
        ) from exc
    return text


def _image_ref(ref: str, param: str, limits: Limits) -> ImageRef:
    """Classify an image reference; base64 is decoded here, after a size check on its length."""
    ref = ref.strip()
    if not ref:
        raise ImageError("image must not be empty", param=param)
    m = _DATA_URI.match(ref)
    if ref.startswith(("http://", "https://")):
        return ImageRef("url", ref, param)
    if ref.startswith("file://"):
        # only with the explicit scheme: raw base64 of a JPEG starts with "/9j/"
        return ImageRef("file", ref.removeprefix("file://"), param)
    data = ref[m.end() :] if m else ref
    if len(data) // 4 * 3 > limits.max_image_bytes:
        raise InputTooLargeError(
            f"image of about {len(data) // 4 * 3} bytes is over the {limits.max_image_bytes} "
            "byte limit",
            param=param,
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(
            "image is neither a data URI, a URL, nor valid base64", param=param
        ) from exc
    if not raw:
        raise ImageError("image must not be empty", param=param)
    return ImageRef("bytes", raw, param)
