"""Load test of the service: N concurrent clients × M mixed requests against ``vlembed serve``.

Checks what users rely on under load — no errors, and every result bitwise equal to the same
request sent alone — and measures latency percentiles and throughput. Writes docs/LOAD.md.
Runs on the tiny synthetic model by default (the point is the service, not the model).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

from bench.serving import REPO, ServeProcess
from vlembed.client import image_data_uri as data_uri


def _min_cos(got: list[dict], want: list[dict]) -> float:
    """Smallest cosine between corresponding vectors (rows, for multi-vector outputs)."""
    worst = 1.0
    for g, w in zip(got, want, strict=True):
        a = np.atleast_2d(np.asarray(g["embedding"], np.float64))
        b = np.atleast_2d(np.asarray(w["embedding"], np.float64))
        cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        worst = min(worst, float(cos.min()))
    return worst


def _img(w: int, h: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    base = rng.integers(0, 256, (max(h // 8, 1), max(w // 8, 1), 3), dtype=np.uint8)
    return Image.fromarray(base).resize((w, h), Image.BILINEAR)


def mixed_requests(n: int, seed: int) -> list[dict]:
    """A reproducible mix of text, image, interleaved and multi-vector requests."""
    rng = random.Random(seed)
    imgs = [data_uri(_img(rng.randrange(30, 200), rng.randrange(30, 200), i)) for i in range(6)]
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            out.append({"input": f"query {i} " + "word " * rng.randrange(1, 30)})
        elif kind == 1:
            out.append({"input": [{"image": rng.choice(imgs)}], "task": "retrieval.passage"})
        elif kind == 2:
            out.append(
                {
                    "input": [
                        [
                            {"type": "text", "text": f"doc {i}"},
                            {"type": "image_url", "image_url": {"url": rng.choice(imgs)}},
                        ]
                    ],
                    "task": "code.passage",
                    "return_multivector": True,
                }
            )
        else:
            out.append({"input": ["a", f"b {i}"], "task": "text-matching", "dimensions": 64})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.load", description=__doc__.splitlines()[0])
    p.add_argument("--clients", type=int, default=32)
    p.add_argument("--requests", type=int, default=200, help="requests per client")
    p.add_argument("--parallel", type=int, default=4)
    p.add_argument("--threads", type=int, default=1, help="threads per llama-server")
    p.add_argument(
        "--vision-batch-tokens",
        type=int,
        default=1024,
        help="as vlembed serve (its default): same-size images in flight share a vision forward",
    )
    p.add_argument("--out", type=Path, default=REPO / "docs" / "LOAD.md")
    args = p.parse_args(argv)
    from gguf_convert.resolve import tiny_random_model

    model = tiny_random_model()
    # one llama-server per task; on 2 cores give each a single thread
    svc = ServeProcess(
        model,
        "f32",
        args.threads,
        args.parallel,
        tasks="retrieval,text-matching,code",
        vision_batch_tokens=args.vision_batch_tokens,
    )
    total = args.clients * args.requests
    reqs = mixed_requests(total, seed=11)
    try:
        with httpx.Client(timeout=300, limits=httpx.Limits(max_connections=args.clients)) as c:
            distinct = {json.dumps(r, sort_keys=True): r for r in reqs}
            alone = {
                k: c.post(svc.url + "/v1/embeddings", json=r).json()["data"]
                for k, r in distinct.items()
            }
            latencies: list[float] = []
            statuses: list[int] = []
            mismatches = 0
            worst_cos = 1.0

            def client(i: int) -> None:
                nonlocal mismatches, worst_cos
                for r in reqs[i * args.requests : (i + 1) * args.requests]:
                    t = time.perf_counter()
                    resp = c.post(svc.url + "/v1/embeddings", json=r)
                    latencies.append(time.perf_counter() - t)
                    statuses.append(resp.status_code)
                    want = alone[json.dumps(r, sort_keys=True)]
                    if resp.status_code == 200 and resp.json()["data"] != want:
                        mismatches += 1
                        worst_cos = min(worst_cos, _min_cos(resp.json()["data"], want))

            start = time.perf_counter()
            with ThreadPoolExecutor(args.clients) as pool:
                list(pool.map(client, range(args.clients)))
            wall = time.perf_counter() - start
    finally:
        svc.stop()
    lat = sorted(latencies)
    errors = sum(s != 200 for s in statuses)
    result = {
        "clients": args.clients,
        "requests": total,
        "errors": errors,
        "mismatches": mismatches,
        "worst_cos_vs_alone": worst_cos,
        "p50_ms": statistics.median(lat) * 1000,
        "p99_ms": lat[int(0.99 * (len(lat) - 1))] * 1000,
        "max_ms": lat[-1] * 1000,
        "throughput_rps": total / wall,
        "wall_s": wall,
        "parallel_slots": args.parallel,
        "vision_batch_tokens": args.vision_batch_tokens,
        "threads": args.threads,
    }
    args.out.write_text(
        "# Load test\n\n"
        "Regenerate with `python -m bench.load` (tiny synthetic model, F32, one llama-server per "
        f"task with {args.parallel} slots and {args.threads} threads, "
        f"`--vision-batch-tokens {args.vision_batch_tokens}`, on the 2-core machine).\n"
        "Mixed requests: text queries, single images, interleaved text+image (multi-vector), "
        "text pairs at a Matryoshka dimension; each result compared with the same request sent "
        "alone.\n\n"
        "| clients | slots | requests | errors | results ≠ alone | worst cos vs alone | p50 ms | "
        "p99 ms | max ms | req/s |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
        f"| {args.clients} | {args.parallel} | {total} | {errors} | {mismatches} | "
        f"{worst_cos:.7f} | {result['p50_ms']:.0f} | "
        f"{result['p99_ms']:.0f} | {result['max_ms']:.0f} | {result['throughput_rps']:.1f} |\n"
    )
    print(json.dumps(result, indent=2))
    return 0 if errors == 0 and mismatches == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
