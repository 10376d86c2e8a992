import base64
import json
import struct

import numpy as np
import pytest

from vlembed.wire import (
    CHUNK_IMAGE,
    CHUNK_TEXT,
    Chunk,
    PatchLevels,
    WireFormatError,
    decode_patches_body,
    decode_rows,
    encode_patches,
    encode_patches_body,
    encode_rows,
)


def _record() -> tuple[np.ndarray, list[Chunk]]:
    rows = np.arange(6 * 4, dtype=np.float32).reshape(6, 4) / 7
    chunks = [Chunk(CHUNK_TEXT, 0, 2, -1), Chunk(CHUNK_IMAGE, 2, 3, 0), Chunk(CHUNK_TEXT, 5, 1, -1)]
    return rows, chunks


def test_roundtrip_f32_and_f16() -> None:
    rows, chunks = _record()
    got = decode_rows(encode_rows(rows, chunks))
    assert np.array_equal(got.rows, rows) and list(got.chunks) == chunks
    assert [c.image_index for c in got.image_chunks] == [0]
    half = decode_rows(encode_rows(rows, chunks, dtype=1))
    np.testing.assert_allclose(half.rows, rows, rtol=1e-3)


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda b: b[:10], "too short"),
        (lambda b: b"XXXX" + b[4:], "bad magic"),
        (lambda b: b[:-4], "header implies"),
        (lambda b: b[:12] + (7).to_bytes(4, "little") + b[16:], "dtype"),
    ],
)
def test_malformed_bodies(mutate, match: str) -> None:
    rows, chunks = _record()
    with pytest.raises(WireFormatError, match=match):
        decode_rows(mutate(encode_rows(rows, chunks)))


def test_chunk_map_must_cover_rows() -> None:
    rows, chunks = _record()
    bad = [chunks[0], Chunk(CHUNK_IMAGE, 3, 3, 0), chunks[2]]
    with pytest.raises(WireFormatError, match="contiguous"):
        decode_rows(encode_rows(rows, bad))


def test_patches_are_exact_little_endian_f32() -> None:
    p = np.random.default_rng(0).standard_normal((8, 1176)).astype(np.float32)
    entry = encode_patches(p, (1, 2, 4))
    back = np.frombuffer(base64.b64decode(entry["data"]), dtype="<f4").reshape(8, 1176)
    assert entry["grid_thw"] == [1, 2, 4] and np.array_equal(back, p)
    with pytest.raises(ValueError):
        encode_patches(p[:, :100], (1, 2, 4))


def _levels(grid: tuple[int, int, int], seed: int = 0) -> PatchLevels:
    rng = np.random.default_rng(seed)
    n = grid[0] * grid[1] * grid[2]
    levels = rng.integers(0, 256, size=(n, 588), dtype=np.uint8)
    table = rng.standard_normal((3, 256)).astype(np.float32)
    return PatchLevels(levels, grid, table)


def test_levels_expand_to_both_temporal_halves_of_each_row() -> None:
    image = _levels((1, 2, 4))
    rows = image.rows()
    assert rows.shape == (8, 1176) and rows.dtype == np.float32
    by_value = rows.reshape(8, 3, 2, 196)
    for n in (0, 5):
        for c in range(3):
            expected = image.table[c][image.levels[n, c * 196 : (c + 1) * 196]]
            assert np.array_equal(by_value[n, c, 0], expected)
            assert np.array_equal(by_value[n, c, 1], expected)


@pytest.mark.parametrize(
    "levels, grid, table, match",
    [
        (np.zeros((8, 588), np.uint8), (1, 2, 2), np.zeros((3, 256), np.float32), "levels"),
        (np.zeros((4, 588), np.float32), (1, 2, 2), np.zeros((3, 256), np.float32), "levels"),
        (np.zeros((4, 588), np.uint8), (1, 2, 2), np.zeros((3, 255), np.float32), "table"),
        (np.zeros((4, 588), np.uint8), (1, 2, 2), np.zeros((3, 256), np.float64), "table"),
    ],
)
def test_levels_refuse_wrong_shapes(levels, grid, table, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PatchLevels(levels, grid, table)


def test_patches_body_layout_and_roundtrip() -> None:
    images = [_levels((1, 2, 4), 1), _levels((1, 4, 2), 2)]
    request = {"content": {"prompt_string": "a<m>b<m>"}, "rows_format": "f32"}
    body = encode_patches_body(request, images)
    magic, json_len = struct.unpack_from("<4sI", body)
    head = json.loads(body[8 : 8 + json_len])
    assert magic == b"VLP1"
    entries = head["content"]["multimodal_patches"]
    assert entries == [{"grid_thw": [1, 2, 4]}, {"grid_thw": [1, 4, 2]}]
    assert head["rows_format"] == "f32" and "multimodal_patches" not in request["content"]
    assert len(body) == 8 + json_len + 2 * (3 * 256 * 4 + 8 * 588)
    first_table = np.frombuffer(body, "<f4", 768, 8 + json_len).reshape(3, 256)
    assert np.array_equal(first_table, images[0].table)

    back_request, back = decode_patches_body(body)
    assert back_request == head
    for got, sent in zip(back, images, strict=True):
        assert got.grid == sent.grid
        assert np.array_equal(got.rows(), sent.rows())


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda b: b[:6], "too short"),
        (lambda b: b"VLR1" + b[4:], "bad magic"),
        (lambda b: b[:-1], "ends inside"),
        (lambda b: b + b"\0", "after the last"),
    ],
)
def test_malformed_patches_bodies(mutate, match: str) -> None:
    body = encode_patches_body({"content": {"prompt_string": "<m>"}}, [_levels((1, 2, 2))])
    with pytest.raises(WireFormatError, match=match):
        decode_patches_body(mutate(body))
