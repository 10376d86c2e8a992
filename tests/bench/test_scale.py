"""bench.scale end to end on the tiny model: two real llama-servers behind one real service."""

from __future__ import annotations

from pathlib import Path

from bench.scale import Config, measure
from bench.serving import page_image
from vlembed.client import image_data_uri


def test_measure_two_replicas_behind_one_service(tiny_converted: Path) -> None:
    uris = [image_data_uri(page_image(280, 364, seed=i)) for i in range(4)]
    result = measure(
        tiny_converted, "f32", Config(replicas=2, threads=1), 1, uris, in_flight=2, repeats=2
    )
    assert (result["replicas"], result["threads_per_replica"]) == (2, 1)
    rate = result["pages_per_s"]
    assert len(rate["runs"]) == 2 and all(r > 0 for r in rate["runs"])
    assert rate["min"] <= rate["median"] <= rate["max"]
