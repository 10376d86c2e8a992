"""Patched llama-server rows vs the PyTorch reference (tiny model, F32 GGUF).

Bounds from the llama_patches issue: min per-row cosine ≥ 0.99999 and pooled cosine ≥ 0.99999.
Patches come from our HF-exact ``patchify``; the reference runs HF's own processor.
"""

from __future__ import annotations

import asyncio
import base64
import io

import httpx
import numpy as np
import pytest
from PIL import Image

from preprocess_service.image import patch_levels, patchify
from preprocess_service.supervisor import VISION_BATCH_TOKENS
from vlembed.tasks import IMAGE_TEMPLATE

from .conftest import backend_rows, row_cosines, run, vision_forwards

pytestmark = pytest.mark.integration
BOUND = 0.99999


def _img(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    # smooth content so resizing matters like it does for documents
    base = rng.integers(0, 256, (max(h // 8, 1), max(w // 8, 1), 3), dtype=np.uint8)
    return Image.fromarray(base).resize((w, h), Image.BILINEAR)


IMAGES = {
    "no-resize 56x84": (56, 84),
    "non-multiple 100x150": (100, 150),
    "below-min 20x30": (20, 30),
    "above-max 1000x800": (1000, 800),
    "aspect 1:8 40x320": (40, 320),
    # patch 0008: 8x8 merge units = four whole windows, computed without padding
    "whole windows 224x224": (224, 224),
}


def _check(rows: np.ndarray, ref) -> tuple[float, float]:
    cos = row_cosines(rows, ref.rows)
    pooled = rows[ref.pool_start : ref.pool_end].mean(0)
    pooled /= np.linalg.norm(pooled)
    return float(cos.min()), float(pooled @ ref.single)


# Patch 0009: eight images of eight different grids: whole windows, padded edge windows, a single
# window, a 1:8 strip; 268 image tokens together, under the server's 1024-token batch bound.
MIXED_GRIDS = [
    (100, 150),
    (224, 224),
    (56, 84),
    (40, 320),
    (150, 70),
    (170, 110),
    (300, 200),
    (120, 400),
]


def _concurrent_image_requests(url: str, images: list[Image.Image], compact: bool = False):
    """One image request per image, all in flight at once (so they can share vision forwards).
    ``compact``: VLP1 bodies (1.75 MB a page, bit-identical rows) instead of f32 JSON, whose
    encoding (~19 MB a page, one after another on the event loop) would stagger the requests
    by about a tiny model's page encode."""
    to_patches = patch_levels if compact else patchify

    async def together():
        prompt = IMAGE_TEMPLATE.format(image="<IMG>")
        return await asyncio.gather(*(backend_rows(url, prompt, [to_patches(im)]) for im in images))

    return run(together())


def test_text_rows(retrieval_server, tiny_reference) -> None:
    ref = tiny_reference.encode_text("The quick brown fox jumps over the lazy dog.", "query")
    got = run(
        backend_rows(
            retrieval_server.spec.url, "Query: The quick brown fox jumps over the lazy dog."
        )
    )
    assert got.rows.shape == ref.rows.shape
    row_min, pooled = _check(got.rows, ref)
    assert row_min >= BOUND and pooled >= BOUND


@pytest.mark.parametrize("name", list(IMAGES))
def test_image_rows(name: str, retrieval_server, tiny_reference) -> None:
    img = _img(*IMAGES[name], seed=len(name))
    ref = tiny_reference.encode_image(img)
    patches, grid = patchify(img)
    got = run(
        backend_rows(
            retrieval_server.spec.url, IMAGE_TEMPLATE.format(image="<IMG>"), [(patches, grid)]
        )
    )
    assert [c.n_rows for c in got.image_chunks] == [int(ref.image_token_mask.sum())]
    row_min, pooled = _check(got.rows, ref)
    print(f"{name}: grid {grid} min row cos {row_min:.7f} pooled {pooled:.7f}")
    assert row_min >= BOUND and pooled >= BOUND


def test_interleaved_and_two_images(retrieval_server, tiny_reference) -> None:
    a, b = _img(60, 90, 1), _img(150, 70, 2)
    ref = tiny_reference.encode_content(["Look at this: ", a, " and also ", b, " — done."])
    prompt = "<|im_start|>user\nLook at this: <IMG> and also <IMG> — done.<|im_end|>\n"
    got = run(backend_rows(retrieval_server.spec.url, prompt, [patchify(a), patchify(b)]))
    assert [c.image_index for c in got.image_chunks] == [0, 1]
    row_min, pooled = _check(got.rows, ref)
    assert row_min >= BOUND and pooled >= BOUND


def test_concurrent_equals_sequential(retrieval_server, tiny_reference) -> None:
    """8 mixed requests on 4 slots at once give the rows they give one by one."""
    url = retrieval_server.spec.url
    imgs = [_img(56 + 28 * i, 84, 10 + i) for i in range(4)]
    reqs = []
    for i in range(8):
        if i % 2:
            reqs.append((IMAGE_TEMPLATE.format(image="<IMG>"), [patchify(imgs[i // 2])]))
        else:
            reqs.append((f"Passage: request number {i} " + "text " * (3 * i), []))
    sequential = [run(backend_rows(url, p, im)) for p, im in reqs]

    async def together():
        return await asyncio.gather(*(backend_rows(url, p, im) for p, im in reqs))

    concurrent = run(together())
    for s, c in zip(sequential, concurrent, strict=True):
        assert s.chunks == c.chunks
        assert row_cosines(s.rows, c.rows).min() >= BOUND


def test_same_size_images_of_concurrent_requests_share_a_vision_forward(
    retrieval_server, tiny_reference
) -> None:
    """Patch 0006: images of one grid from requests in flight at once are encoded in one vision
    forward (the server log says so), and every request still gets its own image's rows."""
    url = retrieval_server.spec.url
    log = retrieval_server.log_path
    imgs = [_img(100, 150, 40 + i) for i in range(8)]  # one grid, eight different images
    start = log.stat().st_size

    got = _concurrent_image_requests(url, imgs)
    batched = vision_forwards(log, start)
    assert batched and max(batched) >= 2, "no two images shared a vision forward"
    for im, g in zip(imgs, got, strict=True):
        row_min, pooled = _check(g.rows, tiny_reference.encode_image(im))
        assert row_min >= BOUND and pooled >= BOUND
    print(f"vision forwards with several images: {batched}")


def test_images_of_different_grids_share_a_vision_forward(retrieval_server, tiny_reference) -> None:
    """Patch 0009: concurrent images of different sizes are encoded as one sequence (per-image
    attention, windows padded to the forward's largest); every request still gets its own
    image's rows within the bound. Every grid here differs, so any shared forward mixes grids."""
    url = retrieval_server.spec.url
    imgs = [_img(w, h, 60 + i) for i, (w, h) in enumerate(MIXED_GRIDS)]
    assert len({patchify(im)[1] for im in imgs}) == len(imgs)
    start = retrieval_server.log_path.stat().st_size

    got = _concurrent_image_requests(url, imgs)
    batched = vision_forwards(retrieval_server.log_path, start)
    assert batched and max(batched) >= 2, "no two images of different grids shared a forward"
    worst = 1.0
    for im, g in zip(imgs, got, strict=True):
        ref = tiny_reference.encode_image(im)
        assert [c.n_rows for c in g.image_chunks] == [int(ref.image_token_mask.sum())]
        row_min, pooled = _check(g.rows, ref)
        worst = min(worst, row_min, pooled)
        assert row_min >= BOUND and pooled >= BOUND
    print(f"vision forwards with several images: {batched}; worst cos {worst:.7f}")


def test_pages_of_different_sizes_share_a_vision_forward(retrieval_server, tiny_reference) -> None:
    """Patch 0009 with serve's default --vision-batch-tokens: concurrent document pages of
    different grids (744-748 image tokens each, two fit the default) are encoded in shared
    forwards, each within the bound. The first page to arrive starts alone; the ones that arrive
    while it is encoded start together."""
    url = retrieval_server.spec.url
    sizes = [(1275, 1650), (1700, 1100), (1650, 1275), (1100, 1700)]
    pages = [_img(w, h, 70 + i) for i, (w, h) in enumerate(sizes)]
    assert len({patchify(p)[1] for p in pages}) == len(pages)
    start = retrieval_server.log_path.stat().st_size

    got = _concurrent_image_requests(url, pages, compact=True)
    batched = vision_forwards(retrieval_server.log_path, start)
    assert batched and max(batched) >= 2, "no two pages shared a vision forward"
    for page, g in zip(pages, got, strict=True):
        row_min, pooled = _check(g.rows, tiny_reference.encode_image(page))
        print(f"page {page.size}: min row cos {row_min:.7f} pooled {pooled:.7f}")
        assert row_min >= BOUND and pooled >= BOUND


def _post(url: str, content: dict) -> httpx.Response:
    return httpx.post(
        url + "/embeddings", json={"content": content, "rows_format": "f32"}, timeout=60
    )


# 20 sizes, 20 different grids: more concurrent images than one forward may hold
MANY_SIZES = [(56 + 28 * (i % 5), 56 + 28 * (i // 5)) for i in range(20)]
MAX_IMAGES_PER_FORWARD = 16  # patch 0009: clip_precomputed_max_images


@pytest.fixture(scope="module")
def wide_server(server_binary, tiny_converted, tmp_path_factory):
    """20 slots, so more images can be ready to encode at once than one forward holds."""
    from .conftest import start_server

    server = start_server(
        server_binary,
        tiny_converted / "text-retrieval-f32.gguf",
        tiny_converted / "mmproj-f32.gguf",
        tmp_path_factory.mktemp("logs"),
        parallel=len(MANY_SIZES),
        ctx=512,
        vision_batch_tokens=VISION_BATCH_TOKENS,
    )
    yield server
    server.stop()


def test_a_vision_forward_holds_at_most_16_images(wide_server, tiny_reference) -> None:
    """Patch 0009: images of different sizes add per-image attention nodes to the vision graph,
    so a forward stops at 16 images; 20 concurrent small images of 20 grids all come back
    within the bound, the server alive."""
    url = wide_server.spec.url
    imgs = [_img(w, h, 90 + i) for i, (w, h) in enumerate(MANY_SIZES)]
    assert len({patchify(im)[1] for im in imgs}) == len(imgs)
    start = wide_server.log_path.stat().st_size

    got = _concurrent_image_requests(url, imgs)
    batched = vision_forwards(wide_server.log_path, start)
    assert batched and max(batched) <= MAX_IMAGES_PER_FORWARD
    assert wide_server.exited() is None
    for im, g in zip(imgs, got, strict=True):
        row_min, pooled = _check(g.rows, tiny_reference.encode_image(im))
        assert row_min >= BOUND and pooled >= BOUND
    print(f"vision forwards with several images: {batched}")


def test_malformed_patch_payloads_are_400(retrieval_server) -> None:
    url = retrieval_server.spec.url
    marker = httpx.get(url + "/props").json()["media_marker"]
    good = np.zeros((16, 1176), np.float32)

    def b64(a: np.ndarray) -> str:
        return base64.b64encode(a.astype("<f4").tobytes()).decode()

    nan = good.copy()
    nan[3, 5] = np.nan
    cases = {
        "wrong N": {"grid_thw": [1, 4, 4], "data": b64(good[:12])},
        "odd grid": {"grid_thw": [1, 3, 5], "data": b64(np.zeros((15, 1176), np.float32))},
        "nan": {"grid_thw": [1, 4, 4], "data": b64(nan)},
        "truncated base64": {"grid_thw": [1, 4, 4], "data": b64(good)[:-7]},
        "not base64": {"grid_thw": [1, 4, 4], "data": "%%%%"},
        "oversized": {"grid_thw": [1, 1000, 1000], "data": b64(good)},
        "t=2": {"grid_thw": [2, 2, 4], "data": b64(good)},
        "missing grid": {"data": b64(good)},
    }
    for name, patch in cases.items():
        r = _post(
            url, {"prompt_string": f"<|im_start|>user\n{marker}x", "multimodal_patches": [patch]}
        )
        assert r.status_code == 400, (name, r.status_code, r.text[:200])
    r = _post(url, {"prompt_string": "no marker here", "multimodal_patches": [cases["nan"]]})
    assert r.status_code == 400
    # still serving
    ok = _post(
        url,
        {
            "prompt_string": f"<|im_start|>user\n{marker}x",
            "multimodal_patches": [{"grid_thw": [1, 4, 4], "data": b64(good)}],
        },
    )
    assert ok.status_code == 200 and retrieval_server.exited() is None


def test_upstream_raw_image_path_side_by_side(retrieval_server, tiny_reference) -> None:
    """Measured, not bounded: upstream's own resize + conv2d path on the same images."""
    url = retrieval_server.spec.url
    marker = httpx.get(url + "/props").json()["media_marker"]
    report = {}
    for name, size in IMAGES.items():
        img = _img(*size, seed=len(name))
        buf = io.BytesIO()
        img.save(buf, "PNG")
        r = httpx.post(
            url + "/embeddings",
            json={
                "content": {
                    "prompt_string": IMAGE_TEMPLATE.format(image=marker),
                    "multimodal_data": [base64.b64encode(buf.getvalue()).decode()],
                },
                "rows_format": "f32",
            },
            timeout=60,
        )
        assert r.status_code == 200, r.text[:300]
        from vlembed.wire import decode_rows

        rows = decode_rows(r.content)
        ref = tiny_reference.encode_image(img)
        if rows.rows.shape != ref.rows.shape:
            report[name] = f"{rows.rows.shape[0]} rows vs reference {ref.rows.shape[0]}"
            continue
        row_min, pooled = _check(rows.rows, ref)
        report[name] = f"min row cos {row_min:.5f}, pooled {pooled:.6f}"
    print("upstream raw-image path:", report)
    assert report


@pytest.fixture(scope="module")
def f16_server(server_binary, tiny_checkpoint, tmp_path_factory):
    from gguf_convert.convert import convert

    from .conftest import start_server

    out = tmp_path_factory.mktemp("f16") / "tiny-f16"
    convert(tiny_checkpoint, out, tasks=["retrieval"], dtype="f16", progress=lambda _: None)
    server = start_server(
        server_binary,
        out / "text-retrieval-f16.gguf",
        out / "mmproj-f16.gguf",
        tmp_path_factory.mktemp("logs"),
    )
    yield server
    server.stop()


def test_f16_gguf_rows(f16_server, tiny_reference) -> None:
    """F16 text GGUF (and f16 mmproj): min per-row and pooled cosine ≥ 0.9995."""
    text = "Half precision keeps the rows close to the reference."
    ref = tiny_reference.encode_text(text, "passage")
    got = run(backend_rows(f16_server.spec.url, "Passage: " + text))
    row_min, pooled = _check(got.rows, ref)
    assert row_min >= 0.9995 and pooled >= 0.9995
    img = _img(100, 150, 7)
    ref = tiny_reference.encode_image(img)
    got = run(
        backend_rows(f16_server.spec.url, IMAGE_TEMPLATE.format(image="<IMG>"), [patchify(img)])
    )
    row_min, pooled = _check(got.rows, ref)
    print(f"f16: image min row cos {row_min:.6f} pooled {pooled:.7f}")
    assert row_min >= 0.9995 and pooled >= 0.9995


@pytest.fixture(scope="module")
def q8_mmproj_server(server_binary, tiny_checkpoint, tmp_path_factory):
    """f32 text with a Q8_0 vision tower: isolates the tower's quantisation error."""
    from gguf_convert.convert import convert

    from .conftest import start_server

    out = tmp_path_factory.mktemp("q8mm") / "tiny-q8mm"
    convert(
        tiny_checkpoint,
        out,
        tasks=["retrieval"],
        dtype="f32",
        mmproj_quants=["Q8_0"],
        progress=lambda _: None,
    )
    server = start_server(
        server_binary,
        out / "text-retrieval-f32.gguf",
        out / "mmproj-Q8_0.gguf",
        tmp_path_factory.mktemp("logs"),
    )
    yield server
    server.stop()


@pytest.mark.parametrize("size", [(100, 150), (1000, 800)])
def test_q8_0_vision_tower_rows(size, q8_mmproj_server, tiny_reference) -> None:
    """Q8_0 mmproj (the flat patch weight stays f32): image rows vs the f32 reference."""
    img = _img(*size, 11)
    ref = tiny_reference.encode_image(img)
    got = run(
        backend_rows(
            q8_mmproj_server.spec.url, IMAGE_TEMPLATE.format(image="<IMG>"), [patchify(img)]
        )
    )
    row_min, pooled = _check(got.rows, ref)
    print(f"Q8_0 mmproj {size}: image min row cos {row_min:.6f} pooled {pooled:.7f}")
    assert row_min >= 0.999 and pooled >= 0.9999
