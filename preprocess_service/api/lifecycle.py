"""Start-up, supervision and shutdown of the llama-servers behind one app."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi import FastAPI

from preprocess_service.api.guard import GuardConfig
from preprocess_service.backend import Backend
from preprocess_service.embedder import EmbeddingService
from preprocess_service.supervisor import ManagedServer, hang_reason
from preprocess_service.validate import Limits

if TYPE_CHECKING:
    from preprocess_service.search import SearchService

log = logging.getLogger("vlembed.supervisor")


@dataclass
class AppState:
    service: EmbeddingService
    limits: Limits = field(default_factory=Limits)
    guard: GuardConfig = field(default_factory=GuardConfig)
    managed: list[tuple[ManagedServer, str]] = field(default_factory=list)  # (server, task)
    startup_timeout: float = 180.0
    monitor_interval: float = 0.5
    hang_timeout: float = 60.0  # a local llama-server silent on /health this long is restarted
    search: SearchService | None = None  # --index: POST /v1/search and the search page


async def _wait_ready(state: AppState) -> None:
    """Until every task has a healthy backend, a local server died, or the timeout passed."""
    pools = list(state.service.pools.values())
    deadline = time.monotonic() + state.startup_timeout
    while time.monotonic() < deadline:
        await asyncio.gather(*(b.refresh() for p in pools for b in p.backends))
        if all(p.healthy() for p in pools):
            return
        if any(s.exited() is not None for s, _ in state.managed):
            return  # a crash at start: the monitor restarts it; /health says so meanwhile
        await asyncio.sleep(0.25)


async def _monitor(state: AppState) -> None:
    """Restart dead local servers; keep every backend's health (and media marker) current."""
    svc = state.service
    last_full = 0.0
    while True:
        for server, task in state.managed:
            backend = _backend_of(state, server, task)
            _kill_if_hung(state, server, backend)
            if server.maybe_restart():
                backend.forget_liveness()
                svc.metrics.restarts.inc()
        now = time.monotonic()
        full = now - last_full > 2.0
        checks = [
            b.refresh()
            for pool in svc.pools.values()
            for b in pool.backends
            if full or not b.healthy
        ]
        if checks:
            await asyncio.gather(*checks, return_exceptions=True)
        if full:
            last_full = now
        for task, pool in svc.pools.items():
            svc.metrics.backends_healthy.labels(task).set(len(pool.healthy()))
        await asyncio.sleep(state.monitor_interval)


def _backend_of(state: AppState, server: ManagedServer, task: str) -> Backend:
    pool = state.service.pools[task]
    return next(b for b in pool.backends if b.url == server.spec.url)


def _kill_if_hung(state: AppState, server: ManagedServer, backend: Backend) -> None:
    if server.exited() is not None:
        return
    now = time.monotonic()
    reason = hang_reason(
        now=now,
        started_at=server.started_at,
        probe_since=backend.probe_since,
        stalled_for=backend.stalled_for(now),
        hang_timeout=state.hang_timeout,
        stall_timeout=0.9 * state.service.limits.request_timeout,
    )
    if reason is None:
        return
    log.error(
        "llama-server on %s is alive but %s: killing it to restart it; its log ends:\n%s",
        server.spec.url,
        reason,
        server.log_tail(),
    )
    server.kill()
    backend.forget_liveness()
    state.service.metrics.hangs.inc()


def lifespan(state: AppState):
    @contextlib.asynccontextmanager
    async def run(app: FastAPI) -> AsyncIterator[None]:
        for server, _ in state.managed:
            server.start()
        await _wait_ready(state)
        monitor = asyncio.create_task(_monitor(state))
        try:
            yield
        finally:
            monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await monitor
            for server, _ in state.managed:
                server.stop()
            for pool in state.service.pools.values():
                for b in pool.backends:
                    await b.client.aclose()

    return run
