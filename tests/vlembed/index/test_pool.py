"""``ServicePool`` against a real service and a replica that is down (a closed port)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.vlembed.index.conftest import noise_image
from vlembed import Client
from vlembed.errors import ServiceError
from vlembed.index.pool import ServicePool, retryable
from vlembed.index.service import local_service

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def service(tiny_converted: Path) -> Iterator[str]:
    with local_service(str(tiny_converted), ["--parallel", "2", "--threads", "2"]) as url:
        yield url


def _dead_url() -> str:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_a_dead_replica_fails_over_to_a_live_one_with_the_same_vectors(service: str) -> None:
    waits: list[float] = []
    dead = _dead_url()
    # benched for 10 min after its failure (waits are recorded, not slept): within this test
    # the dead replica is tried exactly once
    pool = ServicePool([dead, service], base_delay=300, max_delay=600, sleep=waits.append)
    texts = ["a page about invoices", "another page"]
    for _ in range(3):
        got = pool.embed(texts, task="retrieval.passage")
    with Client(service) as client:
        want = client.embed(texts, task="retrieval.passage")
    np.testing.assert_array_equal(np.stack(got), np.stack(want))
    # tried once, then benched: later calls go straight to the live one
    assert pool.failovers == 1 and waits == [300]
    with Client(service) as client:
        want_pairs = client.embed_both(texts, task="retrieval.passage")
    for (s1, m1), (s2, m2) in zip(
        pool.embed_both(texts, task="retrieval.passage"), want_pairs, strict=True
    ):
        np.testing.assert_array_equal(s1, s2)
        np.testing.assert_array_equal(m1, m2)
    pool.close()


def test_no_replica_answering_fails_after_max_attempts_with_doubling_waits() -> None:
    waits: list[float] = []
    pool = ServicePool([_dead_url(), _dead_url()], max_attempts=5, sleep=waits.append)
    with pytest.raises(ServiceError, match="answered in 5 attempts") as info:
        pool.embed(["x"], task="retrieval.query")
    assert isinstance(info.value.__cause__, ServiceError) and info.value.__cause__.status is None
    assert waits == [0.25, 0.5, 1.0, 2.0]  # no wait after the last attempt


def test_a_refused_input_is_raised_at_once(service: str) -> None:
    waits: list[float] = []
    pool = ServicePool([service, service], sleep=waits.append)
    with pytest.raises(ServiceError) as info:
        pool.embed([b"not an image at all"], task="retrieval.passage")
    assert info.value.status == 400 and not retryable(info.value)
    assert pool.failovers == 0 and waits == []
    pool.close()


def test_retryable_statuses() -> None:
    assert retryable(ServiceError("down"))
    assert all(retryable(ServiceError("x", status=s)) for s in (429, 500, 502, 503, 504))
    assert not any(retryable(ServiceError("x", status=s)) for s in (400, 401, 404, 413, 422))


def test_multivectors_of_an_image_come_back_through_the_pool(service: str) -> None:
    """Image bytes pass through as with the client; one row per prompt and image token."""
    import io

    buf = io.BytesIO()
    noise_image(56, 56, 1).save(buf, "PNG")
    pool = ServicePool([service])
    (multi,) = pool.embed([buf.getvalue()], task="retrieval.passage", multivector=True)
    assert multi.ndim == 2 and multi.shape[0] > 4
    pool.close()
