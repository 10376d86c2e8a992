"""Encoding of what goes to the patched llama-server and decoding of what comes back.

See docs/backend-protocol.md. Patches go either as base64 of little-endian float32 rows in JSON,
or, where the server advertises it, as a binary ``VLP1`` body of what determines those rows:
uint8 pixels of one temporal half in patch order and the per-channel table that maps a pixel
level to its normalised float32 value. Both are exact: the server sees HF's numbers bit for bit
(the table lookup is the very operation the service's own patchify performs). A page is ~1.7 MB
as VLP1 instead of ~18.5 MB of JSON. Rows come back as a binary ``VLR1`` body: one 4-byte read
per row instead of parsing JSON floats.
"""

from __future__ import annotations

import base64
import json
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from vlembed.constants import HALF_PATCH_DIM, PATCH_DIM, PATCH_SIZE, TEMPORAL_PATCH_SIZE
from vlembed.geometry import Grid

MAGIC = b"VLR1"
PATCHES_MAGIC = b"VLP1"
_PATCHES_HEADER = struct.Struct("<4sI")
_CHANNELS = 3
_LEVELS = 256
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


@dataclass(frozen=True)
class PatchLevels:
    """One still image as what determines its patch rows, ~1/10 of their bytes.

    ``levels`` is ``[t*h*w, 588]`` uint8: each row is one temporal half of a patch row,
    ``[C=3, 14, 14]`` pixel levels, rows in merge-block order. ``table`` is ``[3, 256]`` float32:
    the normalised value of every level per channel. Row ``n`` of the f32 patch rows is
    ``table[c][levels[n, c]]`` written into both temporal halves (``rows()``).
    """

    levels: np.ndarray
    grid: Grid
    table: np.ndarray

    def __post_init__(self) -> None:
        t, h, w = self.grid
        if self.levels.dtype != np.uint8 or self.levels.shape != (t * h * w, HALF_PATCH_DIM):
            raise ValueError(
                f"levels must be uint8 [{t * h * w}, {HALF_PATCH_DIM}] for grid {self.grid}, "
                f"got {self.levels.dtype} {self.levels.shape}"
            )
        if self.table.dtype != np.float32 or self.table.shape != (_CHANNELS, _LEVELS):
            raise ValueError(
                f"table must be float32 [{_CHANNELS}, {_LEVELS}], got "
                f"{self.table.dtype} {self.table.shape}"
            )

    def rows(self) -> np.ndarray:
        """The f32 patch rows ``[t*h*w, 1176]`` these levels stand for (the server's expansion)."""
        n_rows = self.levels.shape[0]
        area = PATCH_SIZE * PATCH_SIZE
        by_channel = self.levels.reshape(n_rows, _CHANNELS, area)
        rows = np.empty((n_rows, _CHANNELS, TEMPORAL_PATCH_SIZE, area), dtype=np.float32)
        for channel in range(_CHANNELS):
            rows[:, channel, 0, :] = self.table[channel][by_channel[:, channel, :]]
        for frame in range(1, TEMPORAL_PATCH_SIZE):
            rows[:, :, frame, :] = rows[:, :, 0, :]
        return rows.reshape(n_rows, PATCH_DIM)


def encode_patches(patches: np.ndarray, grid: tuple[int, int, int]) -> dict[str, object]:
    """One ``multimodal_patches`` entry: HF pixel_values rows [t*h*w, 1176] and the grid."""
    if patches.ndim != 2 or patches.shape[1] != PATCH_DIM:
        raise ValueError(f"patches must be [N, {PATCH_DIM}], got {patches.shape}")
    data = np.ascontiguousarray(patches, dtype="<f4").tobytes()
    return {"grid_thw": list(grid), "data": base64.b64encode(data).decode("ascii")}


def encode_patches_body(request: dict[str, object], images: Sequence[PatchLevels]) -> bytes:
    """A ``VLP1`` request body: ``request`` (whose ``content`` gets the ``multimodal_patches``
    entries) as JSON, then each image's table and levels, in marker order."""
    content = dict(request["content"])  # type: ignore[call-overload]
    content["multimodal_patches"] = [{"grid_thw": list(image.grid)} for image in images]
    head = json.dumps({**request, "content": content}, separators=(",", ":")).encode()
    parts = [_PATCHES_HEADER.pack(PATCHES_MAGIC, len(head)), head]
    for image in images:
        parts.append(np.ascontiguousarray(image.table, dtype="<f4").tobytes())
        parts.append(np.ascontiguousarray(image.levels).tobytes())
    return b"".join(parts)


def decode_patches_body(body: bytes) -> tuple[dict[str, object], list[PatchLevels]]:
    """The inverse of ``encode_patches_body`` (tests and fakes use it to read the protocol)."""
    if len(body) < _PATCHES_HEADER.size:
        raise WireFormatError(f"VLP1 body too short: {len(body)} bytes")
    magic, json_len = _PATCHES_HEADER.unpack_from(body, 0)
    if magic != PATCHES_MAGIC:
        raise WireFormatError(f"bad magic {magic!r}, expected {PATCHES_MAGIC!r}")
    offset = _PATCHES_HEADER.size + json_len
    if offset > len(body):
        raise WireFormatError(f"VLP1 header announces {json_len} JSON bytes, body is {len(body)}")
    request = json.loads(body[_PATCHES_HEADER.size : offset])
    images = []
    for entry in request["content"]["multimodal_patches"]:
        grid = tuple(int(v) for v in entry["grid_thw"])
        n_table, n_levels = _CHANNELS * _LEVELS * 4, grid[0] * grid[1] * grid[2] * HALF_PATCH_DIM
        if offset + n_table + n_levels > len(body):
            raise WireFormatError(f"VLP1 body ends inside the entry of grid {grid}")
        table = np.frombuffer(body, "<f4", _CHANNELS * _LEVELS, offset)
        levels = np.frombuffer(body, np.uint8, n_levels, offset + n_table)
        images.append(
            PatchLevels(
                levels.reshape(-1, HALF_PATCH_DIM),
                grid,  # type: ignore[arg-type]
                table.reshape(_CHANNELS, _LEVELS).astype(np.float32),
            )
        )
        offset += n_table + n_levels
    if offset != len(body):
        raise WireFormatError(f"{len(body) - offset} bytes after the last VLP1 entry")
    return request, images


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
