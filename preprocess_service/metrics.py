"""Prometheus metrics of one service instance (own registry, so tests can build many apps)."""

from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


@dataclass
class Metrics:
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self) -> None:
        r = self.registry
        self.requests = Counter(
            "vlembed_requests", "Embedding requests by outcome", ["status"], registry=r
        )
        self.latency = Histogram(
            "vlembed_request_seconds",
            "End-to-end request latency",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.stage = Histogram(
            "vlembed_stage_seconds",
            "Time per pipeline stage",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.tokens = Counter("vlembed_prompt_tokens", "Prompt tokens embedded", registry=r)
        self.images = Counter("vlembed_images", "Images embedded", registry=r)
        self.restarts = Counter(
            "vlembed_backend_restarts", "llama-server restarts by the supervisor", registry=r
        )
        self.hangs = Counter(
            "vlembed_backend_hangs",
            "live llama-servers killed by the supervisor because they answered nothing",
            registry=r,
        )
        self.queue_depth = Gauge("vlembed_queue_depth", "Items in flight", registry=r)
        self.backends_healthy = Gauge(
            "vlembed_backends_healthy", "Healthy backends", ["task"], registry=r
        )
