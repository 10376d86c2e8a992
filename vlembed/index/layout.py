"""Where a page's image rows sit inside its multi-vector.

The service returns one row per token of the image prompt ``<|im_start|>user\\n<|vision_start|>``
+ image tokens + ``<|vision_end|>Describe the image.<|im_end|>\\n``.
The client cannot tokenise, so the layout is derived: the prompt's text costs a fixed number of
rows (4 before the image for Qwen2's tokenizer: ``<|im_start|>``, ``user``, ``\\n``,
``<|vision_start|>``; 7 after it), the image costs ``rows x cols`` merged tokens of its grid.
The integration tests check these counts against the real service.
"""

from __future__ import annotations

__all__ = ["IMAGE_PREFIX_ROWS", "IMAGE_SUFFIX_ROWS", "image_row_span"]

IMAGE_PREFIX_ROWS = 4
IMAGE_SUFFIX_ROWS = 7


def image_row_span(n_rows: int, grid: tuple[int, int]) -> tuple[int, int]:
    """``(start, count)`` of the image rows in a page multi-vector of ``n_rows`` rows.

    Raises:
        ValueError: The row count does not fit the prompt layout (a different template or a
            grid computed differently from the service's): a match map would be misplaced.
    """
    n_image = grid[0] * grid[1]
    text_rows = n_rows - n_image
    if text_rows != IMAGE_PREFIX_ROWS + IMAGE_SUFFIX_ROWS:
        raise ValueError(
            f"a page of grid {grid[0]}x{grid[1]} ({n_image} image tokens) should come back as "
            f"{n_image + IMAGE_PREFIX_ROWS + IMAGE_SUFFIX_ROWS} rows; the service returned "
            f"{n_rows}"
        )
    return IMAGE_PREFIX_ROWS, n_image
