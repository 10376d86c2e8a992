from __future__ import annotations

import pytest

from vlembed.constants import MAX_PIXELS, MIN_PIXELS
from vlembed.index.geometry import merged_grid, render_scale, rendered_size, smart_resize


@pytest.mark.parametrize(
    ("hw", "want"),
    [
        ((28, 28), (56, 56)),  # grown to min_pixels
        ((84, 112), (84, 112)),  # already multiples of 28
        ((1650, 1275), (868, 672)),  # a letter page at 150 dpi, shrunk to max_pixels
        ((100, 150), (112, 140)),
    ],
)
def test_smart_resize_known_values(hw, want) -> None:
    assert smart_resize(*hw) == want


@pytest.mark.parametrize("size_pt", [(612, 792), (595, 842), (200, 280), (842, 595), (50, 900)])
def test_render_scale_fills_max_pixels_and_no_more(size_pt) -> None:
    w_pt, h_pt = size_pt
    scale = render_scale(w_pt, h_pt, MIN_PIXELS, MAX_PIXELS)
    w, h = rendered_size(w_pt, h_pt, scale)
    big_w, big_h = rendered_size(w_pt, h_pt, 4 * scale)
    # at least the tokens a large render would give (rounding just under max_pixels can keep
    # a row or column more than the shrink of a large render) ...
    tokens = merged_grid(h, w)[0] * merged_grid(h, w)[1]
    assert tokens >= merged_grid(big_h, big_w)[0] * merged_grid(big_h, big_w)[1]
    assert tokens * 28 * 28 <= MAX_PIXELS
    # ... at about max_pixels, not more
    assert w * h <= 1.05 * MAX_PIXELS
    smaller_w, smaller_h = rendered_size(w_pt, h_pt, scale * 0.97)
    grid = merged_grid(smaller_h, smaller_w)
    assert grid[0] * grid[1] < tokens


def test_rendered_size_matches_pdfium(tmp_path) -> None:
    pdfium = pytest.importorskip("pypdfium2")
    from tests.vlembed.index.conftest import write_pdf

    write_pdf(tmp_path / "a.pdf", 1, size=(200, 300))
    page = pdfium.PdfDocument(tmp_path / "a.pdf")[0]
    w_pt, h_pt = page.get_size()
    scale = render_scale(w_pt, h_pt)
    assert page.render(scale=scale).to_pil().size == rendered_size(w_pt, h_pt, scale)


def test_merged_grid_is_half_the_patch_grid() -> None:
    assert merged_grid(84, 112) == (3, 4)
