"""A fake service client for the index's unit tests: deterministic vectors, counted calls.

Vectors depend only on the pixels sent (so an unchanged page gets the same vectors) and the
multi-vector has the service's row layout (4 prompt rows, the image grid, 7 prompt rows), so
the indexer's checks run as against the real service. The tiny ``max_pixels`` keeps grids small.
"""

from __future__ import annotations

import hashlib
import io

import numpy as np
import pytest
from PIL import Image

from vlembed.index.geometry import merged_grid
from vlembed.index.layout import IMAGE_PREFIX_ROWS, IMAGE_SUFFIX_ROWS


def _unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


class FakeClient:
    name = "fake-model"
    revision = "rev1"
    dim = 16
    multi_dim = 8
    min_pixels = 3136
    max_pixels = 28 * 28 * 16  # 16 merged tokens at most
    base_url = "fake://"

    def __init__(self) -> None:
        self.calls: list[tuple[str, bool, int]] = []

    def _image(self, item) -> tuple[Image.Image, bytes]:
        if isinstance(item, Image.Image):
            buf = io.BytesIO()
            item.save(buf, "PNG")
            return item, buf.getvalue()
        return Image.open(io.BytesIO(item)), bytes(item)

    def embed(self, items, *, task="retrieval.query", multivector=False, dimensions=None):
        self.calls.append((task, multivector, len(items)))
        out = []
        for item in items:
            if isinstance(item, str):
                seed = int(hashlib.sha256(item.encode()).hexdigest()[:8], 16)
                rng = np.random.default_rng(seed)
                n = 3 + len(item.split())
            else:
                image, data = self._image(item)
                seed = int(hashlib.sha256(image.convert("RGB").tobytes()).hexdigest()[:8], 16)
                rng = np.random.default_rng(seed)
                gh, gw = merged_grid(image.height, image.width, self.min_pixels, self.max_pixels)
                n = IMAGE_PREFIX_ROWS + gh * gw + IMAGE_SUFFIX_ROWS
            if multivector:
                out.append(_unit(rng.standard_normal((n, self.multi_dim))))
            else:
                out.append(_unit(rng.standard_normal(self.dim)))
        return out

    def embed_both(self, items, *, task="retrieval.passage"):
        multis = self.embed(items, task=task, multivector=True)
        return list(zip(self.embed(items, task=task), multis, strict=True))

    @property
    def pages_embedded(self) -> int:
        return sum(n for task, multi, n in self.calls if task == "retrieval.passage" and multi)


@pytest.fixture
def fake_client() -> FakeClient:
    return FakeClient()


def noise_image(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (max(h // 8, 1), max(w // 8, 1), 3), dtype=np.uint8)
    return Image.fromarray(small).resize((w, h), Image.Resampling.NEAREST)


def write_pdf(path, n_pages: int, seed: int = 0, size=(200, 280)) -> None:
    """A multi-page PDF written by Pillow (one image per page)."""
    pages = [noise_image(*size, seed * 100 + i) for i in range(n_pages)]
    pages[0].save(path, "PDF", save_all=True, append_images=pages[1:])


def write_encrypted_pdf(path) -> None:
    """A PDF whose standard security handler does not open with the empty password."""
    buf = io.BytesIO()
    noise_image(100, 100, 7).save(buf, "PDF")
    data = buf.getvalue()
    encrypt = (
        b"trailer\n<<\n/Encrypt << /Filter /Standard /V 1 /R 2 /Length 40 /O <"
        + b"11" * 32
        + b"> /U <"
        + b"22" * 32
        + b"> /P -4 >>\n/ID [<"
        + b"33" * 16
        + b"> <"
        + b"33" * 16
        + b">]\n"
    )
    assert b"trailer\n<<" in data
    path.write_bytes(data.replace(b"trailer\n<<", encrypt, 1))
