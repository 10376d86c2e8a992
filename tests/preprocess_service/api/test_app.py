"""API behaviour against a protocol-speaking fake backend (httpx.MockTransport).

These check HTTP semantics only — validation, error shapes, auth, backpressure, fan-out. The
numbers are checked against the reference through the real llama-server in tests/integration.
"""

from __future__ import annotations

import base64
import dataclasses

import numpy as np
import pytest
from fastapi.testclient import TestClient

from preprocess_service.api.app import create_app
from preprocess_service.api.guard import GuardConfig
from tests.preprocess_service.api.fake_backend import MARKER, _png  # noqa: F401


def _post(client: TestClient, **body):
    return client.post("/v1/embeddings", json=body)


def test_text_image_and_content(fake) -> None:
    state, server = fake
    with TestClient(create_app(state)) as client:
        r = _post(
            client,
            input=[
                "hello",
                {"image": _png()},
                [
                    {"type": "text", "text": "see"},
                    {"type": "image_url", "image_url": {"url": _png(30, 90)}},
                ],
            ],
        )
        assert r.status_code == 200, r.text
        data = r.json()
        assert [d["index"] for d in data["data"]] == [0, 1, 2]
        for d in data["data"]:
            assert abs(np.linalg.norm(d["embedding"]) - 1) < 1e-5 and len(d["embedding"]) == 128
        assert data["usage"]["prompt_tokens"] > 2 * 4  # image tokens are counted
        assert server.calls == 3


def test_dimensions_multivector_and_binary(fake) -> None:
    state, _ = fake
    with TestClient(create_app(state)) as client:
        r = _post(client, input="hello", dimensions=64)
        assert len(r.json()["data"][0]["embedding"]) == 64
        r = _post(client, input="hello", dimensions=100)
        assert r.status_code == 400 and r.json()["error"]["param"] == "dimensions"
        r = _post(client, input="hello world", return_multivector=True)
        rows = r.json()["data"][0]["embedding"]
        n = state.service.model.count_tokens("Query: hello world")
        assert n == 4 and len(rows) == n and len(rows[0]) == 32
        f = np.array(_post(client, input="abc").json()["data"][0]["embedding"])
        ub = _post(client, input="abc", embedding_type="ubinary").json()["data"][0]["embedding"]
        assert ub == np.packbits(f > 0).tolist()
        b64 = _post(client, input="abc", encoding_format="base64").json()["data"][0]["embedding"]
        assert np.array_equal(np.frombuffer(base64.b64decode(b64), "<f4"), f.astype(np.float32))


def test_single_vector_with_the_multi_vector_from_one_backend_call(fake) -> None:
    state, server = fake
    items = ["hello world", {"image": _png()}]
    with TestClient(create_app(state)) as client:
        plain = _post(client, input=items).json()["data"]
        assert all("single_embedding" not in d for d in plain)  # OpenAI shape unless asked
        multi = _post(client, input=items, return_multivector=True).json()["data"]
        calls = server.calls
        both = _post(client, input=items, return_multivector=True, return_single_vector=True)
        assert both.status_code == 200, both.text
        assert server.calls == calls + len(items)  # one backend call per item, not two
        for p, m, b in zip(plain, multi, both.json()["data"], strict=True):
            assert b["single_embedding"] == p["embedding"]
            assert b["embedding"] == m["embedding"]
        b64 = _post(
            client,
            input=items[:1],
            return_multivector=True,
            return_single_vector=True,
            encoding_format="base64",
        ).json()["data"][0]["single_embedding"]
        single = np.frombuffer(base64.b64decode(b64), "<f4")
        assert np.array_equal(single, np.asarray(plain[0]["embedding"], dtype=np.float32))
        r = _post(client, input="hello", return_single_vector=True)
        assert r.status_code == 400 and r.json()["error"]["param"] == "return_single_vector"


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"input": ""}, 400, "input"),
        ({"input": []}, 400, "input"),
        ({"input": 5}, 400, None),
        ({"input": "x", "task": "summarise"}, 400, "task"),
        ({"input": [{"image": "not base64!"}]}, 400, "input[0].image"),
        ({"input": [{"image": base64.b64encode(b"garbage").decode()}]}, 400, "input[0].image"),
        ({"input": [{"image": "http://127.0.0.1:1/x.png"}]}, 400, "input[0].image"),
        ({"input": [{"image": "file:///etc/passwd"}]}, 400, "input[0].image"),
        ({"input": "x" * 300_000}, 413, "input"),
        ({"input": "word " * 2000}, 413, "input"),
        ({"input": [{"text": "a", "extra": 1}]}, 400, None),
    ],
)
def test_bad_input_is_a_clean_4xx(fake, body, status: int, param) -> None:
    state, _ = fake
    with TestClient(create_app(state)) as client:
        r = client.post("/v1/embeddings", json=body)
        assert r.status_code == status, r.text
        err = r.json()["error"]
        assert err["message"] and err["type"] == "invalid_request_error"
        if param:
            assert err["param"] == param


def test_truncate(fake) -> None:
    state, _ = fake
    with TestClient(create_app(state)) as client:
        r = _post(client, input="word " * 2000, truncate=True)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] <= 511


def test_api_key(fake) -> None:
    state, _ = fake
    state.guard = GuardConfig(api_key="s3cret")
    with TestClient(create_app(state)) as client:
        assert _post(client, input="x").status_code == 401
        ok = client.post(
            "/v1/embeddings", json={"input": "x"}, headers={"Authorization": "Bearer s3cret"}
        )
        assert ok.status_code == 200
        assert client.get("/health").status_code == 200


def test_overload_is_429_with_retry_after_only_when_busy(fake) -> None:
    state, _ = fake
    with TestClient(create_app(state)) as client:
        assert _post(client, input=["x"] * 9).status_code == 200  # idle: any valid request
        state.service.in_flight = 5  # busy: 5 + 4 > max_queue 8
        r = _post(client, input=["x"] * 4)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert _post(client, input=["x"] * 3).status_code == 200
        state.service.in_flight = 0


def test_dead_backend_is_503_not_a_hang(fake) -> None:
    state, server = fake
    state.service.limits = dataclasses.replace(state.service.limits, retry_wait=0.3)
    with TestClient(create_app(state)) as client:
        server.down = True
        r = _post(client, input="x")
        assert r.status_code == 503 and "retry-after" in r.headers
        assert client.get("/health").status_code == 503
        server.down = False
        import time

        for _ in range(50):
            if client.get("/health").status_code == 200:
                break
            time.sleep(0.05)
        assert _post(client, input="x").status_code == 200


def test_models_metrics_openapi(fake) -> None:
    state, _ = fake
    with TestClient(create_app(state)) as client:
        models = client.get("/v1/models").json()
        assert models["data"][0]["multi_vector_dim"] == 32
        _post(client, input="x")
        text = client.get("/metrics").text
        assert "vlembed_requests_total" in text and "vlembed_queue_depth" in text
        assert "/v1/embeddings" in client.get("/openapi.json").json()["paths"]
