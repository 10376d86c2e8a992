"""Pages/s of one ``vlembed serve`` with 1 and 2 llama-server replicas behind it (docs/scale.md).

The replicas are started the way serve starts its own (same command line, one per ``--backend``
URL), so the service's least-outstanding fan-out spreads the pages over them exactly as it does
over compose replicas or the llama-server containers of a Kubernetes pod. Each configuration
embeds the same page-sized images with a fixed number of requests in flight; each run is timed
from the first request to the last answer, after one warm-up page per slot.

    python -m bench.scale --preset tiny --pages 20 --repeats 3

On a shared machine the spread matters as much as the median: both are printed and written.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from bench.run import prepare_models
from bench.serving import REPO, page_image
from vlembed.client import image_data_uri
from vlembed.paths import cache_root, logs_dir

PAGE_SIZE = (1275, 1650)  # a US-letter page at 150 dpi: 744 image tokens at the default limit


@dataclasses.dataclass(frozen=True)
class Config:
    replicas: int
    threads: int  # per replica

    @property
    def label(self) -> str:
        return f"{self.replicas} replica(s) x {self.threads} thread(s)"


def _wait_healthy(url: str, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} did not become healthy in {timeout:.0f} s")


def _start_replicas(
    model_dir: Path, variant: str, config: Config, parallel: int
) -> list[tuple[subprocess.Popen, str]]:
    """llama-servers with serve's own command line (serve's spec builder, one port each)."""
    # the same settings -> command line path as `vlembed serve` (private, but this is its mirror)
    from preprocess_service.model import load_served_model
    from preprocess_service.serve import _server_spec
    from preprocess_service.settings import ServeSettings
    from preprocess_service.supervisor import free_port, llama_server_binary

    settings = ServeSettings(
        model=str(model_dir),
        variant=variant,
        parallel=parallel,
        threads=config.threads,
        ctx_size=2048,
    )
    model = load_served_model(model_dir)
    logs_dir().mkdir(parents=True, exist_ok=True)
    procs = []
    for i in range(config.replicas):
        spec = _server_spec(settings, model, model_dir, "retrieval", llama_server_binary())
        spec = dataclasses.replace(spec, port=free_port())
        log = open(logs_dir() / f"bench-scale-{i}.log", "ab")  # noqa: SIM115 - child's stdout
        proc = subprocess.Popen(spec.argv(), stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
        log.close()
        procs.append((proc, spec.url))
    for proc, url in procs:
        _wait_healthy(url, proc, "llama-server")
    return procs


def _start_serve(
    model_dir: Path, variant: str, backends: list[str]
) -> tuple[subprocess.Popen, str]:
    from preprocess_service.supervisor import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "vlembed.cli", "serve", "--model", str(model_dir)]
    cmd += ["--variant", variant, "--port", str(port), "--tasks", "retrieval"]
    cmd += ["--log-level", "warning"]
    for url in backends:
        cmd += ["--backend", url]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    _wait_healthy(url, proc, "vlembed serve")
    return proc, url


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _run_pages(url: str, uris: list[str], in_flight: int) -> float:
    """Seconds to embed every page once, ``in_flight`` requests of one page at a time."""

    def one(uri: str) -> None:
        body = {"input": [{"image": uri}], "task": "retrieval.passage"}
        r = client.post(url + "/v1/embeddings", json=body, timeout=900)
        r.raise_for_status()

    with httpx.Client(limits=httpx.Limits(max_connections=in_flight)) as client:
        t = time.perf_counter()
        with ThreadPoolExecutor(in_flight) as pool:
            list(pool.map(one, uris))
        return time.perf_counter() - t


def measure(
    model_dir: Path,
    variant: str,
    config: Config,
    parallel: int,
    uris: list[str],
    in_flight: int,
    repeats: int,
) -> dict:
    replicas = _start_replicas(model_dir, variant, config, parallel)
    serve = None
    try:
        serve, url = _start_serve(model_dir, variant, [u for _, u in replicas])
        _run_pages(url, uris[:in_flight], in_flight)  # warm-up: every slot once
        rates = []
        for _ in range(repeats):
            seconds = _run_pages(url, uris, in_flight)
            rates.append(len(uris) / seconds)
            print(f"  {config.label}: {rates[-1]:.3f} pages/s", file=sys.stderr)
        return {
            "replicas": config.replicas,
            "threads_per_replica": config.threads,
            "pages_per_s": {
                "median": statistics.median(rates),
                "min": min(rates),
                "max": max(rates),
                "runs": rates,
            },
        }
    finally:
        _stop(([serve] if serve else []) + [p for p, _ in replicas])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    p.add_argument("--preset", default="tiny", choices=["tiny", "bench"])
    p.add_argument(
        "--variant", default="f16", help="text GGUF variant: f32, f16, bf16, Q8_0, Q4_K_M, ..."
    )
    p.add_argument("--pages", type=int, default=24, help="pages per timed run")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--parallel", type=int, default=2, help="slots per llama-server")
    p.add_argument("--in-flight", type=int, default=4, help="requests in flight (one page each)")
    p.add_argument(
        "--configs",
        default="1x1,2x1,1x2",
        help="REPLICASxTHREADS,... (threads per replica)",
    )
    p.add_argument("--out", type=Path, help="JSON results [docs/scale-PRESET.json]")
    args = p.parse_args(argv)

    _, dirs = prepare_models(args.preset, cache_root() / "bench", [args.variant])
    model_dir = dirs[args.variant]
    uris = [image_data_uri(page_image(*PAGE_SIZE, seed=i)) for i in range(args.pages)]
    configs = [Config(*map(int, c.split("x"))) for c in args.configs.split(",")]
    results = []
    for config in configs:
        results.append(
            measure(
                model_dir, args.variant, config, args.parallel, uris, args.in_flight, args.repeats
            )
        )
    report = {
        "preset": args.preset,
        "variant": args.variant,
        "page": f"{PAGE_SIZE[0]}x{PAGE_SIZE[1]}",
        "pages_per_run": args.pages,
        "repeats": args.repeats,
        "parallel": args.parallel,
        "in_flight": args.in_flight,
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "load_average_at_end": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d"),
        "results": results,
    }
    out = args.out or REPO / "docs" / f"scale-{args.preset}.json"
    out.write_text(json.dumps(report, indent=2) + "\n")
    for r in results:
        s = r["pages_per_s"]
        print(
            f"{r['replicas']} x {r['threads_per_replica']} thread(s): "
            f"{s['median']:.3f} pages/s ({s['min']:.3f}-{s['max']:.3f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
