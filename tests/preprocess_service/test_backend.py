"""Which patch body the backend client sends: VLP1 only to a server that advertises it.

The rows the real server computes from either body are compared in
tests/integration/test_patch_transport.py; here the choice and the bytes are checked.
"""

from __future__ import annotations

import asyncio
import base64
import json

import httpx
import numpy as np
import pytest

from preprocess_service.backend import Backend
from vlembed.wire import (
    CHUNK_TEXT,
    PATCHES_MAGIC,
    Chunk,
    PatchLevels,
    decode_patches_body,
    encode_rows,
)


def _levels() -> PatchLevels:
    rng = np.random.default_rng(5)
    levels = rng.integers(0, 256, (8, 588), dtype=np.uint8)
    return PatchLevels(levels, (1, 2, 4), rng.standard_normal((3, 256)).astype(np.float32))


def _sent_rows(bodies: list[bytes]) -> tuple[str, np.ndarray]:
    """('vlp1' | 'json', the f32 rows the one recorded body stands for)."""
    (body,) = bodies
    if body.startswith(PATCHES_MAGIC):
        _, (image,) = decode_patches_body(body)
        return "vlp1", image.rows()
    (entry,) = json.loads(body)["content"]["multimodal_patches"]
    data = base64.b64decode(entry["data"])
    return "json", np.frombuffer(data, "<f4").reshape(-1, 1176)


def _send(patch_bodies: list[str] | None, allow_compact: bool, image) -> tuple[str, np.ndarray]:
    bodies: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path == "/props":
            caps: dict[str, object] = {"precomputed_patches": True}
            if patch_bodies is not None:
                caps["patch_bodies"] = patch_bodies
            return httpx.Response(200, json={"media_marker": "<m>", "vlembed": caps})
        bodies.append(request.content)
        rows = np.zeros((1, 4), np.float32)
        return httpx.Response(200, content=encode_rows(rows, [Chunk(CHUNK_TEXT, 0, 1, -1)]))

    async def go() -> None:
        client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
        async with client:
            backend = Backend("http://b", "retrieval", client, allow_compact=allow_compact)
            assert await backend.refresh()
            await backend.embed("<m>", [image], 10.0)

    asyncio.run(go())
    return _sent_rows(bodies)


@pytest.mark.parametrize(
    "patch_bodies, allow_compact, expected",
    [
        (["json_f32", "vlp1_u8"], True, "vlp1"),
        (["json_f32", "vlp1_u8"], False, "json"),
        (["json_f32"], True, "json"),
        (None, True, "json"),  # a server from before the compact body
    ],
)
def test_levels_go_as_vlp1_only_where_advertised(patch_bodies, allow_compact, expected) -> None:
    image = _levels()
    kind, rows = _send(patch_bodies, allow_compact, image)
    assert kind == expected
    assert np.array_equal(rows.view(np.uint32), image.rows().view(np.uint32))


def test_f32_rows_always_go_as_json() -> None:
    image = _levels()
    kind, rows = _send(["json_f32", "vlp1_u8"], True, (image.rows(), image.grid))
    assert kind == "json" and np.array_equal(rows, image.rows())
