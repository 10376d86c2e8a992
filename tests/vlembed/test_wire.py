import base64

import numpy as np
import pytest

from vlembed.wire import (
    CHUNK_IMAGE,
    CHUNK_TEXT,
    Chunk,
    WireFormatError,
    decode_rows,
    encode_patches,
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
