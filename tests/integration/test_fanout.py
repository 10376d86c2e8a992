"""Several llama-server replicas of one task behind one service: load is spread across them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from .conftest import start_server
from .test_service_e2e import LiveService

pytestmark = pytest.mark.integration


def test_least_outstanding_spreads_load(
    server_binary: Path, tiny_converted: Path, tmp_path: Path
) -> None:
    # one thread each: two replicas on two cores, as a deployment would size them
    replicas = [
        start_server(
            server_binary,
            tiny_converted / "text-retrieval-f32.gguf",
            tiny_converted / "mmproj-f32.gguf",
            tmp_path,
            parallel=2,
            threads=1,
        )
        for _ in range(2)
    ]
    svc = None
    try:
        extra = ["--tasks", "retrieval"]
        for r in replicas:
            extra += ["--backend", f"retrieval={r.spec.url}"]
        svc = LiveService(tiny_converted, extra)
        backends = svc.state.service.pools["retrieval"].backends
        assert len(backends) == 2 and not svc.state.managed
        bodies = [{"input": [f"query number {i} " + "word " * (i % 7)]} for i in range(32)]
        with ThreadPoolExecutor(8) as pool:
            statuses = list(
                pool.map(
                    lambda b: (
                        httpx.post(svc.url + "/v1/embeddings", json=b, timeout=60).status_code
                    ),
                    bodies,
                )
            )
        assert statuses == [200] * 32
        served = [b.served for b in backends]
        print("requests per replica:", served)
        # least-outstanding sends more to a replica that answers faster, so no exact split;
        # but each of two equal replicas must take a real share
        assert sum(served) == 32 and min(served) >= 8
    finally:
        if svc:
            svc.stop()
        for r in replicas:
            r.stop()
