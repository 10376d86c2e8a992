"""Image geometry the index needs client-side: the service's resize and the page render scale.

The index cannot import the service (``vlembed`` is the bottom layer), yet it must know the
merged-token grid of every page it stores (to draw match maps) and the scale at which a PDF page
is worth rendering. Both follow from Hugging Face's ``smart_resize`` (``vlembed.geometry``, the
service's own copy); the grid is also checked against the number of image rows the service
returns, so a drift between the two fails loudly instead of mislabelling heatmaps.
"""

from __future__ import annotations

import math

from vlembed.constants import MAX_PIXELS, MERGE_SIZE, MIN_PIXELS, RESIZE_FACTOR
from vlembed.geometry import smart_resize

__all__ = ["merged_grid", "render_scale", "rendered_size", "smart_resize"]


def merged_grid(
    height: int, width: int, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> tuple[int, int]:
    """``(rows, cols)`` of merged image tokens (one multi-vector row each) of an image."""
    h, w = smart_resize(height, width, RESIZE_FACTOR, min_pixels, max_pixels)
    patch = RESIZE_FACTOR // MERGE_SIZE
    return h // patch // MERGE_SIZE, w // patch // MERGE_SIZE


def rendered_size(width_pt: float, height_pt: float, scale: float) -> tuple[int, int]:
    """``(width, height)`` in pixels of a page rendered at ``scale`` (pdfium rounds up)."""
    return math.ceil(width_pt * scale), math.ceil(height_pt * scale)


def render_scale(
    width_pt: float,
    height_pt: float,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> float:
    """Smallest render scale whose image keeps every merged token the service can use.

    Any rendering of ``max_pixels`` or more resizes to the same grid (``smart_resize`` shrinks
    by the area alone), so rendering larger only costs time and bytes, and rendering smaller
    loses tokens. Start at the scale that makes the area ``max_pixels`` and step up by 0.5 %
    until the grid reaches the large-render grid (rounding of the sides can leave it one row
    short); tiny pages are scaled up the same way towards the same target.
    """
    if width_pt <= 0 or height_pt <= 0:
        raise ValueError(f"page has no area: {width_pt} x {height_pt} pt")
    big = 64 * math.sqrt(max_pixels / (width_pt * height_pt))
    bw, bh = rendered_size(width_pt, height_pt, big)
    target = smart_resize(bh, bw, RESIZE_FACTOR, min_pixels, max_pixels)
    want = target[0] * target[1]
    scale = math.sqrt(max_pixels / (width_pt * height_pt))
    for _ in range(200):
        w, h = rendered_size(width_pt, height_pt, scale)
        got = smart_resize(h, w, RESIZE_FACTOR, min_pixels, max_pixels)
        if got[0] * got[1] >= want:
            return scale
        scale *= 1.005
    return big
