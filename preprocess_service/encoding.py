"""Output encodings: the numeric type (``embedding_type``) and the transport (``encoding_format``).

Two separate choices, as the OpenAI SDK always asks for ``encoding_format=base64``:

- ``embedding_type`` ``float`` keeps float32 numbers; ``binary``/``ubinary`` follow Jina's API
  (and sentence-transformers' ``quantize_embeddings``): one bit per dimension, set when the
  component is > 0, packed 8 per byte with the FIRST dimension in the MOST significant bit
  (``numpy.packbits`` order); ``ubinary`` is the packed bytes as uint8, ``binary`` the same
  bytes shifted to int8 (byte - 128).
- ``encoding_format`` ``float`` sends JSON numbers; ``base64`` sends the little-endian bytes of
  the numbers (float32, int8 or uint8). A multi-vector in base64 is ONE string of its rows,
  row-major: the SDK decodes it to a flat list, to be reshaped by the row width
  (``multi_vector_dim`` in ``/v1/models``).
"""

from __future__ import annotations

import base64

import numpy as np

EMBEDDING_TYPES: tuple[str, ...] = ("float", "binary", "ubinary")


def pack_ubinary(vec: np.ndarray) -> np.ndarray:
    return np.packbits(vec > 0, axis=-1)


def pack_binary(vec: np.ndarray) -> np.ndarray:
    return (pack_ubinary(vec).astype(np.int16) - 128).astype(np.int8)


_NUMERIC = {
    "float": lambda v: np.ascontiguousarray(v, dtype="<f4"),
    "ubinary": pack_ubinary,
    "binary": pack_binary,
}


def encode_any(vec: np.ndarray, embedding_type: str, encoding_format: str = "float") -> object:
    """A single vector (1-D) or a multi-vector (2-D) in the requested type and transport."""
    if embedding_type not in _NUMERIC:
        raise ValueError(f"unknown embedding type {embedding_type!r}; valid: {EMBEDDING_TYPES}")
    values = _NUMERIC[embedding_type](vec)
    if encoding_format == "base64":
        return base64.b64encode(np.ascontiguousarray(values).tobytes()).decode("ascii")
    if encoding_format != "float":
        raise ValueError(f"unknown encoding format {encoding_format!r}; valid: float, base64")
    return values.tolist()
