import base64

import numpy as np
import pytest

from preprocess_service.encoding import encode, encode_any


def test_ubinary_is_sign_bits_msb_first() -> None:
    vec = np.array([0.5, -1, 0, 2, -3, 4, 5, -6, 7], dtype=np.float32)
    # bits: 1 0 0 1 0 1 1 0 | 1 (padded with zeros)
    assert encode(vec, "ubinary") == [0b10010110, 0b10000000]
    assert encode(vec, "binary") == [0b10010110 - 128, 0b10000000 - 128]


def test_base64_is_little_endian_float32() -> None:
    vec = np.array([1.5, -2.25], dtype=np.float32)
    raw = base64.b64decode(encode(vec, "base64"))
    assert np.array_equal(np.frombuffer(raw, "<f4"), vec)


def test_multivector_encodes_each_row() -> None:
    m = np.array([[1, -1], [-1, 1]], dtype=np.float32)
    assert encode_any(m, "float") == [[1.0, -1.0], [-1.0, 1.0]]
    with pytest.raises(ValueError, match="valid"):
        encode(m[0], "int4")
