"""The whole stack over HTTP: vlembed serve (real llama-servers, one per task) vs the reference.

Bounds from the service issue: single vector cos ≥ 0.99999 and every multi-vector row ≥ 0.99999
at F32, for text query/passage, image, interleaved, two images, each task, each Matryoshka dim.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import uvicorn
from PIL import Image

from bench.load import mixed_requests
from preprocess_service.api.protocol import EmbeddingRequest
from preprocess_service.serve import build_state
from preprocess_service.settings import parse_settings
from preprocess_service.supervisor import free_port

pytestmark = pytest.mark.integration
BOUND = 0.99999


def _img(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (max(h // 8, 1), max(w // 8, 1), 3), dtype=np.uint8)
    return Image.fromarray(base).resize((w, h), Image.BILINEAR)


def _uri(img: Image.Image) -> str:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class LiveService:
    def __init__(self, model_dir: Path, extra: list[str]) -> None:
        port = free_port()
        args = parse_settings(
            [
                "--model",
                str(model_dir),
                "--port",
                str(port),
                "--parallel",
                "4",
                "--threads",
                "1",
                "--ctx-size",
                "2048",
                *extra,
            ]
        )
        from preprocess_service.api.app import create_app

        self.state = build_state(args)
        self.state.service.limits = dataclasses.replace(self.state.service.limits, retry_wait=20.0)
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            create_app(self.state),
            host="127.0.0.1",
            port=port,
            log_level="warning",
            limit_concurrency=512,
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError("service did not become healthy")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="module")
def live(server_binary, tiny_converted: Path) -> Iterator[LiveService]:
    svc = LiveService(tiny_converted, [])
    yield svc
    svc.stop()


def embed(url: str, **body) -> dict:
    r = httpx.post(url + "/v1/embeddings", json=body, timeout=120)
    assert r.status_code == 200, r.text[:500]
    return r.json()


TEXT = "Where is the invoice total on page three?"
IMG_A, IMG_B = _img(100, 150, 1), _img(200, 84, 2)


def _reference_cases(ref, task: str, role: str):
    ref.set_task(task)
    return {
        "text": ({"text": TEXT}, ref.encode_text(TEXT, role)),
        "image": ({"image": _uri(IMG_A)}, ref.encode_image(IMG_A)),
        "interleaved": (
            [
                {"type": "text", "text": "Chart: "},
                {"type": "image_url", "image_url": {"url": _uri(IMG_A)}},
                {"type": "text", "text": " (source: annual report)"},
            ],
            ref.encode_content(["Chart: ", IMG_A, " (source: annual report)"]),
        ),
        "two images": (
            [
                {"type": "image_url", "image_url": {"url": _uri(IMG_A)}},
                {"type": "image_url", "image_url": {"url": _uri(IMG_B)}},
            ],
            ref.encode_content([IMG_A, IMG_B]),
        ),
    }


TASKS = ["retrieval.query", "retrieval.passage", "text-matching", "code.query", "code.passage"]


@pytest.mark.parametrize("task_name", TASKS)
def test_single_and_multi_vector_parity(live, tiny_reference, task_name: str) -> None:
    from vlembed.tasks import TASKS as TASK_TABLE

    task, role = TASK_TABLE[task_name]
    cases = _reference_cases(tiny_reference, task, role)
    items = [c[0] for c in cases.values()]
    single = embed(live.url, input=items, task=task_name)["data"]
    multi = embed(live.url, input=items, task=task_name, return_multivector=True)["data"]
    for (name, (_, ref)), s, m in zip(cases.items(), single, multi, strict=True):
        got = np.array(s["embedding"], dtype=np.float32)
        assert float(got @ ref.single) >= BOUND, (task_name, name)
        rows = np.array(m["embedding"], dtype=np.float32)
        assert rows.shape == ref.multi.shape, (task_name, name)
        assert float((rows * ref.multi).sum(1).min()) >= BOUND, (task_name, name)
    both = embed(
        live.url,
        input=items,
        task=task_name,
        return_multivector=True,
        return_single_vector=True,
    )["data"]
    for (name, (_, ref)), b in zip(cases.items(), both, strict=True):
        got = np.array(b["single_embedding"], dtype=np.float32)
        assert float(got @ ref.single) >= BOUND, (task_name, name, "both")
        rows = np.array(b["embedding"], dtype=np.float32)
        assert rows.shape == ref.multi.shape, (task_name, name, "both")
        assert float((rows * ref.multi).sum(1).min()) >= BOUND, (task_name, name, "both")
    dims = live.state.service.model.manifest.matryoshka_dims
    for dim in dims:
        data = embed(live.url, input=items, task=task_name, dimensions=dim)["data"]
        for (name, (_, ref)), d in zip(cases.items(), data, strict=True):
            got = np.array(d["embedding"], dtype=np.float32)
            assert got.shape == (dim,) and float(got @ ref.truncated(dim)) >= BOUND, (name, dim)


def test_tasks_differ(live) -> None:
    vecs = [
        np.array(embed(live.url, input=TEXT, task=t)["data"][0]["embedding"])
        for t in ("retrieval.query", "text-matching", "code.query")
    ]
    assert float(vecs[0] @ vecs[1]) < 0.99 and float(vecs[0] @ vecs[2]) < 0.99


def test_binary_equals_packed_signs(live) -> None:
    items = [TEXT, {"image": _uri(IMG_B)}]
    floats = embed(live.url, input=items)["data"]
    for kind in ("binary", "ubinary"):
        packed = embed(live.url, input=items, embedding_type=kind)["data"]
        for f, p in zip(floats, packed, strict=True):
            bits = np.packbits(np.array(f["embedding"]) > 0)
            want = bits if kind == "ubinary" else bits.astype(np.int16) - 128
            assert p["embedding"] == want.tolist()


def test_openai_sdk(live) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=live.url + "/v1", api_key="unused")
    default = client.embeddings.create(model="vlembed", input=[TEXT, "second"])  # base64
    floats = client.embeddings.create(model="vlembed", input=TEXT, encoding_format="float")
    assert len(default.data) == 2 and len(default.data[0].embedding) == 128
    np.testing.assert_allclose(default.data[0].embedding, floats.data[0].embedding, atol=1e-7)
    assert default.usage.prompt_tokens > 0


def test_concurrent_load_equals_sequential(live) -> None:
    """A CI-sized load (the full 32 × 200 run is in bench/load.py): 0 errors, bitwise equal."""
    reqs = mixed_requests(48, seed=3)
    sequential = [embed(live.url, **r)["data"] for r in reqs]
    with ThreadPoolExecutor(16) as pool:
        concurrent = list(pool.map(lambda r: embed(live.url, **r)["data"], reqs))
    assert concurrent == sequential


def test_backend_killed_under_load_is_restarted(live) -> None:
    reqs = mixed_requests(40, seed=4)
    statuses: list[int] = []

    def send(r: dict) -> int:
        try:
            return httpx.post(live.url + "/v1/embeddings", json=r, timeout=90).status_code
        except httpx.HTTPError:
            return -1

    server = next(s for s, task in live.state.managed if task == "retrieval")
    restarts = server.restarts
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(send, r) for r in reqs]
        time.sleep(0.5)
        os.kill(server.proc.pid, signal.SIGKILL)
        statuses = [f.result(timeout=120) for f in futures]
    assert set(statuses) <= {200, 503}, statuses  # clean 503 or success, never a hang or 500
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and httpx.get(live.url + "/health").status_code != 200:
        time.sleep(0.3)
    assert server.restarts == restarts + 1
    assert embed(live.url, input=TEXT)["data"]


def _hangs(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return float(
        next(
            ln.split()[1]
            for ln in text.splitlines()
            if ln.startswith("vlembed_backend_hangs_total")
        )
    )


def test_backend_frozen_under_load_is_killed_and_restarted(live) -> None:
    """A llama-server that is alive but answers nothing (SIGSTOP: what a deadlock or a thrashing
    machine looks like from outside) is killed and restarted. Nothing restarts a live process
    otherwise: every request to it would wait for the request timeout, for ever after."""
    server = next(s for s, task in live.state.managed if task == "retrieval")
    restarts, hangs = server.restarts, _hangs(live.url)
    reqs = [
        r
        for r in mixed_requests(40, seed=5)
        if r.get("task", "retrieval.query").startswith("retrieval")
    ]

    def send(r: dict) -> int:
        try:
            return httpx.post(live.url + "/v1/embeddings", json=r, timeout=90).status_code
        except httpx.HTTPError:
            return -1

    live.state.hang_timeout = 8.0  # well clear of a slow but answering /health on 2 busy cores
    try:
        with ThreadPoolExecutor(4) as pool:
            futures = [pool.submit(send, r) for r in reqs[:12]]
            time.sleep(0.3)
            frozen = server.proc
            os.kill(frozen.pid, signal.SIGSTOP)
            statuses = [f.result(timeout=120) for f in futures]
    finally:
        live.state.hang_timeout = 60.0
    assert frozen.poll() == -signal.SIGKILL  # killed as it was, stopped
    assert set(statuses) <= {200, 503}, statuses  # every request ended, none with a 5xx of its own
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and httpx.get(live.url + "/health").status_code != 200:
        time.sleep(0.3)
    assert server.restarts == restarts + 1 and server.proc is not frozen
    assert _hangs(live.url) == hangs + 1
    assert embed(live.url, input=TEXT, task="retrieval.query")["data"]


def _bad_requests(n: int, seed: int) -> list[object]:
    rng = random.Random(seed)
    png = _uri(_img(40, 40, 0))
    raw = base64.b64decode(png.split(",", 1)[1])
    bomb = io.BytesIO()
    Image.new("1", (20000, 20000)).save(bomb, "PNG")
    junk_images = [
        "data:image/png;base64," + base64.b64encode(raw[: len(raw) // 2]).decode(),
        "data:image/png;base64," + base64.b64encode(bomb.getvalue()).decode(),
        "data:image/png;base64,!!!!",
        base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 50).decode(),
        "",
        "http://localhost:1/x.png",
        "file:///etc/shadow",
        "data:image/png;base64," + base64.b64encode(_png_of(1, 300)).decode(),
    ]
    values = [
        None,
        0,
        -1,
        1.5,
        True,
        "",
        "x" * 1000,
        [],
        {},
        [None],
        {"a": 1},
        "🦙" * 10,
        2**40,
        [1, 2, 3],
    ]
    marker_like = ["<__media__>", "x\u0000image\u0000y", "<|vision_start|>", "\ud800", "a\udfff"]
    out: list[object] = []
    for i in range(n):
        k = i % 13
        if k == 0:
            out.append({"input": rng.choice(values)})
        elif k == 1:
            out.append({"input": [{"image": rng.choice(junk_images)}]})
        elif k == 2:
            out.append({"input": "ok", "task": rng.choice(values + ["retrieval", "qa"])})
        elif k == 3:
            out.append({"input": "ok", "dimensions": rng.choice([0, 3, 100, 4096, -5, "64"])})
        elif k == 4:
            out.append(
                {"input": "ok", "embedding_type": rng.choice(["int4", "", 7, None, "BINARY"])}
            )
        elif k == 5:
            out.append({"input": "word " * rng.choice([3000, 50_000]) + "end"})
        elif k == 6:
            out.append(
                {
                    "input": [
                        [
                            {
                                "type": rng.choice(["text", "image_url", "video"]),
                                "text": rng.choice(values),
                            }
                        ]
                    ]
                }
            )
        elif k == 7:
            out.append(rng.choice(values))
        elif k == 8:
            out.append({"input": [{"text": ""}] * rng.randrange(1, 4)})
        elif k == 9:
            out.append({"input": ["x"] * rng.choice([2049, 5000])})
        elif k == 10:  # client text that tries to become an image slot, or is not Unicode
            text = rng.choice(marker_like)
            item = rng.choice(
                [text, [{"type": "text", "text": text}, {"type": "image_url", "image_url": png}]]
            )
            out.append({"input": ["fine", item]})
        elif k == 11:
            out.append(
                {
                    "input": "ok",
                    rng.choice(["late_chunking", "truncate", "return_multivector"]): rng.choice(
                        values
                    ),
                }
            )
        else:
            out.append({"input": [[{"type": "image_url", "image_url": rng.choice(junk_images)}]]})
    return out


def _png_of(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h)).save(buf, "PNG")
    return buf.getvalue()


def test_bad_requests_never_5xx(live) -> None:
    bad = _bad_requests(1300, seed=5)
    with httpx.Client(timeout=60) as client, ThreadPoolExecutor(8) as pool:
        # ASCII JSON, so lone surrogates travel as the escapes a client would send
        answers = list(
            pool.map(
                lambda body: client.post(
                    live.url + "/v1/embeddings",
                    content=json.dumps(body).encode(),
                    headers={"content-type": "application/json"},
                ),
                bad,
            )
        )
        answers.append(client.post(live.url + "/v1/embeddings", content=b"{not json"))
    statuses = [r.status_code for r in answers]
    over = [s for s in statuses if s >= 500]
    assert not over, sorted(set(statuses))
    for body, r in zip(bad, answers, strict=False):
        if r.status_code >= 400:  # the OpenAI error shape, param the offending field or item
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["code"] == r.status_code
            root = (err["param"] or "").split("[")[0].split(".")[0]
            assert not root or root in EmbeddingRequest.model_fields, (body, err)
    assert all(s.exited() is None for s, _ in live.state.managed)
    assert embed(live.url, input=TEXT)["data"]
