"""Output encodings of a float vector: float list, base64, and Jina's binary/ubinary.

binary/ubinary follow Jina's API (and sentence-transformers' ``quantize_embeddings``): one bit
per dimension, set when the component is > 0, packed 8 per byte with the FIRST dimension in the
MOST significant bit (``numpy.packbits`` order). ``ubinary`` is the packed bytes as uint8;
``binary`` is the same bytes shifted to int8 (byte - 128). base64 is the little-endian float32
bytes, as the OpenAI API and its SDK expect.
"""

from __future__ import annotations

import base64
from typing import Literal

import numpy as np

EmbeddingType = Literal["float", "base64", "binary", "ubinary"]
EMBEDDING_TYPES: tuple[str, ...] = ("float", "base64", "binary", "ubinary")


def pack_ubinary(vec: np.ndarray) -> np.ndarray:
    return np.packbits(vec > 0, axis=-1)


def pack_binary(vec: np.ndarray) -> np.ndarray:
    return (pack_ubinary(vec).astype(np.int16) - 128).astype(np.int8)


def encode(vec: np.ndarray, kind: str) -> list[float] | list[int] | str:
    """One vector (1-D) in the requested encoding."""
    if kind == "float":
        return vec.astype(np.float32).tolist()
    if kind == "base64":
        return base64.b64encode(np.ascontiguousarray(vec, dtype="<f4").tobytes()).decode("ascii")
    if kind == "ubinary":
        return pack_ubinary(vec).tolist()
    if kind == "binary":
        return pack_binary(vec).tolist()
    raise ValueError(f"unknown embedding type {kind!r}; valid: {list(EMBEDDING_TYPES)}")


def encode_any(vec: np.ndarray, kind: str) -> object:
    """A single vector, or a multi-vector (2-D) as a list of encoded rows."""
    if vec.ndim == 2:
        return [encode(row, kind) for row in vec]
    return encode(vec, kind)
