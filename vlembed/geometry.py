"""Image geometry every stage agrees on: the size an image is resized to, and its patch grid.

Hugging Face's ``smart_resize`` decides how many tokens an image costs. The service resizes with
it, validation counts an image's tokens from its header with it, and the document index renders
PDF pages and lays match maps over the patch grid with it: one copy, here.
"""

from __future__ import annotations

import math
import operator

from vlembed.constants import (
    MAX_ASPECT_RATIO,
    MAX_PIXELS,
    MIN_PIXELS,
    PATCH_SIZE,
    RESIZE_FACTOR,
)
from vlembed.errors import ImageError

__all__ = ["Grid", "image_grid", "smart_resize"]

Grid = tuple[int, int, int]
"""``(t, h, w)`` in patches, HF's ``image_grid_thw`` row; ``t`` is 1 for a still image."""


def smart_resize(
    height: int,
    width: int,
    factor: int = RESIZE_FACTOR,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> tuple[int, int]:
    """Target ``(height, width)`` of the resize, identical to HF's ``smart_resize``.

    Both sides become multiples of ``factor``; the area is brought inside
    ``[min_pixels, max_pixels]`` while keeping the aspect ratio as far as rounding allows. The
    float arithmetic is HF's, operation for operation (Python's round-half-to-even, then
    floor/ceil of ``side / beta / factor`` and ``side * beta / factor``), because a different
    but "equivalent" order flips sides by ``factor`` near the rounding boundaries. As in HF,
    the result may exceed ``max_pixels`` for extreme aspect ratios since no side goes below
    ``factor``.

    Args:
        height: Source height in pixels.
        width: Source width in pixels.
        factor: Both output sides are multiples of it (patch 14 x merge 2 = 28).
        min_pixels: Smallest output area (jina-v4: 3136, 4 merged tokens).
        max_pixels: Largest output area (jina-v4: 602112, 768 merged tokens).

    Returns:
        ``(resized_height, resized_width)``.

    Raises:
        ImageError: A side is zero or negative, or the aspect ratio exceeds
            ``MAX_ASPECT_RATIO`` (200, HF's limit; exactly 200 is accepted like in HF).
        ValueError: ``factor``/``min_pixels``/``max_pixels`` are not a valid configuration.
    """
    height = operator.index(height)
    width = operator.index(width)
    if factor <= 0 or min_pixels <= 0 or max_pixels < min_pixels:
        raise ValueError(
            "need factor > 0 and 0 < min_pixels <= max_pixels, got "
            f"factor={factor}, min_pixels={min_pixels}, max_pixels={max_pixels}"
        )
    if height <= 0 or width <= 0:
        raise ImageError(f"image has no pixels: height={height}, width={width}")
    aspect_ratio = max(height, width) / min(height, width)
    if aspect_ratio > MAX_ASPECT_RATIO:
        raise ImageError(
            f"image aspect ratio must be at most {MAX_ASPECT_RATIO}, got {aspect_ratio:.1f} "
            f"(height={height}, width={width})"
        )

    resized_height = round(height / factor) * factor
    resized_width = round(width / factor) * factor
    if resized_height * resized_width > max_pixels:
        shrink = math.sqrt((height * width) / max_pixels)
        resized_height = max(factor, math.floor(height / shrink / factor) * factor)
        resized_width = max(factor, math.floor(width / shrink / factor) * factor)
    elif resized_height * resized_width < min_pixels:
        grow = math.sqrt(min_pixels / (height * width))
        resized_height = math.ceil(height * grow / factor) * factor
        resized_width = math.ceil(width * grow / factor) * factor
    return resized_height, resized_width


def image_grid(
    width: int, height: int, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> Grid:
    """The patch grid an image of this size gets, from its header alone (no pixels needed).

    Its merged-token count is ``h * w // MERGE_SIZE**2``: what the image costs in a prompt.
    """
    resized_height, resized_width = smart_resize(
        height, width, factor=RESIZE_FACTOR, min_pixels=min_pixels, max_pixels=max_pixels
    )
    return (1, resized_height // PATCH_SIZE, resized_width // PATCH_SIZE)
