"""From a file to page images: PDFs rendered with pdfium, images passed through as their bytes.

- **PDF pages** are rendered at :func:`vlembed.index.geometry.render_scale`: the smallest scale
  that keeps every merged token the served model's ``max_pixels`` allows (rendering larger is
  resized away by the service, at a cost on both sides). pdfium (pypdfium2) needs no poppler and
  is permissively licensed. It is not thread-safe, so documents are only touched by the thread
  that opened them.
- **Images** are sent as the file's own bytes: the service then opens them as the model's own
  loader opens a file. The grid is computed from the stored pixel size (no EXIF rotation, as in
  the service).
- Unreadable, corrupt or password-protected files raise :class:`UnreadableFileError` with a
  message fit for the summary; the caller skips the file and goes on.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Iterator
from pathlib import Path

from PIL import Image

from vlembed.constants import MAX_PIXELS, MIN_PIXELS
from vlembed.index.geometry import merged_grid, render_scale
from vlembed.index.sources import PDF_SUFFIXES

__all__ = ["Page", "UnreadableFileError", "count_pages", "iter_pages", "thumbnail_png"]

THUMBNAIL_SIDE = 256


class UnreadableFileError(Exception):
    """A file that cannot be turned into pages (corrupt, encrypted, not an image)."""


@dataclasses.dataclass
class Page:
    """One page ready to embed.

    Attributes:
        number: 1-based page number (1 for an image).
        item: What the client sends: a PIL image (PDF page) or the file's bytes (image).
        width: Pixel width the service receives.
        height: Pixel height the service receives.
        grid: ``(rows, cols)`` of merged image tokens after the service's resize.
        thumbnail: PNG bytes, at most ``THUMBNAIL_SIDE`` px on the long side.
    """

    number: int
    item: Image.Image | bytes
    width: int
    height: int
    grid: tuple[int, int]
    thumbnail: bytes


def _is_pdf(path: Path) -> bool:
    return path.suffix.lower() in PDF_SUFFIXES


def _open_pdf(path: Path):
    import pypdfium2 as pdfium

    try:
        return pdfium.PdfDocument(path)
    except pdfium.PdfiumError as exc:
        reason = str(exc)
        if "password" in reason.lower():
            raise UnreadableFileError(f"password-protected PDF ({reason})") from exc
        raise UnreadableFileError(f"cannot open PDF ({reason})") from exc


def _open_image(path: Path) -> Image.Image:
    try:
        image = Image.open(path)
        image.load()
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as exc:
        raise UnreadableFileError(f"cannot open image ({exc})") from exc
    return image


def count_pages(path: Path) -> int:
    """Pages the file will yield; raises :class:`UnreadableFileError` if it cannot be opened."""
    if _is_pdf(path):
        pdf = _open_pdf(path)
        try:
            n = len(pdf)
        finally:
            pdf.close()
        if n == 0:
            raise UnreadableFileError("PDF has no pages")
        return n
    _open_image(path).close()
    return 1


def thumbnail_png(image: Image.Image, side: int = THUMBNAIL_SIDE) -> bytes:
    """A small PNG for result lists (RGB, long side ``side`` px)."""
    thumb = image.convert("RGB")
    thumb.thumbnail((side, side), Image.Resampling.BILINEAR)
    buf = io.BytesIO()
    thumb.save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def iter_pages(
    path: Path, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> Iterator[Page]:
    """The pages of ``path`` in order, rendered lazily (one page in memory at a time)."""
    if not _is_pdf(path):
        data = path.read_bytes()
        image = _open_image(path)
        w, h = image.size
        yield Page(1, data, w, h, merged_grid(h, w, min_pixels, max_pixels), thumbnail_png(image))
        return
    import pypdfium2 as pdfium

    pdf = _open_pdf(path)
    try:
        for i in range(len(pdf)):
            page = pdf[i]
            try:
                w_pt, h_pt = page.get_size()
                scale = render_scale(w_pt, h_pt, min_pixels, max_pixels)
                image = page.render(scale=scale).to_pil().convert("RGB")
            except (pdfium.PdfiumError, ValueError) as exc:
                raise UnreadableFileError(f"cannot render page {i + 1} ({exc})") from exc
            finally:
                page.close()
            w, h = image.size
            grid = merged_grid(h, w, min_pixels, max_pixels)
            yield Page(i + 1, image, w, h, grid, thumbnail_png(image))
    finally:
        pdf.close()
