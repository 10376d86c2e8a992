"""A protocol-speaking stand-in for the patched llama-server, and a service built on it.

It answers like the real server (one row per token, a chunk map, the media marker from
``/props``) with rows seeded by the prompt, so API tests check HTTP semantics without a model.
The numbers are checked against the reference through the real llama-server in
tests/integration.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from preprocess_service.api.lifecycle import AppState
from preprocess_service.backend import Backend, BackendPool
from preprocess_service.embedder import EmbeddingService, QueueLimits
from preprocess_service.model import load_served_model
from vlembed.wire import (
    CHUNK_IMAGE,
    CHUNK_TEXT,
    PATCHES_MAGIC,
    Chunk,
    decode_patches_body,
    encode_rows,
)

MARKER = "<__fake_marker__>"


class FakeLlamaServer:
    """Answers like the patched llama-server: one row per token, rows seeded by the prompt."""

    def __init__(self, model, n_ctx: int = 512) -> None:
        self.model = model
        self.n_ctx = n_ctx
        self.calls = 0
        self.down = False
        self.mode: str | None = None  # "status500", "status400", "rows", "slow": failure modes

    def handler(self, request: httpx.Request) -> httpx.Response:
        if self.down:
            raise httpx.ConnectError("refused", request=request)
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})
        if request.url.path == "/props":
            return httpx.Response(
                200,
                json={
                    "media_marker": MARKER,
                    "default_generation_settings": {"n_ctx": self.n_ctx},
                    "vlembed": {
                        "precomputed_patches": True,
                        "patch_bodies": ["json_f32", "vlp1_u8"],
                    },
                },
            )
        self.calls += 1
        if self.mode == "status500":
            return httpx.Response(500, json={"error": {"message": "boom"}})
        if self.mode == "status400":
            return httpx.Response(400, json={"error": {"message": "bad patches"}})
        if self.mode == "slow":
            raise httpx.ReadTimeout("slow", request=request)
        if request.content.startswith(PATCHES_MAGIC):
            body, _ = decode_patches_body(request.content)
        else:
            body = json.loads(request.content)
        content = body["content"]
        pieces = content["prompt_string"].split(MARKER)
        images = content.get("multimodal_patches", [])
        assert len(pieces) == len(images) + 1
        chunks, n = [], 0
        for i, piece in enumerate(pieces):
            text = piece
            if i > 0:
                text = "<|vision_end|>" + text
            if i < len(images):
                text = text + "<|vision_start|>"
            k = self.model.count_tokens(text)
            chunks.append(Chunk(CHUNK_TEXT, n, k, -1))
            n += k
            if i < len(images):
                t, h, w = images[i]["grid_thw"]
                k = t * h * w // 4
                chunks.append(Chunk(CHUNK_IMAGE, n, k, i))
                n += k
        chunks = [c for c in chunks if c.n_rows]
        if self.mode == "rows":
            n, chunks = (
                n + 1,
                chunks[:-1]
                + [
                    Chunk(
                        chunks[-1].kind,
                        chunks[-1].first_row,
                        chunks[-1].n_rows + 1,
                        chunks[-1].image_index,
                    )
                ],
            )
        seed = abs(hash(content["prompt_string"])) % (2**32)
        rows = np.random.default_rng(seed).standard_normal((n, 128)).astype(np.float32)
        return httpx.Response(200, content=encode_rows(rows, chunks))


def _png(w: int = 64, h: int = 48) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (200, 10, 10)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def make_fake(tiny_converted: Path) -> tuple[AppState, FakeLlamaServer]:
    model = load_served_model(tiny_converted)
    server = FakeLlamaServer(model)
    transport = httpx.MockTransport(server.handler)
    pools = {
        t: BackendPool(t, [Backend(f"http://fake-{t}", t, httpx.AsyncClient(transport=transport))])
        for t in model.manifest.tasks
    }
    service = EmbeddingService(model=model, pools=pools, limits=QueueLimits(max_queue=8))
    state = AppState(service=service, monitor_interval=0.05)
    return state, server
