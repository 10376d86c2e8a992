"""Image stage: client bytes -> RGB image -> Qwen2-VL patch rows identical to HF's.

The reference is what a user of transformers 5.x gets from
``Qwen2VLImageProcessorPil()(images=PIL.Image.open(io.BytesIO(data)))``: its ``pixel_values``
and ``image_grid_thw``. This module reproduces them bit for bit with numpy and Pillow alone
(no torch, no transformers), and faster. HF's pipeline for one still image, as read in
transformers 5.24 (``image_processing_backends.PilBackend``,
``image_transforms.convert_to_rgb``, ``models/qwen2_vl/image_processing_pil_qwen2_vl.py``):

1. ``convert_to_rgb``: an image with an alpha band (``"A"`` among ``getbands()``) or a
   ``transparency`` entry in ``info`` is converted to RGBA and alpha-composited onto opaque
   white, then converted to RGB; any other image goes through ``Image.convert("RGB")``.
   No EXIF orientation is applied (only ``transformers.image_utils.load_image``, used when a
   path or URL string is passed, calls ``ImageOps.exif_transpose``).
2. ``smart_resize`` (factor 28) picks the target size; the uint8 RGB image is resized by Pillow
   with BICUBIC and no ``reducing_gap`` -- always on uint8, before any float conversion.
3. rescale: ``uint8 -> float64 * (1/255) -> float32``; normalise in float32:
   ``(x - mean) / std`` with float32 mean/std (OpenAI CLIP values).
4. patchify: rows in merge-block order (2x2 groups of 14x14 patches, groups in raster order),
   each row laid out ``[C=3, T=2, 14, 14]`` with the frame tiled to T=2.

``patch_levels`` stops before step 3's lookup: uint8 levels of one temporal half in patch
order plus the lookup table, which is what the service sends to a llama-server that reads
VLP1 bodies (``vlembed.wire.PatchLevels``); the server's lookup gives the same rows.

Why this is exact and fast: after step 2 every value is one of 256 uint8 levels per channel,
so step 3 is a per-channel lookup table computed once with HF's own float64/float32 sequence.
Step 4 is one uint8 gather into ``[C, N, 196]`` (a byte per value instead of four), one table
lookup per channel, and one copy per temporal half. The Pillow resize itself is kept, since
its fixed-point rounding defines the result; it dominates the cost of large inputs.
"""

from __future__ import annotations

import functools
import io
import logging
import warnings

import numpy as np
from PIL import Image

from vlembed.constants import (
    HALF_PATCH_DIM,
    IMAGE_FORMATS,
    IMAGE_MEAN,
    IMAGE_STD,
    MAX_DECODED_PIXELS,
    MAX_PIXELS,
    MERGE_SIZE,
    MIN_PIXELS,
    PATCH_DIM,
    PATCH_SIZE,
    RESCALE_FACTOR,
    RESIZE_FACTOR,
    TEMPORAL_PATCH_SIZE,
)
from vlembed.errors import ImageError
from vlembed.geometry import Grid, image_grid, smart_resize
from vlembed.pixels import to_rgb
from vlembed.wire import PatchLevels

__all__ = [
    "Grid",
    "decode_image",
    "image_grid",
    "load_rgb",
    "open_image",
    "patch_levels",
    "patchify",
    "smart_resize",
    "to_rgb",
]

logger = logging.getLogger(__name__)


_CHANNELS = 3
_PATCH_AREA = PATCH_SIZE * PATCH_SIZE  # 196 values per channel per temporal slice


# --- decoding -------------------------------------------------------------------------------


@functools.cache
def _decodable_formats() -> tuple[str, ...]:
    """The allowed formats this Pillow build can open.

    ``Image.open(formats=...)`` raises ``KeyError`` for a name without a registered plugin
    (e.g. AVIF on a Pillow built without libavif), so the allow-list is narrowed once here.
    """
    Image.init()
    return tuple(name for name in IMAGE_FORMATS if name in Image.OPEN)


def decode_image(
    data: bytes | bytearray | memoryview, *, max_pixels_decoded: int = MAX_DECODED_PIXELS
) -> Image.Image:
    """Decode client bytes into the RGB image jina-embeddings-v4 embeds for that file.

    ``load_rgb(open_image(data))``: the result equals
    ``PIL.Image.open(io.BytesIO(data)).convert("RGB")``, which is how the model's own loader
    (``encode_image`` with a path or URL) opens a file: transparency is dropped, not composited
    onto white, and no EXIF orientation is applied. Bytes that reach the service are the
    path/URL case. (A PIL object handed straight to the HF processor gets ``to_rgb`` instead,
    transparency onto white: ``vlembed.Client`` applies that before it sends a PIL image.)
    Only the first frame of animated or multi-page files is used.
    """
    return load_rgb(open_image(data, max_pixels_decoded=max_pixels_decoded))


def open_image(
    data: bytes | bytearray | memoryview, *, max_pixels_decoded: int = MAX_DECODED_PIXELS
) -> Image.Image:
    """Read the header only: format, size and the decoded-pixel limit, before any pixel.

    Safety, all before decoding:

    * only ``IMAGE_FORMATS`` are tried (EPS would run Ghostscript, other plugins are legacy
      attack surface);
    * the declared size is checked against ``max_pixels_decoded``. Pillow's own check
      (``Image.MAX_IMAGE_PIXELS``) stays in force as well, so the effective ceiling is
      ``min(max_pixels_decoded, 2 * MAX_IMAGE_PIXELS)``.

    The returned image is lazily opened: its ``size`` is known, its pixels are not decoded, so
    the caller can check its token budget first.

    Raises:
        ImageError: Empty, unrecognised, unsupported or oversized data.
        TypeError: ``data`` is not bytes-like.
        ValueError: ``max_pixels_decoded`` is not positive.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise TypeError(f"image data must be bytes-like, got {type(data).__name__}")
    if max_pixels_decoded <= 0:
        raise ValueError(f"max_pixels_decoded must be positive, got {max_pixels_decoded}")
    if len(data) == 0:
        raise ImageError("image data is empty")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        image = _open_checked(data, max_pixels_decoded)
    _log_warnings(caught)
    return image


def load_rgb(image: Image.Image) -> Image.Image:
    """Decode an opened image's pixels and convert them to RGB as the model's loader does.

    The whole image is loaded here, so corrupt or truncated data fails here and not later in
    the pipeline. Truncated files are refused unless someone set Pillow's process-wide
    ``ImageFile.LOAD_TRUNCATED_IMAGES``, which this module never does. Every exception Pillow
    raises on bad input becomes an ``ImageError`` chained to the original; ``MemoryError`` is
    re-raised as is because it is not the client's fault. Warnings Pillow emits while decoding
    are logged at debug level (``catch_warnings`` is process-global before Python 3.14: a
    warning another thread emits in that window is logged here too, nothing worse).

    Raises:
        ImageError: Corrupt or truncated data, or a mode Pillow cannot convert to RGB.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            image.load()
        except MemoryError:
            raise
        except Exception as exc:  # truncated/corrupt streams raise OSError, zlib errors, ...
            raise ImageError(f"corrupt or truncated {image.format} image: {exc}") from exc
    _log_warnings(caught)
    if image.mode == "RGB":
        return image
    try:
        return image.convert("RGB")
    except ValueError as exc:  # "conversion from La to RGB not supported"
        raise ImageError(f"unsupported image mode {image.mode!r}: {exc}") from exc


def _log_warnings(caught: list[warnings.WarningMessage]) -> None:
    for warning in caught:
        logger.debug("Pillow warning while decoding an image: %s", warning.message)


def _open_checked(data: bytes | bytearray | memoryview, max_pixels_decoded: int) -> Image.Image:
    """Read the header only and refuse unknown formats and oversized images."""
    formats = _decodable_formats()
    try:
        image = Image.open(io.BytesIO(data), formats=formats)
    except MemoryError:
        raise
    except Image.DecompressionBombError as exc:
        raise ImageError(f"image is too large to decode: {exc}") from exc
    except Image.UnidentifiedImageError as exc:
        raise ImageError(
            f"unrecognised or unsupported image format; accepted formats: {', '.join(formats)}"
        ) from exc
    except Exception as exc:  # Pillow signals bad headers with many exception types
        raise ImageError(f"cannot read the image header: {exc}") from exc

    width, height = image.size
    if width <= 0 or height <= 0:
        raise ImageError(f"image has no pixels: {width}x{height}")
    if width * height > max_pixels_decoded:
        raise ImageError(
            f"image is {width}x{height} = {width * height} pixels, more than the limit of "
            f"{max_pixels_decoded} decoded pixels"
        )
    return image


# --- patch rows -----------------------------------------------------------------------------


def _normalisation_table() -> np.ndarray:
    """``[3, 256]`` float32: HF's normalised value of every uint8 level, per channel.

    Built with HF's exact sequence -- ``float64 * (1/255)`` rounded to float32, then
    ``(x - mean) / std`` in float32 with float32 mean/std -- so looking a level up gives the
    very bits HF computes pixel by pixel. A fused ``u * a + b`` would be off by up to ~5e-7.
    """
    levels = (np.arange(256, dtype=np.float64) * RESCALE_FACTOR).astype(np.float32)
    mean = np.asarray(IMAGE_MEAN, dtype=np.float32)[:, None]
    std = np.asarray(IMAGE_STD, dtype=np.float32)[:, None]
    return (levels[None, :] - mean) / std


_NORMALISED = _normalisation_table()


def _resized_pixels(image: Image.Image, min_pixels: int, max_pixels: int) -> np.ndarray:
    """RGB-convert and BICUBIC-resize like HF; return ``[H, W, 3]`` uint8."""
    if not isinstance(image, Image.Image):
        raise TypeError(f"expected a PIL.Image.Image, got {type(image).__name__}")
    rgb = to_rgb(image)
    width, height = rgb.size
    resized_height, resized_width = smart_resize(
        height, width, factor=RESIZE_FACTOR, min_pixels=min_pixels, max_pixels=max_pixels
    )
    if (resized_width, resized_height) != rgb.size:
        # HF hands Pillow the uint8 image (channels-last, mode RGB) and the BICUBIC filter.
        rgb = rgb.resize((resized_width, resized_height), resample=Image.Resampling.BICUBIC)
    return np.asarray(rgb)


def _channel_major_levels(
    image: Image.Image, min_pixels: int, max_pixels: int
) -> tuple[np.ndarray, Grid]:
    """Resized pixel levels as ``[C, N, 196]`` uint8 (contiguous) plus the grid.

    Row ``n`` is merge-block ordered: with ``(bh, bw)`` the 2x2 block and ``(mh, mw)`` the
    patch inside it, ``n = ((bh * blocks_w + bw) * 2 + mh) * 2 + mw``; the 196 values are the
    patch's pixels in raster order. Channel-major keeps each lookup-table pass contiguous.
    """
    pixels = _resized_pixels(image, min_pixels, max_pixels)
    height, width, _ = pixels.shape
    grid_h = height // PATCH_SIZE
    grid_w = width // PATCH_SIZE
    blocks_h = grid_h // MERGE_SIZE
    blocks_w = grid_w // MERGE_SIZE
    n_rows = grid_h * grid_w

    # [bh, mh, py, bw, mw, px, c] -> [c, bh, bw, mh, mw, py, px]: the one uint8 copy.
    by_patch = pixels.reshape(
        blocks_h, MERGE_SIZE, PATCH_SIZE, blocks_w, MERGE_SIZE, PATCH_SIZE, _CHANNELS
    ).transpose(6, 0, 3, 1, 4, 2, 5)
    levels = np.ascontiguousarray(by_patch).reshape(_CHANNELS, n_rows, _PATCH_AREA)
    return levels, (1, grid_h, grid_w)


def _channel_major_half(
    image: Image.Image, min_pixels: int, max_pixels: int
) -> tuple[np.ndarray, Grid]:
    """Normalised patches as ``[C, N, 196]`` float32 (contiguous) plus the grid."""
    levels, grid = _channel_major_levels(image, min_pixels, max_pixels)
    half = np.empty(levels.shape, dtype=np.float32)
    for channel in range(_CHANNELS):
        # mode="clip" skips the bounds check (uint8 indices cannot exceed 255).
        np.take(_NORMALISED[channel], levels[channel], out=half[channel], mode="clip")
    return half, grid


def patch_levels(
    image: Image.Image, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> PatchLevels:
    """What determines ``patchify``'s rows, in ~1/10 of their bytes.

    ``patch_levels(image).rows()`` equals ``patchify(image)[0]`` bit for bit: both look the
    same uint8 levels up in the same table. Arguments and errors are ``patchify``'s.
    """
    levels, grid = _channel_major_levels(image, min_pixels, max_pixels)
    by_row = np.ascontiguousarray(levels.transpose(1, 0, 2)).reshape(-1, HALF_PATCH_DIM)
    return PatchLevels(levels=by_row, grid=grid, table=_NORMALISED)


def patchify(
    image: Image.Image, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> tuple[np.ndarray, Grid]:
    """Patch rows of one still image, equal to HF's ``pixel_values`` and ``image_grid_thw``.

    Equal (bit for bit in our tests, contractually within 1e-6) to
    ``Qwen2VLImageProcessorPil(size={"shortest_edge": min_pixels,
    "longest_edge": max_pixels})(images=image)`` for any Pillow mode HF accepts. Pass a loaded
    image (``decode_image`` output); a lazily opened file that turns out corrupt raises
    Pillow's error here.

    Args:
        image: Any-mode Pillow image; converted with ``to_rgb`` first.
        min_pixels: Smallest resized area, see ``smart_resize``.
        max_pixels: Largest resized area, see ``smart_resize``.

    Returns:
        ``(rows, grid)``: C-contiguous float32 ``[t*h*w, 1176]`` with each row laid out
        ``[C=3, T=2, 14, 14]`` in merge-block order, and ``grid = (1, h, w)`` in patches
        (``h`` and ``w`` even). Both temporal halves of every row are identical.

    Raises:
        ImageError: Zero size, aspect ratio over 200, or a mode HF cannot convert.
    """
    half, grid = _channel_major_half(image, min_pixels, max_pixels)
    n_rows = half.shape[1]
    rows = np.empty((n_rows, _CHANNELS, TEMPORAL_PATCH_SIZE, _PATCH_AREA), dtype=np.float32)
    by_row = half.transpose(1, 0, 2)
    for frame in range(TEMPORAL_PATCH_SIZE):
        rows[:, :, frame, :] = by_row
    return rows.reshape(n_rows, PATCH_DIM), grid
