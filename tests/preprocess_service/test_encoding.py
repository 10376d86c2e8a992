import base64

import numpy as np
import pytest

from preprocess_service.encoding import encode_any


def test_ubinary_is_sign_bits_msb_first() -> None:
    vec = np.array([0.5, -1, 0, 2, -3, 4, 5, -6, 7], dtype=np.float32)
    # bits: 1 0 0 1 0 1 1 0 | 1 (padded with zeros)
    assert encode_any(vec, "ubinary") == [0b10010110, 0b10000000]
    assert encode_any(vec, "binary") == [0b10010110 - 128, 0b10000000 - 128]


def test_base64_is_little_endian_float32() -> None:
    vec = np.array([1.5, -2.25], dtype=np.float32)
    raw = base64.b64decode(encode_any(vec, "float", "base64"))
    assert np.array_equal(np.frombuffer(raw, "<f4"), vec)


def test_binary_types_travel_as_base64_bytes() -> None:
    vec = np.array([0.5, -1, 0, 2, -3, 4, 5, -6, 7], dtype=np.float32)
    raw = base64.b64decode(encode_any(vec, "ubinary", "base64"))
    assert list(raw) == [0b10010110, 0b10000000]
    raw = base64.b64decode(encode_any(vec, "binary", "base64"))
    assert np.frombuffer(raw, np.int8).tolist() == [0b10010110 - 128, 0b10000000 - 128]


def test_multivector_float_rows_and_one_base64_string() -> None:
    m = np.array([[1, -1, 0.5], [-1, 1, 2]], dtype=np.float32)
    assert encode_any(m, "float") == [[1.0, -1.0, 0.5], [-1.0, 1.0, 2.0]]
    b64 = encode_any(m, "float", "base64")
    assert isinstance(b64, str)
    # what the openai SDK does with it: one flat float32 array, reshaped by the row width
    assert np.array_equal(np.frombuffer(base64.b64decode(b64), "<f4").reshape(2, 3), m)
    with pytest.raises(ValueError, match="valid"):
        encode_any(m[0], "int4")
