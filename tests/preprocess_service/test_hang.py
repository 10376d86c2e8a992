"""When a live llama-server counts as hung: the rule, and the bookkeeping it reads.

The real thing (a frozen llama-server killed and restarted under load) is in
tests/integration/test_service_e2e.py; here each sign is checked on its own, including the
cases that must not count (a slow model load, an idle server, a server that keeps answering).
"""

from __future__ import annotations

import asyncio
import json

import httpx
import numpy as np
import pytest

from preprocess_service.backend import Backend
from preprocess_service.supervisor import hang_reason
from vlembed.errors import BackendUnavailableError
from vlembed.wire import CHUNK_TEXT, Chunk, encode_rows


def _reason(**kw) -> str | None:
    args = dict(now=1000.0, started_at=0.0, probe_since=None, stalled_for=0.0)
    args.update(kw)
    return hang_reason(hang_timeout=60.0, stall_timeout=108.0, **args)


def test_a_server_answering_health_and_requests_is_not_hung() -> None:
    assert _reason() is None
    assert _reason(stalled_for=107.0) is None  # a slow request, still under the limit


def test_silence_on_health_counts_from_the_later_of_start_and_the_unanswered_probe() -> None:
    assert _reason(probe_since=939.0) == "answered no /health for 61 s"
    assert _reason(probe_since=941.0) is None
    assert _reason(probe_since=0.0, started_at=990.0) is None  # just (re)started: not listening
    assert _reason(probe_since=0.0, started_at=930.0) is not None


def test_requests_without_an_answer_count_even_when_health_answers() -> None:
    assert _reason(stalled_for=109.0) == "answered no embedding request for 109 s"


def refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("refused", request=request)


ROWS = encode_rows(np.zeros((1, 4), np.float32), [Chunk(CHUNK_TEXT, 0, 1, -1)])


def test_stalled_for_counts_requests_on_the_wire_since_the_last_answer() -> None:
    """Idle is never stalled; an answer restarts the count for what is still out; a request
    that fails to connect is no answer."""
    release: dict[str, asyncio.Event] = {}

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(503, json={"error": {"message": "loading"}})
        prompt = json.loads(request.read())["content"]["prompt_string"]
        if prompt == "refused":
            raise httpx.ConnectError("refused", request=request)
        await release.setdefault(prompt, asyncio.Event()).wait()
        return httpx.Response(200, content=ROWS)

    async def go() -> None:
        backend = Backend(
            "http://b", "retrieval", httpx.AsyncClient(transport=httpx.MockTransport(handler))
        )
        assert backend.stalled_for(1e9) == 0.0
        assert not await backend.refresh()
        assert backend.probe_since is None  # a 503 is an answer: loading is not hanging

        a = asyncio.create_task(backend.embed("a", [], 10))
        b = asyncio.create_task(backend.embed("b", [], 10))
        await asyncio.sleep(0.05)
        first = backend.owed_since
        assert backend.sent == 2 and first is not None
        assert backend.stalled_for(first + 50) == pytest.approx(50)

        release["a"].set()
        await asyncio.wait_for(a, 5)
        assert backend.sent == 1 and backend.owed_since > first  # b is counted from a's answer

        b.cancel()  # the caller gave up: nothing on the wire, nothing owed
        with pytest.raises(asyncio.CancelledError):
            await b
        assert backend.sent == 0 and backend.stalled_for(1e9) == 0.0

        with pytest.raises(BackendUnavailableError):
            await backend.embed("refused", [], 10)
        assert backend.sent == 0

        backend.client = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
        assert not await backend.refresh()
        assert backend.probe_since is not None  # refused: no answer, the silence goes on
        since = backend.probe_since
        assert not await backend.refresh() and backend.probe_since == since

        backend.forget_liveness()
        assert backend.owed_since is None and backend.probe_since is None and not backend.healthy

    asyncio.run(go())
