"""Scale of the document index: synthetic pages of the real model's shapes, no service.

Each page: one 2048-d unit vector and ~700 unit rows of 128 dims (jina-embeddings-v4's
multi-vector), written straight through the store layer (:class:`vlembed.index.store.PageStore`)
in the stored form of each option: float32, pooled x2 / x3 (fewer rows, as pooling leaves them;
the clustering itself is index-time work measured by ``bench/index_options.py``), binary.
Prints write rate, disk per page, search latency (p50/p99 over queries of 20 rows, first stage
+ MaxSim rerank of max(4k, 50) candidates, k=10) and the resident memory of the process.

    python -m bench.index_scale --pages 10000 --out /tmp/scale
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import time
from pathlib import Path

import numpy as np

from vlembed.index.codec import StorageOptions
from vlembed.index.search import default_candidates, rerank
from vlembed.index.store import IndexMeta, PageRecord, PageStore

DIM, MULTI_DIM, ROWS = 2048, 128, 700
OPTIONS = {
    "float32": (StorageOptions(), ROWS),
    "pooled x2": (StorageOptions(pool_factor=2), ROWS // 2),
    "pooled x3": (StorageOptions(pool_factor=3), -(-ROWS // 3)),
    "binary": (StorageOptions(binary=True), ROWS),
}


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def _records(rng, start: int, n: int, rows: int, opts: StorageOptions) -> list[PageRecord]:
    out = []
    labels = b""
    if opts.pool_factor > 1:
        labels = (np.arange(ROWS) // opts.pool_factor).astype("<u2").tobytes()
    for i in range(start, start + n):
        mv = _unit(rng.standard_normal((rows, MULTI_DIM), dtype=np.float32))
        data = np.packbits(mv > 0, axis=1).tobytes() if opts.binary else mv.tobytes()
        out.append(
            PageRecord(
                source=f"/synthetic/doc{i // 10:06d}.pdf",
                page=i % 10 + 1,
                n_pages=10,
                content_hash=f"{i // 10:064x}",
                size=1 << 20,
                width=868,
                height=672,
                grid_h=31,
                grid_w=24,
                image_row_start=4,
                n_image_rows=ROWS - 11,
                n_rows=ROWS,
                thumbnail=b"\x89PNG" + bytes(8 << 10),  # ~8 KB, a typical 256 px thumbnail
                vector=_unit(rng.standard_normal(DIM, dtype=np.float32)),
                mv=data,
                mv_rows=rows,
                mv_labels=labels,
                model="synthetic",
                revision="0",
            )
        )
    return out


def _du(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(n_pages: int, out: Path, names: list[str], n_queries: int, k: int) -> list[dict]:
    results = []
    for name in names:
        opts, rows = OPTIONS[name]
        path = out / name.replace(" ", "_")
        shutil.rmtree(path, ignore_errors=True)
        store = PageStore(path)
        store.ensure_meta(IndexMeta("synthetic", "0", DIM, MULTI_DIM, opts))
        rng = np.random.default_rng(0)
        t0 = time.perf_counter()
        for start in range(0, n_pages, 500):
            store.add(_records(rng, start, min(500, n_pages - start), rows, opts))
        write_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        ann = store.build_ann()
        ann_s = time.perf_counter() - t0
        disk = _du(path)
        store = PageStore(path)  # a fresh process's view: cold handle, warm page cache
        lat = []
        for _ in range(n_queries):
            single = _unit(rng.standard_normal(DIM, dtype=np.float32))
            multi = _unit(rng.standard_normal((20, MULTI_DIM), dtype=np.float32))
            t0 = time.perf_counter()
            hits = rerank(store, single, multi, k, default_candidates(k))
            lat.append(time.perf_counter() - t0)
            assert len(hits) == k
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        row = {
            "option": name,
            "pages": n_pages,
            "write_pages_per_s": n_pages / write_s,
            "ann": ann,
            "ann_build_s": ann_s,
            "disk_bytes_per_page": disk / n_pages,
            "disk_total_gb": disk / 1e9,
            "search_p50_ms": 1e3 * float(np.percentile(lat[1:], 50)),
            "search_p99_ms": 1e3 * float(np.percentile(lat[1:], 99)),
            "max_rss_mb": rss / 1e6,
        }
        print(json.dumps(row), flush=True)
        results.append(row)
        shutil.rmtree(path, ignore_errors=True)
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pages", type=int, default=10_000)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--options", default=",".join(OPTIONS), help="comma-separated")
    p.add_argument("--queries", type=int, default=101)
    p.add_argument("-k", type=int, default=10)
    args = p.parse_args(argv)
    run(args.pages, args.out, args.options.split(","), args.queries, args.k)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
