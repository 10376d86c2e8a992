"""Integration fixtures: the real patched llama-server (built by our script) on real GGUFs.

The first session builds llama.cpp (~6 min on 2 cores, then cached by pin + patch hash).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from preprocess_service.backend import Backend
from preprocess_service.supervisor import VISION_BATCH_TOKENS, ManagedServer, ServerSpec, free_port

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def server_binary() -> Path:
    from preprocess_service.supervisor import llama_server_binary

    return llama_server_binary()


def start_server(
    binary: Path,
    model: Path,
    mmproj: Path,
    log_dir: Path,
    parallel: int = 4,
    ctx: int = 2048,
    threads: int = 2,
    vision_batch_tokens: int = 1024,
) -> ManagedServer:
    spec = ServerSpec(
        binary=binary,
        model=model,
        mmproj=mmproj,
        port=free_port(),
        parallel=parallel,
        threads=threads,
        ctx_per_slot=ctx,
        vision_batch_tokens=vision_batch_tokens,
    )
    return start_spec(spec, log_dir)


def start_spec(spec: ServerSpec, log_dir: Path) -> ManagedServer:
    """Start a llama-server for ``spec`` and wait until it is healthy (or say why not)."""
    server = ManagedServer(spec, log_dir / f"llama-server-{spec.port}.log")
    server.start()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if server.exited() is not None:
            raise RuntimeError(f"llama-server exited:\n{server.log_path.read_text()[-3000:]}")
        try:
            if httpx.get(spec.url + "/health", timeout=2).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    server.stop()
    raise RuntimeError(
        f"llama-server did not become healthy:\n{server.log_path.read_text()[-3000:]}"
    )


@pytest.fixture(scope="session")
def retrieval_server(
    server_binary: Path, tiny_converted: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ManagedServer]:
    server = start_server(
        server_binary,
        tiny_converted / "text-retrieval-f32.gguf",
        tiny_converted / "mmproj-f32.gguf",
        tmp_path_factory.mktemp("logs"),
        # concurrent images share vision forwards here as under `vlembed serve`, so the
        # concurrency tests also hold batched encoding to the parity bound
        vision_batch_tokens=VISION_BATCH_TOKENS,
    )
    yield server
    server.stop()


def run(coro):
    return asyncio.run(coro)


async def backend_rows(url: str, prompt: str, images=(), timeout: float = 120.0):
    async with httpx.AsyncClient() as client:
        backend = Backend(url, "retrieval", client)
        assert await backend.refresh(), "backend not ready"
        return await backend.embed(prompt.replace("<IMG>", backend.marker), list(images), timeout)


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


def vision_forwards(log: Path, start: int) -> list[int]:
    """Images per shared vision forward that llama-server logged since byte ``start``."""
    with log.open("rb") as f:
        f.seek(start)
        return [
            int(line.split(b"encoded the images of ")[1].split()[0])
            for line in f
            if b"in one vision forward" in line
        ]
