"""Hardening probes: each a defect once reproduced against the service, now a regression test.

The service runs under real uvicorn on loopback (so body streaming, timeouts and concurrency are
the server's own), with the protocol-speaking fake llama-server of ``test_app``.
"""

from __future__ import annotations

import base64
import contextlib
import io
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi.testclient import TestClient
from PIL import Image

from preprocess_service import image as image_mod
from preprocess_service.api.app import create_app
from preprocess_service.api.guard import GuardConfig
from preprocess_service.supervisor import free_port
from tests.preprocess_service.api.fake_backend import MARKER, FakeLlamaServer, _png


def _shape_ok(r: httpx.Response, status: int, param: str | None = "any") -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"], err
    assert err["code"] == status
    if param != "any":
        assert err["param"] == param, err
    return err


@contextlib.contextmanager
def _serving(state) -> Iterator[str]:
    """The app under real uvicorn on a free loopback port, for the duration of the block."""
    port = free_port()
    config = uvicorn.Config(create_app(state), host="127.0.0.1", port=port, log_level="warning")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    try:
        yield url
    finally:
        srv.should_exit = True
        thread.join(10)


@pytest.fixture
def live(fake) -> Iterator[tuple[str, object, FakeLlamaServer]]:
    state, server = fake
    state.guard = GuardConfig(max_body_bytes=32 << 20, body_timeout=1.0)
    with _serving(state) as url:
        yield url, state, server


def _big_png(side: int, height: int | None = None) -> str:
    buf = io.BytesIO()
    rng = np.random.default_rng(side)
    pixels = rng.integers(0, 255, (height or side, side, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buf, "PNG", compress_level=0)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def test_truncate_flood_does_not_stall_health(live) -> None:
    url, _, _ = live
    body = {"input": ["word " * 4_000_000], "truncate": True}
    with ThreadPoolExecutor(1) as pool:
        future = pool.submit(httpx.post, url + "/v1/embeddings", json=body, timeout=120)
        time.sleep(0.3)
        for _ in range(5):  # a stalled event loop would time these out
            assert httpx.get(url + "/health", timeout=5).status_code == 200
        r = future.result()
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] <= 511


def _raw(url: str, head: bytes, body: bytes = b"", wait: float = 5.0) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as s:
        s.sendall(head + body)
        answer = b""
        while not answer.rstrip().endswith(b"}"):  # the JSON body of the answer, complete
            chunk = s.recv(65536)
            if not chunk:
                break
            answer += chunk
        return answer


def test_key_is_checked_before_a_chunked_body_is_read(fake) -> None:
    state, _ = fake
    state.guard = GuardConfig(api_key="k")
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
        b"Content-Type: application/json\r\n\r\n"
    )
    with _serving(state) as url:
        answer = _raw(url, head)  # no body sent at all: the answer comes from the headers alone
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b'"authentication_error"' in answer


def test_chunked_body_over_the_limit_is_cut_off(live) -> None:
    """No Content-Length: the body is counted as it streams and refused at the limit."""
    url, _, _ = live

    def chunks() -> Iterator[bytes]:
        yield b'{"input": ["'
        for _ in range(64):  # 64 MiB; the limit is 32 MiB
            yield b"a" * (1 << 20)
        yield b'"]}'

    r = httpx.post(url + "/v1/embeddings", content=chunks(), timeout=30)
    err = _shape_ok(r, 413, None)
    assert "over the 33554432 byte limit" in err["message"]


def test_a_stalled_body_gets_408(live) -> None:
    url, _, _ = live
    head = (
        b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
        b"Content-Type: application/json\r\n\r\n"
    )
    answer = _raw(url, head, b'{"input":', wait=10)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_one_bad_item_stops_the_others(live, monkeypatch) -> None:
    url, _, server = live
    corrupt = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\nnope").decode()
    big = _big_png(1120, 280)  # 400 image tokens: each fits the 512-token context
    r = httpx.post(
        url + "/v1/embeddings", json={"input": [{"image": corrupt}] + [{"image": big}] * 12}
    )
    _shape_ok(r, 400, "input[0].image")
    answered = server.calls  # items that were already through before the failure (load-dependent)
    time.sleep(1.0)
    assert server.calls == answered < 12  # nothing orphaned kept going after the answer


def test_image_budget_is_checked_on_headers_before_decoding(fake, monkeypatch) -> None:
    state, _ = fake
    decoded: list[int] = []
    real = image_mod.load_rgb
    monkeypatch.setattr(image_mod, "load_rgb", lambda im: decoded.append(1) or real(im))
    parts = [{"type": "image_url", "image_url": {"url": _big_png(900)}} for _ in range(3)]
    with TestClient(create_app(state)) as client:  # n_ctx 512 < 3 x 256 image tokens
        r = client.post("/v1/embeddings", json={"input": [parts]})
    _shape_ok(r, 413, "input[0]")
    assert decoded == []


def test_client_text_cannot_inject_an_image(fake) -> None:
    state, server = fake
    with TestClient(create_app(state)) as client:
        ok = client.post("/v1/embeddings", json={"input": ["x\u0000image\u0000y"]})
        assert ok.status_code == 200, ok.text
        r = client.post("/v1/embeddings", json={"input": ["ok", f"a {MARKER} b"]})
        _shape_ok(r, 400, "input[1]")
        content = [[{"type": "text", "text": MARKER}, {"type": "image_url", "image_url": _png()}]]
        r = client.post("/v1/embeddings", json={"input": content})
        err = _shape_ok(r, 400, "input[0]")
        assert "backend" not in err["message"]


def test_lone_surrogate_is_a_400_with_the_item(fake) -> None:
    state, _ = fake
    with TestClient(create_app(state)) as client:
        body = b'{"input": ["fine", "\\ud800"]}'
        r = client.post(
            "/v1/embeddings", content=body, headers={"content-type": "application/json"}
        )
        _shape_ok(r, 400, "input[1]")


def test_2048_items_on_an_idle_server(fake) -> None:
    state, server = fake
    with TestClient(create_app(state)) as client:
        r = client.post("/v1/embeddings", json={"input": [f"t {i}" for i in range(2048)]})
        assert r.status_code == 200 and len(r.json()["data"]) == 2048
        r = client.post("/v1/embeddings", json={"input": ["t"] * 2049})
        _shape_ok(r, 400, "input")


def test_every_route_but_health_needs_the_key(fake) -> None:
    state, _ = fake
    state.guard = GuardConfig(api_key="k")
    with TestClient(create_app(state)) as client:
        for path in ("/metrics", "/docs", "/openapi.json", "/redoc", "/v1/models"):
            _shape_ok(client.get(path), 401)
            assert client.get(path, headers={"Authorization": "Bearer k"}).status_code == 200
        assert client.get("/health").status_code == 200


def test_framework_errors_are_in_the_openai_shape(fake) -> None:
    state, _ = fake
    with TestClient(create_app(state)) as client:
        _shape_ok(client.get("/nope"), 404)
        _shape_ok(client.get("/v1/embeddings"), 405)
        err = _shape_ok(
            client.post(
                "/v1/embeddings", content=b"{not json", headers={"content-type": "application/json"}
            ),
            400,
        )
        assert err["param"] is None
        deep = b'{"input": ' + b"[" * 5000 + b"]" * 5000 + b"}"
        _shape_ok(
            client.post(
                "/v1/embeddings", content=deep, headers={"content-type": "application/json"}
            ),
            400,
        )


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": ["ok", 5]}, "input[1]"),
        ({"input": ["ok", ""]}, "input[1]"),
        ({"input": [{"text": "  "}]}, "input[0].text"),
        (
            {"input": ["ok", {"content": [{"type": "image_url", "image_url": "!!"}]}]},
            "input[1].content[0].image_url",
        ),
        (
            {"input": [[{"type": "text", "text": "a"}, {"type": "image_url", "image_url": ""}]]},
            "input[0][1].image_url",
        ),
        ({"input": "x", "late_chunking": True}, "late_chunking"),
    ],
)
def test_param_is_the_path_of_the_offending_item(fake, body, param: str) -> None:
    state, _ = fake
    with TestClient(create_app(state)) as client:
        _shape_ok(client.post("/v1/embeddings", json=body), 400, param)


@pytest.mark.parametrize(
    "mode, status",
    [("status500", 502), ("status400", 400), ("rows", 502), ("slow", 504)],
)
def test_backend_failures_map_to_their_status(fake, mode: str, status: int) -> None:
    state, server = fake
    server.mode = mode
    with TestClient(create_app(state)) as client:
        r = client.post("/v1/embeddings", json={"input": ["ok", "fine"]})
        err = _shape_ok(r, status)
        if status == 400:
            assert err["param"] in ("input[0]", "input[1]")


def test_binary_and_multivector_over_base64(fake) -> None:
    state, _ = fake
    with TestClient(create_app(state)) as client:
        f = client.post("/v1/embeddings", json={"input": "abc"}).json()["data"][0]["embedding"]
        body = {"input": "abc", "embedding_type": "ubinary", "encoding_format": "base64"}
        b = client.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
        assert list(base64.b64decode(b)) == np.packbits(np.array(f) > 0).tolist()
        body = {"input": "abc d", "return_multivector": True, "encoding_format": "base64"}
        m = client.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
        rows = np.frombuffer(base64.b64decode(m), "<f4").reshape(-1, 32)
        assert np.allclose(np.linalg.norm(rows, axis=1), 1, atol=1e-5)


def test_model_by_id(fake) -> None:
    state, _ = fake
    with TestClient(create_app(state)) as client:
        name = client.get("/v1/models").json()["data"][0]["id"]
        assert client.get(f"/v1/models/{name}").json()["id"] == name
        _shape_ok(client.get("/v1/models/other"), 404)


def test_openai_sdk_binary(live) -> None:
    openai = pytest.importorskip("openai")
    url, _, _ = live
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
    floats = client.embeddings.create(model="m", input=["abc"], encoding_format="float")
    out = client.embeddings.create(
        model="m", input=["abc"], encoding_format="float", extra_body={"embedding_type": "binary"}
    )
    want = np.packbits(np.array(floats.data[0].embedding) > 0).astype(np.int16) - 128
    assert out.data[0].embedding == want.tolist()
