"""The compact VLP1 patch body on the real patched llama-server.

A VLP1 body carries uint8 pixel levels of one temporal half and the per-channel table; the
server expands them to the f32 rows. The rows it computes must be exactly the rows of the f32
JSON path, so the embeddings of one image through both paths are equal bit for bit. A malformed
body is a 400 and the server keeps serving.
"""

from __future__ import annotations

import json
import struct

import httpx
import numpy as np
import pytest
from PIL import Image

from bench.serving import page_image
from preprocess_service.backend import Backend
from preprocess_service.image import patch_levels, patchify
from vlembed.tasks import IMAGE_TEMPLATE
from vlembed.wire import PatchLevels, Rows, encode_patches_body

from .conftest import run

pytestmark = pytest.mark.integration


def _img(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


async def _rows_both_ways(url: str, prompt: str, images: list[Image.Image]) -> dict[str, Rows]:
    """The rows of one prompt sent as VLP1, as f32 JSON from the same levels, and as f32 JSON
    from ``patchify``; each request's content type is recorded to show which path it took."""
    sent: list[str] = []

    async def record(request: httpx.Request) -> None:
        if request.url.path == "/embeddings":
            sent.append(request.headers["content-type"])

    async with httpx.AsyncClient(event_hooks={"request": [record]}) as client:
        backend = Backend(url, "retrieval", client)
        assert await backend.refresh(), "backend not ready"
        assert backend.compact_patches, "the server does not advertise VLP1 bodies"
        text = prompt.replace("<IMG>", backend.marker or "")
        levels = [patch_levels(im) for im in images]
        out = {"vlp1": await backend.embed(text, levels, 120.0)}
        backend.allow_compact = False
        out["json from levels"] = await backend.embed(text, levels, 120.0)
        out["json from patchify"] = await backend.embed(
            text, [patchify(im) for im in images], 120.0
        )
    assert sent == ["application/octet-stream", "application/json", "application/json"]
    return out


@pytest.mark.parametrize(
    "name, images",
    [
        ("noise 100x150", [(100, 150, 1)]),
        ("two images 56x84 + 200x90", [(56, 84, 2), (200, 90, 3)]),
        ("page 1275x1650", []),
    ],
)
def test_vlp1_rows_equal_the_f32_path_bit_for_bit(name: str, images, retrieval_server) -> None:
    pictures = [_img(*spec) for spec in images] or [page_image(1275, 1650)]
    prompt = "<|im_start|>user\n" + "".join("<IMG>x" for _ in pictures) + "<|im_end|>\n"
    if len(pictures) == 1:
        prompt = IMAGE_TEMPLATE.format(image="<IMG>")
    got = run(_rows_both_ways(retrieval_server.spec.url, prompt, pictures))
    vlp1 = got.pop("vlp1")
    assert len(vlp1.image_chunks) == len(pictures)
    for path, rows in got.items():
        assert rows.chunks == vlp1.chunks, path
        assert np.array_equal(rows.rows.view(np.uint32), vlp1.rows.view(np.uint32)), (name, path)


def test_props_advertise_both_patch_bodies(retrieval_server) -> None:
    caps = httpx.get(retrieval_server.spec.url + "/props").json()["vlembed"]
    assert caps["patch_bodies"] == ["json_f32", "vlp1_u8"]


# --- malformed bodies -------------------------------------------------------------------------


def _entry(grid=(1, 4, 4), seed: int = 0) -> PatchLevels:
    rng = np.random.default_rng(seed)
    n = grid[0] * grid[1] * grid[2]
    levels = rng.integers(0, 256, (n, 588), dtype=np.uint8)
    table = rng.standard_normal((3, 256)).astype(np.float32)
    return PatchLevels(levels, grid, table)


def _body(head: dict, tail: bytes) -> bytes:
    text = json.dumps(head).encode()
    return b"VLP1" + struct.pack("<I", len(text)) + text + tail


def _malformed(marker: str, max_patches: int) -> dict[str, bytes]:
    prompt = f"<|im_start|>user\n{marker}x"
    request = {"content": {"prompt_string": prompt}, "rows_format": "f32"}
    good = encode_patches_body(request, [_entry()])
    head_len = struct.unpack_from("<I", good, 4)[0]
    head = json.loads(good[8 : 8 + head_len])
    payload = good[8 + head_len :]  # table (3072 bytes) + 16 rows of 588 levels

    def with_grid(grid: object) -> dict:
        return {**head, "content": {**head["content"], "multimodal_patches": [{"grid_thw": grid}]}}

    nan_table = bytearray(payload)
    nan_table[4 * 300 : 4 * 301] = struct.pack("<f", float("nan"))
    inf_table = bytearray(payload)
    inf_table[0:4] = struct.pack("<f", float("inf"))
    odd = encode_patches_body(request, [_entry((1, 3, 5))])
    side = 2 * (int(max_patches**0.5) // 2 + 1)  # even, side * side > max_patches
    over_limit = encode_patches_body(request, [_entry((1, side, side))])
    return {
        "header only": b"VLP1\x10",
        "json length past the end": b"VLP1" + struct.pack("<I", 1 << 30) + b"{}",
        "json not json": b"VLP1" + struct.pack("<I", 5) + b"{nope" + payload,
        "no content": _body({"rows_format": "f32"}, payload),
        "input instead of content": _body({"input": "x", **head}, payload),
        "content array": _body({"content": [head["content"]]}, payload),
        "entry carries data": _body(
            {
                **head,
                "content": {
                    **head["content"],
                    "multimodal_patches": [{"grid_thw": [1, 4, 4], "data": "AAAA"}],
                },
            },
            payload,
        ),
        "pixels one byte short": good[:-1],
        "one byte after the pixels": good + b"\0",
        "table of 255 levels": _body(head, payload[: 3072 - 12] + payload[3072:]),
        "nan in the table": _body(head, bytes(nan_table)),
        "inf in the table": _body(head, bytes(inf_table)),
        "odd grid": odd,
        "t=2": _body(with_grid([2, 2, 4]), payload),
        "oversized grid": _body(with_grid([1, 1000, 1000]), payload),
        "over the patch limit, every byte there": over_limit,
        "negative grid": _body(with_grid([1, -4, -4]), payload),
        "grid of floats": _body(with_grid([1.0, 4.0, 4.0]), payload),
        "grid of two": _body(with_grid([4, 4]), payload),
        "no marker": _body(
            {**head, "content": {**head["content"], "prompt_string": "no marker"}}, payload
        ),
        "two entries, one marker": encode_patches_body(request, [_entry(), _entry()]),
    }


def test_malformed_vlp1_bodies_are_400_and_the_server_lives(retrieval_server) -> None:
    url = retrieval_server.spec.url
    props = httpx.get(url + "/props").json()
    marker = props["media_marker"]
    headers = {"Content-Type": "application/octet-stream"}
    for name, body in _malformed(marker, props["vlembed"]["max_patches"]).items():
        r = httpx.post(url + "/embeddings", content=body, headers=headers, timeout=60)
        assert r.status_code == 400, (name, r.status_code, r.text[:300])
        assert r.json()["error"]["type"] == "invalid_request_error", (name, r.text[:300])
        print(f"{name}: {r.json()['error']['message'][:150]}")
    prompt = f"<|im_start|>user\n{marker}x"
    good = encode_patches_body(
        {"content": {"prompt_string": prompt}, "rows_format": "f32"}, [_entry()]
    )
    ok = httpx.post(url + "/embeddings", content=good, headers=headers, timeout=60)
    assert ok.status_code == 200 and retrieval_server.exited() is None
