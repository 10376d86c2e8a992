"""The HTTP backend against ``httpx.MockTransport``: no server, no network."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable

import httpx
import numpy as np
import pytest
from PIL import Image

from vlembed.client import Client, image_data_uri
from vlembed.errors import ServiceError

MODELS = {
    "object": "list",
    "data": [
        {
            "id": "jina-v4-f16",
            "object": "model",
            "owned_by": "vlembed",
            "tasks": ["retrieval", "text-matching", "code"],
            "dimensions": [128, 256, 512, 1024, 2048],
            "multi_vector_dim": 128,
        }
    ],
}


def _vector(item: dict, multivector: bool) -> list:
    """A deterministic fake embedding that depends on the item."""
    seed = len(item.get("text", item.get("image", "")))
    rng = np.random.default_rng(seed)
    if multivector:
        return rng.standard_normal((3, 4)).tolist()
    return rng.standard_normal(4).tolist()


class Server:
    """A scripted service: answers /v1/models and /v1/embeddings, records requests."""

    def __init__(self, script: list[Callable[[httpx.Request], httpx.Response]] | None = None):
        self.script = list(script or [])
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json=MODELS)
        if self.script:
            return self.script.pop(0)(request)
        return embeddings_ok(request)

    def embedding_requests(self) -> list[dict]:
        return [json.loads(r.content) for r in self.requests if r.url.path == "/v1/embeddings"]


def embeddings_ok(request: httpx.Request) -> httpx.Response:
    body = json.loads(request.content)
    data = [
        {"index": i, "object": "embedding", "embedding": _vector(item, body["return_multivector"])}
        for i, item in enumerate(body["input"])
    ]
    data.reverse()  # indices, not order, define the mapping
    return httpx.Response(200, json={"data": data, "usage": {}})


def backend(server: Server, sleeps: list[float] | None = None, **kw) -> Client:
    record = sleeps if sleeps is not None else []
    return Client(
        "http://svc:8080/", transport=httpx.MockTransport(server), sleep=record.append, **kw
    )


def test_startup_checks_models_and_names_the_model() -> None:
    server = Server()
    b = backend(server, api_key="sekret")
    assert b.name == "jina-v4-f16"
    assert (b.dim, b.multi_dim, b.revision) == (2048, 128, None)
    assert [r.url.path for r in server.requests] == ["/v1/models"]
    assert server.requests[0].headers["authorization"] == "Bearer sekret"
    assert "authorization" not in backend(Server())._client.headers
    with pytest.raises(ServiceError, match="does not serve model 'other'"):
        backend(Server(), model="other")


def test_startup_fails_on_empty_model_list() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"data": []})

    with pytest.raises(ServiceError, match="lists no model"):
        Client("http://svc", transport=httpx.MockTransport(handler))


def test_request_shape_order_and_image_pixels() -> None:
    server = Server()
    b = backend(server, max_items=2)
    image = Image.fromarray(np.arange(5 * 7 * 3, dtype=np.uint8).reshape(5, 7, 3))
    items = ["first", image, "third text"]
    out = b.embed(items, task="retrieval.passage", multivector=False, dimensions=128)
    assert [v.shape for v in out] == [(4,), (4,), (4,)]
    sent = server.embedding_requests()
    assert len(sent) == 2  # max_items=2
    assert sent[0]["task"] == "retrieval.passage"
    assert sent[0]["return_multivector"] is False
    assert sent[0]["dimensions"] == 128
    assert sent[0]["embedding_type"] == "float"
    assert sent[0]["model"] == "jina-v4-f16"
    assert sent[0]["input"][0] == {"text": "first"}
    uri = sent[0]["input"][1]["image"]
    assert uri.startswith("data:image/png;base64,")
    decoded = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    assert np.array_equal(np.asarray(decoded.convert("RGB")), np.asarray(image))
    # results follow the response indices, not the order of the data list
    np.testing.assert_allclose(out[2], _vector({"text": "third text"}, False), rtol=1e-6)


def test_multivector_rows() -> None:
    out = backend(Server()).embed(["q"], task="retrieval.query", multivector=True)
    assert out[0].shape == (3, 4) and out[0].dtype == np.float32


def embeddings_with_single(request: httpx.Request) -> httpx.Response:
    """A service that knows ``return_single_vector``."""
    body = json.loads(request.content)
    response = json.loads(embeddings_ok(request).content)
    if body.get("return_single_vector"):
        for d in response["data"]:
            d["single_embedding"] = _vector(body["input"][d["index"]], False)
    return httpx.Response(200, json=response)


def test_embed_both_asks_once_and_falls_back_for_an_older_service() -> None:
    items = ["a", "longer text"]
    new = Server([embeddings_with_single])
    pairs = backend(new).embed_both(items)
    assert len(new.embedding_requests()) == 1
    assert new.embedding_requests()[0]["return_single_vector"] is True
    assert new.embedding_requests()[0]["task"] == "retrieval.passage"
    old = Server()  # ignores the unknown field, as the service ignores unknown fields
    fallback = backend(old).embed_both(items)
    assert [r["return_multivector"] for r in old.embedding_requests()] == [True, False]
    for (s1, m1), (s2, m2), item in zip(pairs, fallback, items, strict=True):
        assert np.array_equal(s1, s2) and np.array_equal(m1, m2)
        assert s1.shape == (4,) and m1.shape == (3, 4)
        np.testing.assert_allclose(s1, _vector({"text": item}, False), rtol=1e-6)

    def bad_single(request: httpx.Request) -> httpx.Response:
        response = json.loads(embeddings_with_single(request).content)
        response["data"][0]["single_embedding"] = [[1.0]]
        return httpx.Response(200, json=response)

    with pytest.raises(ServiceError, match="single_embedding of shape"):
        backend(Server([bad_single])).embed_both(items)


def test_retries_503_and_429_honouring_retry_after() -> None:
    server = Server(
        [
            lambda r: httpx.Response(503, headers={"Retry-After": "2"}, json={"error": {}}),
            lambda r: httpx.Response(429, headers={"Retry-After": "0.5"}),
            embeddings_ok,
        ]
    )
    sleeps: list[float] = []
    out = backend(server, sleeps).embed(["a"], task="retrieval.query", multivector=False)
    assert len(out) == 1
    assert sleeps == [2.0, 0.5]


def test_the_services_own_timeout_504_is_retried() -> None:
    """A 504 is the service giving up on a backend that answered nothing, which it restarts:
    the next attempt can succeed, as after a timeout of the client's own."""
    server = Server(
        [lambda r: httpx.Response(504, json={"error": {"message": "slow"}}), embeddings_ok]
    )
    sleeps: list[float] = []
    assert len(backend(server, sleeps).embed(["a"], task="retrieval.query", multivector=False)) == 1
    assert sleeps == [0.5]


def test_retry_after_is_capped_and_backoff_used_without_header() -> None:
    server = Server(
        [
            lambda r: httpx.Response(503, headers={"Retry-After": "3600"}),
            lambda r: httpx.Response(503),
            embeddings_ok,
        ]
    )
    sleeps: list[float] = []
    backend(server, sleeps, max_wait=10).embed(["a"], task="retrieval.query", multivector=False)
    assert sleeps == [10, 1.0]  # capped; then 0.5 * 2**1


def test_timeouts_are_retried_then_reported() -> None:
    def timeout(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=request)

    server = Server([timeout, embeddings_ok])
    sleeps: list[float] = []
    backend(server, sleeps).embed(["a"], task="retrieval.query", multivector=False)
    assert sleeps == [0.5]

    server = Server([timeout] * 3)
    with pytest.raises(ServiceError, match="timed out 3 times") as info:
        backend(server, max_retries=2).embed(["a"], task="retrieval.query", multivector=False)
    assert isinstance(info.value.__cause__, httpx.ReadTimeout)


def test_gives_up_on_persistent_503() -> None:
    server = Server([lambda r: httpx.Response(503, json={"error": {"message": "busy"}})] * 3)
    with pytest.raises(ServiceError, match="busy.*gave up after 3 attempts") as info:
        backend(server, max_retries=2).embed(["a"], task="retrieval.query", multivector=False)
    assert info.value.status == 503


def test_client_errors_fail_fast_with_the_server_message() -> None:
    body = {
        "error": {
            "message": "image too large: 9000x9000",
            "type": "invalid_request_error",
            "code": "image_too_large",
        }
    }
    server = Server([lambda r: httpx.Response(413, json=body)])
    sleeps: list[float] = []
    with pytest.raises(ServiceError, match="413: image too large: 9000x9000") as info:
        backend(server, sleeps).embed(["a"], task="retrieval.query", multivector=False)
    assert info.value.status == 413
    assert info.value.error_type == "invalid_request_error"
    assert info.value.code == "image_too_large"
    assert sleeps == []
    assert len(server.embedding_requests()) == 1

    server = Server([lambda r: httpx.Response(500, text="boom")])
    with pytest.raises(ServiceError, match="500: boom"):
        backend(server).embed(["a"], task="retrieval.query", multivector=False)


def test_unreachable_service() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    with pytest.raises(ServiceError, match="cannot reach http://svc/v1/models"):
        Client("http://svc", transport=httpx.MockTransport(refuse))


@pytest.mark.parametrize(
    ("response", "message"),
    [
        ({"data": []}, "expected 1 embeddings, got 0"),
        ({"data": [{"index": 3, "embedding": [1.0]}]}, "indices are not 0..0"),
        ({"data": [{"index": 0, "embedding": [[1.0], [2.0]]}]}, "shape \\(2, 1\\)"),
        ({"data": [{"index": 0, "embedding": [1.0, None]}]}, "finite floats"),
        ({"oops": 1}, "expected 1 embeddings"),
    ],
)
def test_malformed_responses(response: dict, message: str) -> None:
    server = Server([lambda r: httpx.Response(200, json=response)])
    with pytest.raises(ServiceError, match=message):
        backend(server).embed(["a"], task="retrieval.query", multivector=False)


def test_unknown_task_and_item_type() -> None:
    b = backend(Server())
    with pytest.raises(ValueError, match="unknown task 'retrieval'"):
        b.embed(["a"], task="retrieval", multivector=False)
    with pytest.raises(TypeError, match="cannot send a int"):
        b.embed([3], task="retrieval.query", multivector=False)  # type: ignore[list-item]


def test_concurrency_keeps_input_order() -> None:
    server = Server()
    texts = [f"text number {'x' * i}" for i in range(9)]
    out = backend(server, max_items=2, concurrency=3).embed(
        texts, task="text-matching", multivector=False
    )
    for text, vec in zip(texts, out, strict=True):
        np.testing.assert_allclose(vec, _vector({"text": text}, False), rtol=1e-6)
    assert len(server.embedding_requests()) == 5  # max_items=2 bounds each request

    server = Server()
    backend(server, concurrency=3).embed(texts, task="text-matching", multivector=False)
    assert [len(r["input"]) for r in server.embedding_requests()] == [3, 3, 3]


def test_request_byte_budget() -> None:
    server = Server()
    backend(server, max_request_bytes=100).embed(
        ["x" * 60, "y" * 60, "z"], task="retrieval.query", multivector=False
    )
    assert [len(r["input"]) for r in server.embedding_requests()] == [1, 2]


def test_retry_after_http_date() -> None:
    from datetime import UTC, datetime, timedelta
    from email.utils import format_datetime

    when = format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
    server = Server([lambda r: httpx.Response(429, headers={"Retry-After": when}), embeddings_ok])
    sleeps: list[float] = []
    backend(server, sleeps).embed(["a"], task="retrieval.query", multivector=False)
    assert len(sleeps) == 1 and 25 < sleeps[0] <= 30


def test_image_data_uri_converts_non_rgb() -> None:
    rgba = Image.new("RGBA", (3, 2), (10, 20, 30, 255))
    uri = image_data_uri(rgba)
    decoded = Image.open(io.BytesIO(base64.b64decode(uri.split(",", 1)[1])))
    assert decoded.mode == "RGB" and decoded.getpixel((0, 0)) == (10, 20, 30)
