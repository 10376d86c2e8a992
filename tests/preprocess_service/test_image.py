"""Tests for preprocess_service.image: HF parity, geometry, row layout, decoding safety, modes.

The parity tests run transformers' ``Qwen2VLImageProcessorPil`` (the reference) on 200+
deterministic generated images and are skipped only when transformers is not installed; the
other tests check the same properties from first principles and need only numpy and Pillow.
"""

from __future__ import annotations

import io
import math
import struct
import subprocess
import sys
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from preprocess_service.image import (
    decode_image,
    patch_levels,
    patchify,
    smart_resize,
)
from vlembed.constants import (
    IMAGE_MEAN,
    IMAGE_STD,
    MAX_PIXELS,
    MIN_PIXELS,
    PATCH_DIM,
)
from vlembed.errors import ImageError, InvalidInputError, VlembedError
from vlembed.pixels import to_rgb

REPO_ROOT = Path(__file__).resolve().parents[2]
EXIF_ORIENTATION = 0x0112
# The contract: parity within 1e-6 (in practice the rows are bit-identical).
PARITY_ATOL = 1e-6


# --- generated images ------------------------------------------------------------------------


def _content(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """RGBA uint8 test picture: gradients, noise, hard edges, and every kind of alpha."""
    y = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    x = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]
    phase = rng.uniform(0, 6.28, size=4).astype(np.float32)
    planes = [
        255 * x + 0 * y,
        255 * y + 0 * x,
        127.5 + 127.5 * np.sin(9 * x + 7 * y + phase[0]),
        255 * (x > 0.5) * (y < 0.6) + 40 * (x < 0.2),  # alpha: 0, 255 and partial values
    ]
    noise = rng.integers(-40, 41, size=(height, width, 4), dtype=np.int16)
    picture = np.stack(planes, axis=-1).astype(np.int16) + noise
    return np.clip(picture, 0, 255).astype(np.uint8)


def _in_mode(rgba: np.ndarray, mode: str) -> Image.Image:
    """Build a Pillow image of ``mode`` from the RGBA test picture."""
    if mode == "RGBA":
        return Image.fromarray(rgba, "RGBA")
    if mode in ("LA", "RGBa"):
        return Image.fromarray(rgba, "RGBA").convert(mode)
    if mode in ("P", "PA"):  # fast octree: median cut takes seconds on the larger images
        rgb = Image.fromarray(rgba[..., :3], "RGB")
        palette = rgb.quantize(colors=48, method=Image.Quantize.FASTOCTREE)
        if mode == "P":
            return palette
        with_alpha = palette.convert("PA")
        with_alpha.putalpha(Image.fromarray(rgba[..., 3], "L"))
        return with_alpha
    if mode in ("I;16", "I;16B"):
        wide = rgba[..., 0].astype(np.uint16) * rgba[..., 1].astype(np.uint16) // 64  # 0..1016
        return Image.fromarray(wide).convert(mode) if mode != "I;16" else Image.fromarray(wide)
    if mode == "I":
        return Image.fromarray(rgba[..., 0].astype(np.int32) * 3 - 100)  # -100..665
    if mode == "F":
        return Image.fromarray(rgba[..., 0].astype(np.float32) * 1.3 - 20.5 + rgba[..., 1] / 97)
    if mode == "1":
        return Image.fromarray(rgba[..., 0] > 127)
    if mode == "LAB":  # from RGBA: Pillow keeps the alpha in LAB's hidden 4th byte
        return Image.fromarray(rgba, "RGBA").convert("LAB")
    return Image.fromarray(rgba[..., :3], "RGB").convert(mode)


@dataclass(frozen=True)
class Case:
    """One parity case: encoded bytes (``fmt`` set) or an in-memory image (``fmt`` None)."""

    name: str
    height: int
    width: int
    mode: str
    fmt: str | None
    save: dict[str, Any] = field(default_factory=dict)
    transparency: bool = False
    orientation: int | None = None


# (format, mode, transparency key?) -- files the service can receive.
_FILE_SPECS: list[tuple[str, str, bool]] = [
    ("PNG", "RGB", False),
    ("PNG", "RGBA", False),
    ("PNG", "LA", False),
    ("PNG", "L", False),
    ("PNG", "P", False),
    ("PNG", "P", True),
    ("PNG", "1", False),
    ("PNG", "I;16", False),
    ("PNG", "RGB", True),
    ("PNG", "L", True),
    ("JPEG", "RGB", False),
    ("JPEG", "L", False),
    ("JPEG", "CMYK", False),
    ("WEBP", "RGB", False),
    ("WEBP", "RGBA", False),
    ("GIF", "P", True),
    ("GIF", "L", False),
    ("TIFF", "I", False),
    ("TIFF", "F", False),
    ("TIFF", "I;16", False),
    ("TIFF", "CMYK", False),
    ("TIFF", "LAB", False),
    ("TIFF", "YCbCr", False),
    ("TIFF", "RGBA", False),
    ("TIFF", "1", False),
    ("BMP", "RGB", False),
    ("BMP", "1", False),
    ("BMP", "P", False),
]
# Modes that do not come out of files but that HF accepts as PIL input.
_MEMORY_MODES = ["PA", "RGBa", "HSV", "RGBX", "LAB", "YCbCr", "I;16B", "CMYK", "RGB", "RGBA"]
_EXIF_FORMATS = ("JPEG", "PNG", "WEBP")
_SIZE_CLASSES = ("medium", "extreme", "tiny", "large", "multiple28", "medium", "extreme")

# Hand-picked geometry: aspect exactly 200 both ways, 1x1, HF's rounding boundaries, the page.
_FIXED_SIZES = [(1, 1), (1, 200), (200, 1), (3, 600), (600, 3), (28, 28), (56, 56), (70, 280)]
_FIXED_SIZES += [(776, 776), (1650, 1275), (2, 300), (4, 796), (1, 150), (150, 1)]


def _size(size_class: str, rng: np.random.Generator, index: int) -> tuple[int, int]:
    """(height, width) of one size class; orientation alternates with ``index``."""
    if size_class == "medium":
        return int(rng.integers(28, 700)), int(rng.integers(28, 700))
    if size_class == "tiny":  # below min_pixels
        return int(rng.integers(1, 56)), int(rng.integers(1, 56))
    if size_class == "multiple28":  # no resize at all
        return 28 * int(rng.integers(2, 28)), 28 * int(rng.integers(2, 28))
    if size_class == "large":  # above max_pixels
        area = rng.uniform(1.05, 2.6) * MAX_PIXELS
        aspect = math.exp(rng.uniform(math.log(0.25), math.log(4.0)))
        return int(math.sqrt(area * aspect)), int(math.sqrt(area / aspect))
    # extreme aspect ratio, up to 1:150, both orientations
    short = int(rng.integers(2, 41))
    long = min(6000, round(short * math.exp(rng.uniform(math.log(8), math.log(150)))))
    return (short, long) if index % 2 == 0 else (long, short)


def _cases() -> list[Case]:
    """The deterministic parity set: 224 file cases + 13 fixed sizes + 40 in-memory images."""
    cases: list[Case] = []
    exif_cases = 0
    for index in range(224):
        rng = np.random.default_rng(1000 + index)
        fmt, mode, transparency = _FILE_SPECS[index % len(_FILE_SPECS)]
        size_class = _SIZE_CLASSES[index % len(_SIZE_CLASSES)]
        height, width = _size(size_class, rng, index // len(_FILE_SPECS))
        orientation = None
        if fmt in _EXIF_FORMATS and mode in ("RGB", "RGBA") and index % 3 != 0:
            orientation = 1 + exif_cases % 8
            exif_cases += 1
        save: dict[str, Any] = {}
        if fmt == "WEBP":
            save = {"lossless": True, "method": 0} if index % 2 else {"quality": 85}
        if fmt == "JPEG":
            save = {"quality": 90}
        name = f"{index:03d}-{fmt}-{mode}{'-trns' if transparency else ''}-{size_class}"
        name += f"-{height}x{width}" + (f"-exif{orientation}" if orientation else "")
        cases.append(Case(name, height, width, mode, fmt, save, transparency, orientation))
    for index, (height, width) in enumerate(_FIXED_SIZES):
        fmt, mode, transparency = _FILE_SPECS[(3 * index) % len(_FILE_SPECS)]
        name = f"fixed-{fmt}-{mode}-{height}x{width}"
        cases.append(Case(name, height, width, mode, fmt, {}, transparency))
    for index in range(40):
        rng = np.random.default_rng(5000 + index)
        mode = _MEMORY_MODES[index % len(_MEMORY_MODES)]
        size_class = _SIZE_CLASSES[index % len(_SIZE_CLASSES)]
        height, width = _size(size_class, rng, index)
        cases.append(Case(f"mem-{index:02d}-{mode}-{height}x{width}", height, width, mode, None))
    return cases


CASES = _cases()


def _encode(case: Case) -> bytes:
    """Encode a file case to bytes, with its transparency key and EXIF orientation."""
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    image = _in_mode(_content(rng, case.height, case.width), case.mode)
    save = dict(case.save)
    if case.transparency:  # a colour/index that really occurs, so it matters
        first = image.getpixel((0, 0))
        save["transparency"] = first if isinstance(first, int) else tuple(first)
    if case.orientation is not None:
        exif = Image.Exif()
        exif[EXIF_ORIENTATION] = case.orientation
        save["exif"] = exif
    buffer = io.BytesIO()
    image.save(buffer, case.fmt, **save)
    return buffer.getvalue()


def _memory_image(case: Case) -> Image.Image:
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    return _in_mode(_content(rng, case.height, case.width), case.mode)


# --- HF parity -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_processor() -> Any:
    transformers = pytest.importorskip(
        "transformers", reason="transformers not installed: the HF parity reference is missing"
    )
    return transformers.Qwen2VLImageProcessorPil(
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    )


def _assert_same_as_hf(rows: np.ndarray, grid: tuple[int, int, int], reference: Any) -> None:
    expected_rows = np.asarray(reference["pixel_values"])
    expected_grid = np.asarray(reference["image_grid_thw"])
    assert expected_grid.shape == (1, 3)
    assert grid == tuple(int(value) for value in expected_grid[0])
    assert rows.dtype == np.float32
    assert rows.shape == expected_rows.shape
    assert float(np.max(np.abs(rows - expected_rows))) <= PARITY_ATOL


def test_parity_set_covers_the_claimed_cases() -> None:
    """Guard the generator itself, so the parity test cannot quietly test less."""
    assert len(CASES) >= 200
    sizes = [(case.height, case.width) for case in CASES]
    aspects = [max(h, w) / min(h, w) for h, w in sizes]
    assert max(aspects) >= 140
    assert any(h > w and a >= 100 for (h, w), a in zip(sizes, aspects, strict=True))
    assert any(w > h and a >= 100 for (h, w), a in zip(sizes, aspects, strict=True))
    assert sum(h * w < MIN_PIXELS for h, w in sizes) >= 20
    assert sum(h * w > MAX_PIXELS for h, w in sizes) >= 20
    assert sum(h % 28 == 0 and w % 28 == 0 for h, w in sizes) >= 20
    modes = {case.mode for case in CASES}
    assert {"RGBA", "LA", "P", "PA", "L", "CMYK", "I;16", "I", "F", "1", "RGB"} <= modes
    assert {case.orientation for case in CASES} >= set(range(1, 9))
    assert sum(case.transparency for case in CASES) >= 20


@pytest.mark.parametrize("case", [c for c in CASES if c.orientation], ids=lambda c: c.name)
def test_exif_cases_really_carry_an_orientation(case: Case) -> None:
    opened = Image.open(io.BytesIO(_encode(case)))
    assert opened.getexif().get(EXIF_ORIENTATION) == case.orientation


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_patchify_matches_hf(case: Case, hf_processor: Any) -> None:
    if case.fmt is None:
        image = _memory_image(case)
        reference = hf_processor(images=image.copy())
        rows, grid = patchify(image)
    else:
        data = _encode(case)
        # jina-embeddings-v4's loader: Image.open(...).convert("RGB") (alpha dropped)
        reference = hf_processor(images=Image.open(io.BytesIO(data)).convert("RGB"))
        decoded = decode_image(data)
        assert decoded.mode == "RGB"
        assert decoded.size == (case.width, case.height)  # EXIF orientation not applied
        rows, grid = patchify(decoded)
    _assert_same_as_hf(rows, grid, reference)


def test_patchify_matches_hf_with_other_pixel_budget(hf_processor: Any) -> None:
    transformers = pytest.importorskip("transformers")
    min_pixels, max_pixels = 4 * 28 * 28 * 4, 28 * 28 * 1280  # HF's class default max
    processor = transformers.Qwen2VLImageProcessorPil(
        size={"shortest_edge": min_pixels, "longest_edge": max_pixels}
    )
    rng = np.random.default_rng(7)
    for height, width in [(30, 40), (1500, 1100), (33, 3000), (500, 500)]:
        image = Image.fromarray(_content(rng, height, width), "RGBA")
        rows, grid = patchify(image, min_pixels=min_pixels, max_pixels=max_pixels)
        _assert_same_as_hf(rows, grid, processor(images=image))


def test_smart_resize_matches_hf_on_a_sweep() -> None:
    pytest.importorskip("transformers", reason="transformers not installed: no HF reference")
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        smart_resize as hf_smart_resize,
    )

    rng = np.random.default_rng(11)
    budgets = [(MIN_PIXELS, MAX_PIXELS), (56 * 56, 28 * 28 * 1280), (100 * 28 * 28, 200 * 28 * 28)]
    sides = list(range(1, 120)) + [int(v) for v in rng.integers(1, 9000, size=400)]
    checked = 0
    for min_pixels, max_pixels in budgets:
        for _ in range(1500):
            height, width = int(rng.choice(sides)), int(rng.choice(sides))
            if max(height, width) / min(height, width) > 200:
                continue
            expected = hf_smart_resize(height, width, 28, min_pixels, max_pixels)
            assert smart_resize(height, width, 28, min_pixels, max_pixels) == expected
            checked += 1
    assert checked > 3000


def test_every_normalised_level_is_bit_identical_to_hf(hf_processor: Any) -> None:
    """All 256 levels of every channel, no resize: the rows must equal HF's bit for bit."""
    height, width = 56, 140
    index = np.arange(height * width).reshape(height, width)
    pixels = np.stack([(index * step) % 256 for step in (1, 3, 5)], axis=-1).astype(np.uint8)
    assert all(len(np.unique(pixels[..., c])) == 256 for c in range(3))
    image = Image.fromarray(pixels, "RGB")
    rows, grid = patchify(image)
    expected = np.asarray(hf_processor(images=image)["pixel_values"])
    assert grid == (1, 4, 10)
    assert np.array_equal(rows.view(np.uint32), expected.view(np.uint32))


def test_patch_levels_expand_to_patchify_rows_bit_for_bit() -> None:
    """What the service sends a VLP1 server (levels + table) stands for exactly patchify's rows,
    on a resized noise image (every level in play) and on a page-sized document."""
    rng = np.random.default_rng(3)
    noise = Image.fromarray(rng.integers(0, 256, size=(333, 517, 3), dtype=np.uint8), "RGB")
    page = Image.new("RGB", (1275, 1650), "white")
    page.paste(noise, (100, 200))
    for image in (noise, page):
        rows, grid = patchify(image)
        levels = patch_levels(image)
        assert levels.grid == grid
        assert levels.levels.shape == (rows.shape[0], 588) and levels.levels.dtype == np.uint8
        assert np.array_equal(levels.rows().view(np.uint32), rows.view(np.uint32))


def test_hf_also_rejects_la(hf_processor: Any) -> None:
    """``La`` fails in HF too; we turn Pillow's ValueError into an ImageError."""
    image = Image.new("La", (40, 40))
    with pytest.raises(ValueError):
        hf_processor(images=image)
    with pytest.raises(ImageError, match="unsupported image mode 'La'"):
        patchify(image)


# --- geometry ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("height", "width", "expected"),
    [
        (448, 448, (448, 448)),  # already a multiple of 28, inside the budget
        (1650, 1275, (868, 672)),  # a letter page at 150 dpi
        (3000, 4000, (672, 896)),  # a photo, shrunk to max_pixels
        (1, 1, (56, 56)),  # grown to min_pixels
        (20, 30, (56, 84)),
        (70, 280, (56, 280)),  # 70 / 28 = 2.5 rounds half to even -> 2, not 3
        (42, 280, (56, 280)),  # 1.5 -> 2
        (1, 200, (28, 812)),  # aspect exactly 200 is allowed
        (200, 1, (812, 28)),
        (776, 776, (756, 756)),  # rounds up to 784x784 > max, then floors
        (4000, 20, (4004, 28)),
    ],
)
def test_smart_resize_known_values(height: int, width: int, expected: tuple[int, int]) -> None:
    assert smart_resize(height, width) == expected


@pytest.mark.parametrize(("height", "width"), [(1, 201), (201, 1), (10, 2011), (3000, 14)])
def test_smart_resize_rejects_aspect_ratio_over_200(height: int, width: int) -> None:
    with pytest.raises(ImageError, match="aspect ratio must be at most 200"):
        smart_resize(height, width)


@pytest.mark.parametrize(("height", "width"), [(0, 10), (10, 0), (0, 0), (-5, 10)])
def test_smart_resize_rejects_empty_images(height: int, width: int) -> None:
    with pytest.raises(ImageError, match="no pixels"):
        smart_resize(height, width)


@pytest.mark.parametrize(
    "kwargs",
    [{"factor": 0}, {"min_pixels": 0}, {"min_pixels": 5000, "max_pixels": 4000}],
)
def test_smart_resize_rejects_bad_configuration(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="min_pixels"):
        smart_resize(100, 100, **kwargs)


def test_smart_resize_output_invariants() -> None:
    rng = np.random.default_rng(3)
    for _ in range(2000):
        height, width = int(rng.integers(1, 5000)), int(rng.integers(1, 5000))
        if max(height, width) / min(height, width) > 200:
            continue
        out_h, out_w = smart_resize(height, width)
        assert out_h % 28 == 0 and out_w % 28 == 0
        assert out_h >= 28 and out_w >= 28
        assert out_h * out_w >= MIN_PIXELS
        if max(height, width) / min(height, width) < 20:
            assert out_h * out_w <= MAX_PIXELS


def test_patchify_rejects_bad_geometry() -> None:
    with pytest.raises(ImageError, match="aspect ratio"):
        patchify(Image.new("RGB", (402, 2)))
    with pytest.raises(ImageError, match="no pixels"):
        patchify(Image.new("RGB", (0, 30)))


# --- row values and layout, from first principles --------------------------------------


def _expected_value(level: int, channel: int) -> float:
    return (level / 255 - IMAGE_MEAN[channel]) / IMAGE_STD[channel]


def test_solid_colour_rows_hold_the_normalised_colour() -> None:
    colour = (255, 0, 128)
    rows, grid = patchify(Image.new("RGB", (56, 84), colour))  # no resize needed
    assert grid == (1, 6, 4)
    assert rows.shape == (24, PATCH_DIM) and rows.dtype == np.float32
    by_channel = rows.reshape(24, 3, 2 * 196)
    for channel, level in enumerate(colour):
        expected = _expected_value(level, channel)
        assert np.allclose(by_channel[:, channel], expected, rtol=0, atol=1e-6)


def test_rows_are_merge_block_ordered_and_laid_out_c_t_h_w() -> None:
    """Each pixel encodes where it is; rebuild the expected rows with plain loops."""
    grid_h, grid_w = 8, 12
    height, width = 14 * grid_h, 14 * grid_w
    pixels = np.zeros((height, width, 3), dtype=np.uint8)
    for y in range(height):
        for x in range(width):
            pixels[y, x] = (30 * (y // 14), 20 * (x // 14), 14 * (y % 14) + (x % 14))
    rows, grid = patchify(Image.fromarray(pixels, "RGB"))
    assert grid == (1, grid_h, grid_w)

    expected = []
    for block_y in range(grid_h // 2):
        for block_x in range(grid_w // 2):
            for inner_y in range(2):
                for inner_x in range(2):
                    patch_y, patch_x = 2 * block_y + inner_y, 2 * block_x + inner_x
                    row = []
                    for channel in range(3):
                        for _frame in range(2):
                            for py in range(14):
                                for px in range(14):
                                    level = pixels[14 * patch_y + py, 14 * patch_x + px, channel]
                                    row.append(_expected_value(int(level), channel))
                    expected.append(row)
    assert np.allclose(rows, np.asarray(expected), rtol=0, atol=1e-6)


def test_rows_are_contiguous_float32() -> None:
    rows, _ = patchify(Image.new("RGB", (300, 200), (10, 20, 30)))
    assert rows.flags["C_CONTIGUOUS"] and rows.dtype == np.float32


# --- decoding: malformed and hostile input -----------------------------------------------


def _png_chunk(tag: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(tag + body) & 0xFFFFFFFF
    return struct.pack(">I", len(body)) + tag + body + struct.pack(">I", crc)


def _png_declaring(width: int, height: int) -> bytes:
    """A ~70-byte grey PNG whose header claims ``width x height`` pixels."""
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", header)
        + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64))
        + _png_chunk(b"IEND", b"")
    )


def _encoded(fmt: str, size: tuple[int, int] = (64, 48), mode: str = "RGB", **save: Any) -> bytes:
    pixels = _content(np.random.default_rng(9), size[1], size[0])
    buffer = io.BytesIO()
    _in_mode(pixels, mode).save(buffer, fmt, **save)
    return buffer.getvalue()


def test_decode_returns_a_loaded_rgb_image_of_the_stored_size() -> None:
    image = decode_image(_encoded("PNG", (64, 48), "RGBA"))
    assert image.mode == "RGB" and image.size == (64, 48)
    assert np.asarray(image).shape == (48, 64, 3)


@pytest.mark.parametrize("data", [b"", b"hello, world", bytes(range(256)) * 4])
def test_decode_rejects_non_images(data: bytes) -> None:
    with pytest.raises(ImageError):
        decode_image(data)


def test_decode_rejects_random_bytes_after_a_png_signature() -> None:
    noise = np.random.default_rng(2).integers(0, 256, size=4000, dtype=np.uint8).tobytes()
    with pytest.raises(ImageError):
        decode_image(b"\x89PNG\r\n\x1a\n" + noise)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "TIFF"])
@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_decode_rejects_truncated_files(fmt: str, keep: float) -> None:
    data = _encoded(fmt, (160, 120))
    with pytest.raises(ImageError):
        decode_image(data[: int(len(data) * keep)])


def test_decode_rejects_a_corrupted_png_body() -> None:
    data = bytearray(_encoded("PNG", (160, 120)))
    data[len(data) // 2 : len(data) // 2 + 64] = bytes(64)  # breaks the CRC and the zlib stream
    with pytest.raises(ImageError):
        decode_image(bytes(data))


def test_decode_rejects_a_decompression_bomb_beyond_pillows_hard_limit() -> None:
    with pytest.raises(ImageError, match="too large") as info:
        decode_image(_png_declaring(100_000, 100_000))
    assert isinstance(info.value.__cause__, Image.DecompressionBombError)


def test_decode_rejects_a_bomb_between_pillows_warning_and_error_without_warning() -> None:
    """10^8 pixels: Pillow only warns; our own cap refuses it and the warning stays inside."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an escaping warning would fail the test
        with pytest.raises(ImageError, match=r"10000x10000 = 100000000 pixels, more than"):
            decode_image(_png_declaring(10_000, 10_000))


def test_decode_applies_the_callers_pixel_cap() -> None:
    data = _encoded("PNG", (40, 30))
    assert decode_image(data, max_pixels_decoded=1200).size == (40, 30)
    with pytest.raises(ImageError, match="40x30 = 1200 pixels, more than the limit of 1199"):
        decode_image(data, max_pixels_decoded=1199)


def test_decode_refuses_formats_outside_the_allow_list() -> None:
    for fmt in ("ICO", "PPM", "TGA"):
        data = _encoded(fmt, (32, 32))
        assert Image.open(io.BytesIO(data)).format == fmt  # Pillow alone would accept it
        with pytest.raises(ImageError, match="unsupported image format"):
            decode_image(data)
    eps = b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\nshowpage\n"
    with pytest.raises(ImageError):
        decode_image(eps)


def test_decode_errors_are_input_errors_chained_to_pillow() -> None:
    with pytest.raises(InvalidInputError) as info:
        decode_image(_encoded("JPEG")[:100])
    assert isinstance(info.value, VlembedError)
    assert info.value.__cause__ is not None


def test_decode_rejects_non_bytes_and_bad_caps() -> None:
    with pytest.raises(TypeError, match="bytes-like"):
        decode_image("not bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_pixels_decoded"):
        decode_image(_encoded("PNG"), max_pixels_decoded=0)


def test_decode_accepts_bytearray_and_memoryview() -> None:
    data = _encoded("PNG")
    expected = np.asarray(decode_image(data))
    assert np.array_equal(np.asarray(decode_image(bytearray(data))), expected)
    assert np.array_equal(np.asarray(decode_image(memoryview(data))), expected)


def test_decode_ignores_exif_orientation_like_hf() -> None:
    exif = Image.Exif()
    exif[EXIF_ORIENTATION] = 6  # "rotate 90 CW to display"
    data = _encoded("JPEG", (80, 40), exif=exif)
    image = decode_image(data)
    assert image.size == (80, 40)  # stored size, not the displayed 40x80
    rows, grid = patchify(image)
    assert grid == (1, 4, 6)  # smart_resize(40, 80) = (56, 84); rotated it would be (1, 6, 4)


# --- mode conversion ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode",
    ["1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"]
    + ["I", "I;16", "I;16B", "F"],
)
def test_every_supported_mode_becomes_rgb(mode: str) -> None:
    image = _in_mode(_content(np.random.default_rng(4), 30, 20), mode)
    assert image.mode == mode
    rgb = to_rgb(image)
    assert rgb.mode == "RGB" and rgb.size == (20, 30)
    assert "transparency" not in rgb.info


def test_alpha_is_composited_onto_white() -> None:
    rgba = np.zeros((2, 3, 4), dtype=np.uint8)
    rgba[0, 0] = (10, 20, 30, 0)  # fully transparent -> white
    rgba[0, 1] = (10, 20, 30, 255)  # opaque -> unchanged
    rgba[0, 2] = (0, 0, 0, 128)  # half -> mid grey
    out = np.asarray(to_rgb(Image.fromarray(rgba, "RGBA"))).astype(int)
    assert out[0, 0].tolist() == [255, 255, 255]
    assert out[0, 1].tolist() == [10, 20, 30]
    assert np.all(np.abs(out[0, 2] - 127) <= 1)


def test_transparency_keys_become_white() -> None:
    palette = Image.fromarray(np.array([[0, 1], [2, 1]], dtype=np.uint8), "P")
    palette.putpalette([255, 0, 0, 0, 255, 0, 0, 0, 255] + [0] * (3 * 253))
    palette.info["transparency"] = 1
    out = np.asarray(to_rgb(palette))
    assert out[0, 1].tolist() == [255, 255, 255] and out[0, 0].tolist() == [255, 0, 0]

    rgb = Image.fromarray(np.array([[[1, 2, 3], [4, 5, 6]]], dtype=np.uint8), "RGB")
    rgb.info["transparency"] = (4, 5, 6)
    assert np.asarray(to_rgb(rgb)).tolist() == [[[1, 2, 3], [255, 255, 255]]]


def test_sixteen_bit_grey_is_clipped_not_rescaled() -> None:
    """HF (through Pillow's convert) clips I;16 to 0..255; it does not divide by 257."""
    grey = Image.fromarray(np.array([[100, 1000, 65535]], dtype=np.uint16))
    assert grey.mode == "I;16"
    assert np.asarray(to_rgb(grey))[0, :, 0].tolist() == [100, 255, 255]


def test_plain_rgb_is_passed_through() -> None:
    image = Image.new("RGB", (5, 5), (1, 2, 3))
    assert to_rgb(image) is image


# --- packaging --------------------------------------------------------------------------


def test_image_module_imports_neither_torch_nor_transformers() -> None:
    code = (
        "import sys, preprocess_service.image\n"
        "bad = [m for m in ('torch', 'transformers', 'torchvision') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


def test_bytes_with_alpha_are_opened_like_the_models_loader() -> None:
    """Bytes are the path/URL case: ``Image.open(...).convert("RGB")`` drops alpha."""
    rgba = np.zeros((8, 8, 4), np.uint8)
    rgba[..., 0] = 200
    rgba[..., 3] = np.arange(64, dtype=np.uint8).reshape(8, 8) * 4  # varying alpha
    buf = io.BytesIO()
    Image.fromarray(rgba, "RGBA").save(buf, "PNG")
    decoded = np.asarray(decode_image(buf.getvalue()))
    assert (decoded[..., 0] == 200).all() and (decoded[..., 1:] == 0).all()  # not whitened
    whitened = np.asarray(to_rgb(Image.fromarray(rgba, "RGBA")))
    assert (whitened[..., 1] > 0).any()  # the PIL-object path composites onto white
