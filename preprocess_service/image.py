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
import math
import operator
import warnings

import numpy as np
from PIL import Image

from preprocess_service.constants import (
    HALF_PATCH_DIM,
    IMAGE_FORMATS,
    IMAGE_MEAN,
    IMAGE_STD,
    MAX_ASPECT_RATIO,
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
from preprocess_service.errors import ImageError

__all__ = [
    "Grid",
    "decode_image",
    "half_to_rows",
    "patchify",
    "patchify_half",
    "rows_to_half",
    "smart_resize",
    "to_rgb",
]

logger = logging.getLogger(__name__)

Grid = tuple[int, int, int]
"""``(t, h, w)`` in patches, HF's ``image_grid_thw`` row; ``t`` is 1 for a still image."""

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
    """Decode client bytes into the RGB image HF's processor would work on.

    The result equals ``to_rgb(PIL.Image.open(io.BytesIO(data)))``, i.e. what HF's
    ``convert_to_rgb`` makes of an image the user opened with Pillow. Deliberately **not**
    applied: EXIF orientation (HF does not apply it to PIL inputs; ``Image.open`` does not
    either), so a rotated-by-EXIF JPEG is embedded as stored, exactly like the reference. Only
    the first frame of animated or multi-page files is used, as with ``np.array(image)``.

    Safety, all before or during decoding:

    * only ``IMAGE_FORMATS`` are tried (EPS would run Ghostscript, other plugins are legacy
      attack surface);
    * the declared size is checked against ``max_pixels_decoded`` from the header, before any
      pixel is decoded. Pillow's own check (``Image.MAX_IMAGE_PIXELS``) stays in force as
      well, so the effective ceiling is ``min(max_pixels_decoded, 2 * MAX_IMAGE_PIXELS)``;
    * the whole image is loaded here, so corrupt or truncated data fails here and not later
      in the pipeline. Truncated files are refused unless someone set Pillow's process-wide
      ``ImageFile.LOAD_TRUNCATED_IMAGES``, which this module never does.

    Every exception Pillow raises on bad input (``OSError``, ``SyntaxError``, ``ValueError``,
    ``struct.error``, ``DecompressionBombError``, ...) becomes an ``ImageError`` chained to the
    original; ``MemoryError`` is re-raised as is because it is not the client's fault. Warnings
    Pillow emits while decoding (``DecompressionBombWarning``, corrupt EXIF, ...) are captured
    and logged at debug level instead of reaching the warnings machinery. ``catch_warnings`` is
    process-global before Python 3.14: a warning another thread emits in that window is logged
    here too, nothing worse.

    Args:
        data: The encoded file, as received.
        max_pixels_decoded: Largest ``width * height`` accepted, checked on the header.

    Returns:
        A fully loaded RGB ``PIL.Image.Image`` (the input object itself for a plain RGB file).

    Raises:
        ImageError: Empty, unrecognised, unsupported, corrupt, truncated or oversized data,
            or an image mode HF cannot convert to RGB.
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
        image = _load_rgb(image)
    for warning in caught:
        logger.debug("Pillow warning while decoding an image: %s", warning.message)
    return image


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


def _load_rgb(image: Image.Image) -> Image.Image:
    """Decode the pixels of an opened image and convert them to RGB like HF."""
    try:
        image.load()
        return to_rgb(image)
    except (ImageError, MemoryError):
        raise
    except Exception as exc:  # truncated/corrupt streams raise OSError, ValueError, zlib errors
        raise ImageError(f"corrupt or truncated {image.format} image: {exc}") from exc


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert any Pillow mode to RGB exactly as HF's ``convert_to_rgb`` does.

    HF's rule (transformers 5.x ``image_transforms.convert_to_rgb``), reproduced with the same
    Pillow calls so that the pixels are identical by construction:

    * alpha if ``"A"`` is one of ``image.getbands()`` or ``image.info["transparency"]`` is set
      (RGBA, LA, PA, P/L/RGB with a tRNS chunk or GIF transparency): convert to RGBA,
      ``alpha_composite`` onto opaque white, convert to RGB. Quirk kept on purpose: LAB's
      ``"A"`` band (the green-red axis) counts as alpha too, and Pillow's LAB -> RGBA carries
      LAB's hidden 4th byte as alpha. That byte is 255 in decoded files (no effect) but holds
      the old alpha of a LAB image converted from RGBA in memory, which then gets whitened.
    * otherwise ``image.convert("RGB")``: L, 1, P, CMYK, YCbCr, HSV, RGBX and premultiplied
      RGBa convert with Pillow's rules; I, I;16 and F are clipped to 0..255, not rescaled
      (a 16-bit grey PNG comes out mostly white -- as in HF).

    A plain RGB image without transparency is returned as is (HF copies it; same pixels).

    Raises:
        ImageError: Pillow cannot convert this mode (e.g. ``La``), which HF cannot either.
    """
    has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    try:
        if has_alpha:
            rgba = image.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, rgba).convert("RGB")
        if image.mode == "RGB":
            return image
        return image.convert("RGB")
    except ValueError as exc:  # "conversion from La to RGB not supported"
        raise ImageError(f"unsupported image mode {image.mode!r}: {exc}") from exc


# --- geometry -------------------------------------------------------------------------------


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


def _channel_major_half(
    image: Image.Image, min_pixels: int, max_pixels: int
) -> tuple[np.ndarray, Grid]:
    """Normalised patches as ``[C, N, 196]`` float32 (contiguous) plus the grid.

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

    half = np.empty((_CHANNELS, n_rows, _PATCH_AREA), dtype=np.float32)
    for channel in range(_CHANNELS):
        # mode="clip" skips the bounds check (uint8 indices cannot exceed 255).
        np.take(_NORMALISED[channel], levels[channel], out=half[channel], mode="clip")
    return half, (1, grid_h, grid_w)


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
        (``h`` and ``w`` even). Both temporal halves of every row are identical; see
        ``patchify_half`` for the 588-wide form.

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


def patchify_half(
    image: Image.Image, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> tuple[np.ndarray, Grid]:
    """The compact wire form: one temporal half of every row, ``[N, 588]`` float32.

    HF tiles a still image to T=2 frames, so every 1176-wide row is ``[C, T, 14, 14]`` with
    ``row[c, 0] == row[c, 1]`` bit for bit. Sending only ``[C, 14, 14]`` halves the payload and
    loses nothing: ``half_to_rows(patchify_half(img)[0])`` equals ``patchify(img)[0]``
    exactly. It is also cheaper to compute (half the float32 writes).

    Returns:
        ``(half, grid)``: C-contiguous float32 ``[t*h*w, 588]``, each row ``[C=3, 14, 14]``,
        rows in the same merge-block order as ``patchify``; the same grid.

    Raises:
        ImageError: As ``patchify``.
    """
    half, grid = _channel_major_half(image, min_pixels, max_pixels)
    n_rows = half.shape[1]
    return np.ascontiguousarray(half.transpose(1, 0, 2)).reshape(n_rows, HALF_PATCH_DIM), grid


def half_to_rows(half: np.ndarray) -> np.ndarray:
    """Expand ``[N, 588]`` halves to full ``[N, 1176]`` rows by tiling each channel to T=2.

    Raises:
        ValueError: ``half`` is not a 2-D float32 array with 588 columns.
    """
    if half.ndim != 2 or half.shape[1] != HALF_PATCH_DIM or half.dtype != np.float32:
        raise ValueError(
            f"expected float32 [N, {HALF_PATCH_DIM}] halves, got {half.dtype} {half.shape}"
        )
    n_rows = half.shape[0]
    rows = np.empty((n_rows, _CHANNELS, TEMPORAL_PATCH_SIZE, _PATCH_AREA), dtype=np.float32)
    by_channel = half.reshape(n_rows, _CHANNELS, _PATCH_AREA)
    for frame in range(TEMPORAL_PATCH_SIZE):
        rows[:, :, frame, :] = by_channel
    return rows.reshape(n_rows, PATCH_DIM)


def rows_to_half(rows: np.ndarray) -> np.ndarray:
    """Compact full ``[N, 1176]`` rows to ``[N, 588]``, checking that nothing is lost.

    The temporal halves are compared bit for bit (as uint32), so ``-0.0`` vs ``0.0`` or
    differing NaN payloads count as different: the compact form must round-trip exactly.

    Raises:
        ValueError: ``rows`` is not float32 ``[N, 1176]``, or some row's two temporal halves
            differ (the rows do not come from a still image tiled to T=2).
    """
    if rows.ndim != 2 or rows.shape[1] != PATCH_DIM or rows.dtype != np.float32:
        raise ValueError(f"expected float32 [N, {PATCH_DIM}] rows, got {rows.dtype} {rows.shape}")
    n_rows = rows.shape[0]
    by_frame = rows.reshape(n_rows, _CHANNELS, TEMPORAL_PATCH_SIZE, _PATCH_AREA)
    bits = by_frame.view(np.uint32)
    for frame in range(1, TEMPORAL_PATCH_SIZE):
        differs = np.any(bits[:, :, frame, :] != bits[:, :, 0, :], axis=(1, 2))
        if differs.any():
            first = int(np.flatnonzero(differs)[0])
            raise ValueError(
                f"temporal halves differ in {int(differs.sum())} of {n_rows} rows "
                f"(first: row {first}); these are not rows of a still image"
            )
    return np.ascontiguousarray(by_frame[:, :, 0, :]).reshape(n_rows, HALF_PATCH_DIM)
