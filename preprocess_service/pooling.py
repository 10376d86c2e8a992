"""From per-token rows to the vectors users get, as jina-embeddings-v4 pools them.

Means are accumulated in float64 and returned as float32 (llama.cpp's rows are float32).

Single vector: the mean over a span of rows (every row for text and interleaved content, the
vision span ``<|vision_start|>`` … ``<|vision_end|>`` for image-only inputs), optionally
truncated to a Matryoshka dimension, then L2-normalised. Multi-vector: the task's projector on
every row, each row L2-normalised. Pooling runs here, not in llama.cpp, because llama.cpp's MEAN
pooling averages per decode call (ubatch), and an image prompt takes several.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vlembed.wire import Rows


def _span_all(rows: Rows) -> tuple[int, int]:
    return 0, rows.rows.shape[0]


def _span_vision(rows: Rows) -> tuple[int, int]:
    """From the row before the first image chunk to the row after the last one, inclusive.

    Those two rows are the ``<|vision_start|>``/``<|vision_end|>`` tokens mtmd wraps every
    image in.
    """
    images = rows.image_chunks
    if not images:
        raise ValueError("vision pooling needs at least one image chunk")
    start = images[0].first_row - 1
    end = images[-1].first_row + images[-1].n_rows + 1
    if start < 0 or end > rows.rows.shape[0]:
        raise ValueError("image chunk is not wrapped in vision start/end tokens")
    return start, end


POOLING_SPANS: dict[str, Callable[[Rows], tuple[int, int]]] = {
    "all": _span_all,
    "vision": _span_vision,
}


def l2_normalize(x: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    return (x / np.maximum(norm, 1e-12)).astype(np.float32)


def single_vector(rows: Rows, pool: str, dim: int | None, normalize: bool = True) -> np.ndarray:
    """Mean over the pooling span (accumulated in float64), Matryoshka-truncated, normalised."""
    if pool not in POOLING_SPANS:
        raise ValueError(f"unknown pooling {pool!r}; valid: {sorted(POOLING_SPANS)}")
    start, end = POOLING_SPANS[pool](rows)
    vec = rows.rows[start:end].mean(axis=0, dtype=np.float64).astype(np.float32)
    if dim is not None:
        vec = vec[:dim]
    return l2_normalize(vec) if normalize else vec


@dataclass(frozen=True)
class Projector:
    """The multi-vector projector of one task (LoRA already merged by the converter)."""

    weight: np.ndarray  # [out, hidden]
    bias: np.ndarray  # [out]

    @classmethod
    def load(cls, path: Path) -> Projector:
        with np.load(path) as data:
            return cls(
                weight=np.ascontiguousarray(data["weight"], np.float32),
                bias=np.ascontiguousarray(data["bias"], np.float32),
            )

    def __call__(self, rows: np.ndarray, normalize: bool = True) -> np.ndarray:
        out = rows @ self.weight.T + self.bias
        return l2_normalize(out) if normalize else out.astype(np.float32)
