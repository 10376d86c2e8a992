"""Encoding of what goes to the patched llama-server and decoding of what comes back.

See docs/backend-protocol.md. Patches go as base64 of little-endian float32 — exact, so the
server sees HF's numbers bit for bit. Rows come back as a binary ``VLR1`` body: one 4-byte read
per row instead of parsing JSON floats.
"""

from __future__ import annotations

import base64
import struct
from dataclasses import dataclass

import numpy as np

from vlembed.constants import PATCH_DIM

MAGIC = b"VLR1"
_HEADER = struct.Struct("<4sIIII")
_CHUNK = struct.Struct("<IIIi")
_DTYPES = {0: np.dtype("<f4"), 1: np.dtype("<f2")}
CHUNK_TEXT, CHUNK_IMAGE = 0, 1


@dataclass(frozen=True)
class Chunk:
    kind: int  # CHUNK_TEXT or CHUNK_IMAGE
    first_row: int
    n_rows: int
    image_index: int  # -1 for text


@dataclass(frozen=True)
class Rows:
    """Every prompt token's final hidden state, in prompt order, and which rows are images."""

    rows: np.ndarray  # [n_rows, n_embd] float32
    chunks: tuple[Chunk, ...]

    @property
    def image_chunks(self) -> tuple[Chunk, ...]:
        return tuple(c for c in self.chunks if c.kind == CHUNK_IMAGE)


class WireFormatError(ValueError):
    """The backend's binary body is not a well-formed VLR1 record."""


def encode_patches(patches: np.ndarray, grid: tuple[int, int, int]) -> dict[str, object]:
    """One ``multimodal_patches`` entry: HF pixel_values rows [t*h*w, 1176] and the grid."""
    if patches.ndim != 2 or patches.shape[1] != PATCH_DIM:
        raise ValueError(f"patches must be [N, {PATCH_DIM}], got {patches.shape}")
    data = np.ascontiguousarray(patches, dtype="<f4").tobytes()
    return {"grid_thw": list(grid), "data": base64.b64encode(data).decode("ascii")}


def decode_rows(body: bytes) -> Rows:
    """Parse one VLR1 record; every length is checked before it is trusted."""
    if len(body) < _HEADER.size:
        raise WireFormatError(f"VLR1 body too short: {len(body)} bytes")
    magic, n_rows, n_embd, dtype, n_chunks = _HEADER.unpack_from(body, 0)
    if magic != MAGIC:
        raise WireFormatError(f"bad magic {magic!r}, expected {MAGIC!r}")
    if dtype not in _DTYPES:
        raise WireFormatError(f"unknown row dtype code {dtype}")
    table_end = _HEADER.size + n_chunks * _CHUNK.size
    np_dtype = _DTYPES[dtype]
    expected = table_end + n_rows * n_embd * np_dtype.itemsize
    if len(body) != expected:
        raise WireFormatError(f"VLR1 body has {len(body)} bytes, header implies {expected}")
    chunks = tuple(
        Chunk(*_CHUNK.unpack_from(body, _HEADER.size + i * _CHUNK.size)) for i in range(n_chunks)
    )
    covered = 0
    for c in chunks:
        if c.first_row != covered or c.n_rows < 0:
            raise WireFormatError(f"chunk map is not contiguous at row {covered}: {c}")
        covered += c.n_rows
    if covered != n_rows:
        raise WireFormatError(f"chunk map covers {covered} rows of {n_rows}")
    rows = np.frombuffer(body, dtype=np_dtype, count=n_rows * n_embd, offset=table_end)
    return Rows(rows=rows.reshape(n_rows, n_embd).astype(np.float32), chunks=chunks)


def encode_rows(rows: np.ndarray, chunks: list[Chunk], dtype: int = 0) -> bytes:
    """The inverse of ``decode_rows`` (tests and fakes use it to speak the protocol)."""
    head = _HEADER.pack(MAGIC, rows.shape[0], rows.shape[1], dtype, len(chunks))
    table = b"".join(_CHUNK.pack(c.kind, c.first_row, c.n_rows, c.image_index) for c in chunks)
    return head + table + np.ascontiguousarray(rows, dtype=_DTYPES[dtype]).tobytes()
