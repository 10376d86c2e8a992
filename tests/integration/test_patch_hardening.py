"""Hardening of the patch series, checked on the real patched llama-server.

* the converter keeps ``v.patch_embd.weight_flat`` in F32 in f16/bf16 mmproj files (the patch
  matmul then sees the exact kernel), and the server encodes such a file within the parity bound;
* an mmproj whose spatial merge is not 2x2 (the Qwen2.5-VL graph hard-codes it) refuses
  precomputed patches instead of encoding them wrongly;
* ``ServerSpec.image_max_tokens`` reaches llama-server: a grid over the budget is a 400, the
  server keeps serving;
* images are batched in one vision forward only as precomputed patches of one grid: raw images
  of one size from concurrent requests, and two same-grid images of one prompt, give the rows
  they give alone.
"""

from __future__ import annotations

import asyncio
import base64
import io
import struct
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from preprocess_service.image import patchify
from preprocess_service.supervisor import ManagedServer, ServerSpec, free_port
from vlembed.tasks import IMAGE_TEMPLATE

from .conftest import backend_rows, row_cosines, run, start_spec, vision_forwards

pytestmark = pytest.mark.integration
BOUND = 0.99999
FLAT = "v.patch_embd.weight_flat"


def _img(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (max(h // 8, 1), max(w // 8, 1), 3), dtype=np.uint8)
    return Image.fromarray(base).resize((w, h), Image.BILINEAR)


def _check(rows: np.ndarray, ref) -> tuple[float, float]:
    cos = row_cosines(rows, ref.rows)
    pooled = rows[ref.pool_start : ref.pool_end].mean(0)
    pooled /= np.linalg.norm(pooled)
    return float(cos.min()), float(pooled @ ref.single)


def _spec(binary: Path, model: Path, mmproj: Path, **kw) -> ServerSpec:
    kw.setdefault("parallel", 4)
    kw.setdefault("ctx_per_slot", 2048)
    return ServerSpec(binary=binary, model=model, mmproj=mmproj, port=free_port(), threads=2, **kw)


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a, "<f4").tobytes()).decode()


def _post(url: str, content: dict) -> httpx.Response:
    return httpx.post(
        url + "/embeddings", json={"content": content, "rows_format": "f32"}, timeout=120
    )


def _rows(body: bytes) -> np.ndarray:
    """The f32 rows of a VLR1 body (see docs/backend-protocol.md)."""
    magic, n_rows, n_embd, dtype, n_chunks = struct.unpack_from("<4sIIII", body)
    assert magic == b"VLR1" and dtype == 0
    off = 20 + 16 * n_chunks
    return np.frombuffer(body, "<f4", n_rows * n_embd, off).reshape(n_rows, n_embd)


def _image_rows(body: bytes) -> list[int]:
    """Rows per image chunk of a VLR1 body."""
    n_chunks = struct.unpack_from("<I", body, 16)[0]
    chunks = [struct.unpack_from("<IIIi", body, 20 + 16 * i) for i in range(n_chunks)]
    return [n for kind, _, n, _ in chunks if kind == 1]


# --- weight_flat stays F32 --------------------------------------------------------------------


@pytest.fixture(scope="module")
def half_converted(tiny_checkpoint: Path, tmp_path_factory) -> dict[str, Path]:
    from gguf_convert.convert import convert

    out = {}
    for dtype in ("f16", "bf16"):
        d = tmp_path_factory.mktemp(dtype) / f"tiny-{dtype}"
        convert(tiny_checkpoint, d, tasks=["retrieval"], dtype=dtype, progress=lambda _: None)
        out[dtype] = d
    return out


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_mmproj_keeps_the_flat_patch_weight_f32(
    dtype: str, half_converted, tiny_reference
) -> None:
    from gguf_convert.writer import load_gguf

    gguf = load_gguf()
    reader = gguf.GGUFReader(half_converted[dtype] / f"mmproj-{dtype}.gguf")
    tensors = {t.name: t for t in reader.tensors}
    flat = tensors[FLAT]
    assert flat.tensor_type == gguf.GGMLQuantizationType.F32, flat.tensor_type.name
    conv = tiny_reference.model.visual.patch_embed.proj.weight.detach().float().numpy()
    assert np.array_equal(
        np.asarray(flat.data).reshape(conv.shape[0], 1176), conv.reshape(-1, 1176)
    )
    # the other matrices still take the file type (the conv2d halves of the raw-image path)
    want = {"f16": gguf.GGMLQuantizationType.F16, "bf16": gguf.GGMLQuantizationType.BF16}[dtype]
    assert tensors["v.patch_embd.weight"].tensor_type == want


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_mmproj_image_rows(
    dtype: str, half_converted, tiny_converted, server_binary, tiny_reference, tmp_path
) -> None:
    """f32 text + f16/bf16 tower with the F32 flat weight: image rows vs the f32 reference
    (the tower's own rounding only; the Q8_0 tower test uses the same bounds)."""
    spec = _spec(
        server_binary,
        tiny_converted / "text-retrieval-f32.gguf",
        half_converted[dtype] / f"mmproj-{dtype}.gguf",
        parallel=1,
    )
    server = start_spec(spec, tmp_path)
    try:
        img = _img(100, 150, 7)
        ref = tiny_reference.encode_image(img)
        got = run(backend_rows(spec.url, IMAGE_TEMPLATE.format(image="<IMG>"), [patchify(img)]))
        row_min, pooled = _check(got.rows, ref)
        print(f"{dtype} mmproj: image min row cos {row_min:.7f} pooled {pooled:.7f}")
        assert row_min >= 0.999 and pooled >= 0.9999
    finally:
        server.stop()


# --- spatial merge other than 2x2 -------------------------------------------------------------


def _copy_gguf_with(src: Path, dst: Path, **u32: int) -> None:
    """A copy of a GGUF file with some uint32 keys set."""
    from gguf_convert.writer import load_gguf

    gguf = load_gguf()
    reader = gguf.GGUFReader(src)
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(dst, arch)
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name in u32:
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub)
    for key, value in u32.items():
        writer.add_uint32(key, value)
    for t in reader.tensors:
        writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for t in reader.tensors:
        writer.write_tensor_data(t.data)
    writer.close()


def test_spatial_merge_other_than_2_refuses_precomputed_patches(
    tiny_converted, server_binary, tmp_path
) -> None:
    mmproj = tmp_path / "mmproj-merge1.gguf"
    _copy_gguf_with(
        tiny_converted / "mmproj-f32.gguf", mmproj, **{"clip.vision.spatial_merge_size": 1}
    )
    spec = _spec(server_binary, tiny_converted / "text-retrieval-f32.gguf", mmproj, parallel=1)
    server = start_spec(spec, tmp_path)
    try:
        caps = httpx.get(spec.url + "/props").json()["vlembed"]
        assert caps["precomputed_patches"] is False, caps
        marker = httpx.get(spec.url + "/props").json()["media_marker"]
        r = _post(
            spec.url,
            {
                "prompt_string": f"<|im_start|>user\n{marker}x",
                "multimodal_patches": [
                    {"grid_thw": [1, 4, 4], "data": _b64(np.zeros((16, 1176), np.float32))}
                ],
            },
        )
        assert r.status_code == 400, (r.status_code, r.text[:300])
        assert "precomputed patches" in r.text
        assert server.exited() is None
    finally:
        server.stop()


# --- --image-max-tokens -----------------------------------------------------------------------


def test_image_max_tokens_refuses_a_larger_grid_with_400(
    tiny_converted, server_binary, tmp_path
) -> None:
    spec = _spec(
        server_binary,
        tiny_converted / "text-retrieval-f32.gguf",
        tiny_converted / "mmproj-f32.gguf",
        parallel=1,
        image_max_tokens=64,  # 64 merged tokens = 256 patches
    )
    assert spec.argv()[spec.argv().index("--image-max-tokens") + 1] == "64"
    server = start_spec(spec, tmp_path)
    try:
        props = httpx.get(spec.url + "/props").json()
        assert props["vlembed"]["max_patches"] == 256, props["vlembed"]
        marker = props["media_marker"]

        def send(h: int, w: int) -> httpx.Response:
            rng = np.random.default_rng(h * w)
            data = rng.standard_normal((h * w, 1176)).astype(np.float32)
            return _post(
                spec.url,
                {
                    "prompt_string": f"<|im_start|>user\n{marker}x",
                    "multimodal_patches": [{"grid_thw": [1, h, w], "data": _b64(data)}],
                },
            )

        over = send(16, 18)  # 288 patches
        assert over.status_code == 400, (over.status_code, over.text[:300])
        assert "256" in over.text
        big = send(64, 64)  # 4096 patches: would have been admitted by the default limit
        assert big.status_code == 400, (big.status_code, big.text[:300])
        ok = send(16, 16)  # exactly the budget
        assert ok.status_code == 200, ok.text[:300]
        assert _image_rows(ok.content) == [64]
        assert server.exited() is None
    finally:
        server.stop()


# --- only precomputed patches of one grid share a vision forward ------------------------------


@pytest.fixture(scope="module")
def batching_server(server_binary, tiny_converted, tmp_path_factory) -> Iterator[ManagedServer]:
    spec = _spec(
        server_binary,
        tiny_converted / "text-retrieval-f32.gguf",
        tiny_converted / "mmproj-f32.gguf",
        vision_batch_tokens=1024,
    )
    server = start_spec(spec, tmp_path_factory.mktemp("logs"))
    yield server
    server.stop()


def test_raw_images_of_one_size_are_encoded_one_at_a_time(batching_server) -> None:
    """Raw (llama.cpp-preprocessed) images of one size from concurrent requests: the Qwen-VL
    batch dimension is the temporal one for them, so each is encoded alone and every request
    gets the rows it gets on its own."""
    url = batching_server.spec.url
    marker = httpx.get(url + "/props").json()["media_marker"]

    def png(img: Image.Image) -> str:
        buf = io.BytesIO()
        img.save(buf, "PNG")
        return base64.b64encode(buf.getvalue()).decode()

    content = [
        {"prompt_string": IMAGE_TEMPLATE.format(image=marker), "multimodal_data": [png(im)]}
        for im in (_img(112, 112, 60 + i) for i in range(4))
    ]
    alone = []
    for c in content:
        r = _post(url, c)
        assert r.status_code == 200, r.text[:300]
        alone.append(_rows(r.content))
    start = batching_server.log_path.stat().st_size

    async def together():
        async with httpx.AsyncClient(timeout=120) as client:
            return await asyncio.gather(
                *(
                    client.post(url + "/embeddings", json={"content": c, "rows_format": "f32"})
                    for c in content
                )
            )

    for a, r in zip(alone, run(together()), strict=True):
        assert r.status_code == 200, r.text[:300]
        assert row_cosines(a, _rows(r.content)).min() >= BOUND
    assert vision_forwards(batching_server.log_path, start) == []
    assert batching_server.exited() is None


def test_two_same_grid_images_of_one_prompt(batching_server, tiny_reference) -> None:
    """Two different images of one grid in one prompt go through one batched encode (the
    slot's own mtmd batch); each keeps its own rows."""
    a, b = _img(100, 150, 21), _img(100, 150, 22)
    assert patchify(a)[1] == patchify(b)[1]
    ref = tiny_reference.encode_content(["First ", a, " then ", b, " end."])
    prompt = "<|im_start|>user\nFirst <IMG> then <IMG> end.<|im_end|>\n"
    got = run(backend_rows(batching_server.spec.url, prompt, [patchify(a), patchify(b)]))
    assert [c.image_index for c in got.image_chunks] == [0, 1]
    row_min, pooled = _check(got.rows, ref)
    print(f"two same-grid images: min row cos {row_min:.7f} pooled {pooled:.7f}")
    assert row_min >= BOUND and pooled >= BOUND
