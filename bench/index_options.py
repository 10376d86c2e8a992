"""Storage options of the document index, measured on the offline document set.

For each option (float32, token pooling x2/x3/x4, binary, pooling x2 + binary) on the pages of
a ``vlembed eval make-docs`` set, embedded once by a running service:

- bytes per page of the stored multi-vector (plus pooling labels);
- agreement with the unpooled float32 MaxSim ranking over all pages: recall@5 of its top 5 and
  Kendall's tau of the page scores, averaged over the set's queries;
- nDCG@5 against the set's qrels (meaningless with random weights: reported to show that it is).

It also measures the indexing overhead: pages/s of ``Index.add`` against the same pages sent
straight to ``/v1/embeddings`` (single vector + multi-vector requests, same concurrency and
batch size).

    python -m bench.index_options --docs DOCSET --server URL [--out index_options.json]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from eval.scoring import kendall_tau
from vlembed import Client
from vlembed.index import Index, StorageOptions
from vlembed.index.codec import decode_rows, encode_rows
from vlembed.index.maxsim import maxsim

OPTIONS = {
    "float32": StorageOptions(),
    "pooled x2 (ward)": StorageOptions(pool_factor=2),
    "pooled x3 (ward)": StorageOptions(pool_factor=3),
    "pooled x4 (ward)": StorageOptions(pool_factor=4),
    "pooled x2 (average, cosine)": StorageOptions(pool_factor=2, pool_method="average"),
    "binary": StorageOptions(binary=True),
    "pooled x2 + binary": StorageOptions(pool_factor=2, binary=True),
}


def _load(docs: Path) -> tuple[list[Path], list[str], list[dict]]:
    corpus = [json.loads(line) for line in (docs / "corpus.jsonl").read_text().splitlines()]
    queries = [json.loads(line) for line in (docs / "queries.jsonl").read_text().splitlines()]
    return [docs / c["image"] for c in corpus], [c["id"] for c in corpus], queries


def _direct(
    client: Client, pages: list[Path], concurrency: int, batch: int, one_pass: bool = True
) -> float:
    """Pages/s of the same requests the indexer makes, without the index around them
    (``one_pass=False``: a single-vector and a multi-vector request per batch, as the indexer
    sent them before ``return_single_vector``)."""
    chunks = [pages[i : i + batch] for i in range(0, len(pages), batch)]

    def one(chunk: list[Path]) -> None:
        if one_pass:
            client.embed_both(chunk, task="retrieval.passage")
        else:
            client.embed(chunk, task="retrieval.passage")
            client.embed(chunk, task="retrieval.passage", multivector=True)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, chunks))
    return len(pages) / (time.perf_counter() - t0)


def _ndcg5(ranked: list[str], relevant: set[str]) -> float:
    dcg = sum(1 / math.log2(i + 2) for i, d in enumerate(ranked[:5]) if d in relevant)
    ideal = sum(1 / math.log2(i + 2) for i in range(min(5, len(relevant))))
    return dcg / ideal if ideal else 0.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=Path, required=True, help="a vlembed eval make-docs folder")
    p.add_argument("--server", required=True)
    p.add_argument("--concurrency", type=int, default=3)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    paths, ids, queries = _load(args.docs)
    client = Client(args.server)
    work = Path(tempfile.mkdtemp(prefix="index-options-"))
    try:
        # overhead: direct requests, then the indexer, twice each, best of two
        direct = max(_direct(client, paths, args.concurrency, args.batch) for _ in range(2))
        two_requests = max(
            _direct(client, paths, args.concurrency, args.batch, one_pass=False) for _ in range(2)
        )
        print(
            f"one request per batch {direct:.3f} pages/s, two requests (single, then multi) "
            f"{two_requests:.3f} pages/s: {direct / two_requests:.2f}x"
        )
        rates = []
        for i in range(2):
            t0 = time.perf_counter()
            Index(work / f"idx{i}").add(
                paths, client=client, concurrency=args.concurrency, pages_per_request=args.batch
            )
            rates.append(len(paths) / (time.perf_counter() - t0))
        indexed = max(rates)
        print(
            f"direct /v1/embeddings {direct:.3f} pages/s, vlembed index {indexed:.3f} pages/s: "
            f"overhead {100 * (1 - indexed / direct):+.1f} %"
        )

        store = Index(work / "idx0").store
        data = store.table.search().select(["source", "mv", "mv_rows"]).limit(None).to_arrow()
        by_source = dict(zip(data["source"].to_pylist(), range(data.num_rows), strict=True))
        dim = store.meta.multi_dim
        rows = [
            decode_rows(data["mv"][by_source[str(p.resolve())]].as_py(),
                        data["mv_rows"][by_source[str(p.resolve())]].as_py(), dim, False)
            for p in paths
        ]  # fmt: skip
        qrows = client.embed([q["text"] for q in queries], task="retrieval.query", multivector=True)
        ref = np.array([[maxsim(q, r) for r in rows] for q in qrows])
        ref_top5 = [set(np.argsort(-s)[:5]) for s in ref]
        results = []
        for name, opts in OPTIONS.items():
            t0 = time.perf_counter()
            enc = [encode_rows(r, opts) for r in rows]
            encode_ms = 1e3 * (time.perf_counter() - t0) / len(rows)
            stored = [decode_rows(e.data, e.n_rows, e.dim, opts.binary) for e in enc]
            scores = np.array([[maxsim(q, s) for s in stored] for q in qrows])
            recall = np.mean(
                [
                    len(set(np.argsort(-s)[:5]) & t) / 5
                    for s, t in zip(scores, ref_top5, strict=True)
                ]
            )
            tau = np.mean([kendall_tau(a, b) for a, b in zip(ref, scores, strict=True)])
            ndcg = np.mean(
                [
                    _ndcg5([ids[i] for i in np.argsort(-s)], {q["page"]})
                    for s, q in zip(scores, queries, strict=True)
                ]
            )
            row = {
                "option": name,
                "bytes_per_page": float(np.mean([len(e.data) + len(e.labels) for e in enc])),
                "rows_per_page": float(np.mean([e.n_rows for e in enc])),
                "recall_at_5_vs_float": float(recall),
                "kendall_tau_vs_float": float(tau),
                "ndcg_at_5_random_weights": float(ndcg),
                "encode_ms_per_page": encode_ms,
            }
            results.append(row)
            print(json.dumps(row))
        if args.out:
            args.out.write_text(
                json.dumps(
                    {
                        "direct_pages_per_s": direct,
                        "two_requests_pages_per_s": two_requests,
                        "index_pages_per_s": indexed,
                        "options": results,
                    },
                    indent=2,
                )
            )
    finally:
        client.close()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
