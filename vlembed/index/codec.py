"""How a page's multi-vector is stored: optional token pooling, optional sign bits.

A page is ~700 rows of 128 float32 (~360 KB); two published reductions trade a little ranking
quality for size, chosen once per index (:class:`StorageOptions`, kept in its metadata):

- **Token pooling** (ColPali paper; Answer.AI's note on ColBERT pooling): cluster a page's rows
  hierarchically into ``ceil(n / pool_factor)`` clusters and store each cluster's mean, L2
  re-normalised. Factor 2 is reported near lossless, 3 about 98 % of nDCG. The cluster of
  every original row is kept (2 bytes a row) so a match map can still be drawn per token.
- **Binary rows**: one sign bit per dimension, packed MSB-first (32x smaller than float32),
  scored against float queries (:mod:`vlembed.index.maxsim`).

Both together are allowed: rows are pooled first, then binarised.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Literal

import numpy as np

from vlembed.index.maxsim import sign_rows

__all__ = [
    "POOL_METHODS",
    "EncodedRows",
    "StorageOptions",
    "decode_rows",
    "encode_rows",
    "pool_rows",
    "stored_rows",
]

PoolMethod = Literal["ward", "average"]
POOL_METHODS: tuple[str, ...] = ("ward", "average")
MAX_POOL_FACTOR = 4


@dataclasses.dataclass(frozen=True)
class StorageOptions:
    """How multi-vectors are stored; fixed when an index is created.

    Attributes:
        pool_factor: 1 keeps every row; 2-4 keep about one row in ``pool_factor``.
        pool_method: ``ward`` (Euclidean on the unit rows) or ``average`` (cosine distance).
        binary: Store sign bits instead of float32.
    """

    pool_factor: int = 1
    pool_method: PoolMethod = "ward"
    binary: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.pool_factor <= MAX_POOL_FACTOR:
            raise ValueError(f"pool_factor must be 1..{MAX_POOL_FACTOR}, got {self.pool_factor}")
        if self.pool_method not in POOL_METHODS:
            raise ValueError(
                f"unknown pool_method {self.pool_method!r}; valid: {', '.join(POOL_METHODS)}"
            )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StorageOptions:
        return cls(
            pool_factor=int(data.get("pool_factor", 1)),
            pool_method=data.get("pool_method", "ward"),
            binary=bool(data.get("binary", False)),
        )

    @classmethod
    def parse(cls, spec: str) -> StorageOptions:
        """Options from a short spec: ``float32``, ``binary``, ``pool2``, ``pool3-average``,
        or parts joined by ``+`` (``pool2+binary``), as the command lines take them.

        Raises:
            ValueError: An unknown part, or a pool factor outside 1..4.
        """
        pool_factor, pool_method, binary = 1, "ward", False
        for part in (p.strip().lower() for p in spec.split("+")):
            if part == "float32":
                continue
            if part == "binary":
                binary = True
                continue
            head, _, method = part.partition("-")
            if head.startswith("pool") and head[4:].isdigit():
                pool_factor, pool_method = int(head[4:]), method or "ward"
                continue
            raise ValueError(
                f"unknown storage option {part!r} in {spec!r}; use float32, binary, poolN or "
                f"poolN-average (N 1..{MAX_POOL_FACTOR}), joined by '+'"
            )
        return cls(pool_factor, pool_method, binary)  # type: ignore[arg-type]

    @property
    def spec(self) -> str:
        """The short form :meth:`parse` reads back."""
        parts = []
        if self.pool_factor > 1:
            method = "" if self.pool_method == "ward" else f"-{self.pool_method}"
            parts.append(f"pool{self.pool_factor}{method}")
        if self.binary:
            parts.append("binary")
        return "+".join(parts) or "float32"

    def label(self) -> str:
        parts = ["float32" if not self.binary else "binary"]
        if self.pool_factor > 1:
            parts.append(f"pool x{self.pool_factor} ({self.pool_method})")
        return ", ".join(parts)


@dataclasses.dataclass(frozen=True)
class EncodedRows:
    """A page's multi-vector as stored.

    Attributes:
        data: float32 rows or packed sign bits, as bytes.
        n_rows: Stored rows (clusters when pooled).
        dim: Width of a row.
        labels: uint16 bytes, the stored row of every original row; empty when not pooled.
    """

    data: bytes
    n_rows: int
    dim: int
    labels: bytes


def pool_rows(
    rows: np.ndarray, factor: int, method: PoolMethod = "ward"
) -> tuple[np.ndarray, np.ndarray]:
    """Cluster ``rows`` into ``ceil(n / factor)`` groups; returns (unit means, label per row).

    Labels are 0-based and numbered by first appearance, so pooling is deterministic.
    """
    rows = np.asarray(rows, dtype=np.float32)
    n = rows.shape[0]
    k = math.ceil(n / factor)
    if factor <= 1 or n <= 1 or k >= n:
        return rows, np.arange(n, dtype=np.uint16)
    from scipy.cluster.hierarchy import fcluster, linkage

    if method == "ward":
        tree = linkage(rows.astype(np.float64), method="ward", metric="euclidean")
    else:
        tree = linkage(rows.astype(np.float64), method="average", metric="cosine")
    raw = fcluster(tree, t=k, criterion="maxclust")
    _, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    order = np.argsort(np.argsort(first))  # cluster index by first appearance
    labels = order[inverse].astype(np.uint16)
    means = np.zeros((labels.max() + 1, rows.shape[1]), dtype=np.float32)
    np.add.at(means, labels, rows)
    norms = np.linalg.norm(means, axis=1, keepdims=True)
    means /= np.maximum(norms, 1e-12)
    return means, labels


def encode_rows(rows: np.ndarray, options: StorageOptions) -> EncodedRows:
    """The stored form of one page's ``[n, dim]`` multi-vector."""
    rows = np.asarray(rows, dtype=np.float32)
    if rows.ndim != 2 or rows.shape[0] == 0:
        raise ValueError(f"a multi-vector is [n_rows, dim] with n_rows > 0; got {rows.shape}")
    if rows.shape[0] > np.iinfo(np.uint16).max:
        raise ValueError(f"a page has at most 65535 rows here; got {rows.shape[0]}")
    labels = b""
    if options.pool_factor > 1:
        rows, lab = pool_rows(rows, options.pool_factor, options.pool_method)
        labels = lab.astype("<u2").tobytes()
    dim = rows.shape[1]
    if options.binary:
        data = np.packbits(rows > 0, axis=1).tobytes()
    else:
        data = np.ascontiguousarray(rows, dtype="<f4").tobytes()
    return EncodedRows(data=data, n_rows=rows.shape[0], dim=dim, labels=labels)


def decode_rows(data: bytes, n_rows: int, dim: int, binary: bool) -> np.ndarray:
    """``[n_rows, dim]`` float32 for scoring: the stored rows, or +1/-1 for sign bits."""
    if binary:
        packed = np.frombuffer(data, dtype=np.uint8).reshape(n_rows, -1)
        return sign_rows(packed, dim)
    return np.frombuffer(data, dtype="<f4").reshape(n_rows, dim)


def stored_rows(rows: np.ndarray, options: StorageOptions) -> np.ndarray:
    """``rows`` as a search scores them once stored with ``options`` (pooled means, +1/-1)."""
    encoded = encode_rows(rows, options)
    return decode_rows(encoded.data, encoded.n_rows, encoded.dim, options.binary)


def decode_labels(labels: bytes, n_rows: int) -> np.ndarray:
    """Stored row of each original row (identity when the page was not pooled)."""
    if not labels:
        return np.arange(n_rows, dtype=np.int64)
    return np.frombuffer(labels, dtype="<u2").astype(np.int64)
