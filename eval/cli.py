"""``vlembed eval``: ViDoRe through MTEB, an offline document set, parity reports.

Subcommands (each prints ``--help``):

- ``vidore``: MTEB's ViDoRe tasks (``--benchmark "ViDoRe(v1)"`` or ``--tasks ...``) on one or
  more models; writes MTEB result files and a task x model nDCG@5 table; with
  ``--multivector --storage SPEC...`` one column per index storage option (``float32``,
  ``pool2``, ``pool3-average``, ``binary``, ``pool2+binary``), each page embedded once;
- ``make-docs``: generate a local document-retrieval set (pages, queries, qrels);
- ``local``: the same MTEB harness on such a set, fully offline;
- ``parity``: variants against the reference on such a set (vectors, scores, rankings,
  nDCG@5/recall@5, per-patch heatmaps).

A model is ``http://HOST:PORT`` (a running ``vlembed serve``), ``reference:DIR`` (the PyTorch
reference on a checkpoint) or ``reference`` (tiny random checkpoint, smoke tests only), each
optionally prefixed with ``LABEL=`` to name its column.

Exit status: 0 success, 1 the model or service failed, 2 bad arguments or missing data.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["build_parser", "main"]


def _add_http_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("HTTP models")
    g.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    g.add_argument("--retries", type=int, default=5, help="retries on timeouts and 429/503/504")
    g.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    g.add_argument("--served-model", help="model id to request (default: first in /v1/models)")
    g.add_argument(
        "--api-key",
        default=os.environ.get("VLEMBED_API_KEY"),
        help="bearer token for services started with --api-key (default: $VLEMBED_API_KEY)",
    )


def _http_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "timeout": args.timeout,
        "max_retries": args.retries,
        "concurrency": args.concurrency,
        "model": args.served_model,
        "api_key": args.api_key,
    }


def _storage_spec(text: str) -> Any:
    from vlembed.index.codec import StorageOptions

    try:
        return StorageOptions.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _add_storage_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--storage",
        action="append",
        type=_storage_spec,
        metavar="SPEC",
        help="with --multivector: score pages as an index stored with these options "
        "(float32, binary, poolN, poolN-average, joined by '+'); repeat for more columns",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlembed eval",
        description="ViDoRe through MTEB, an offline document benchmark, parity reports.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    vid = sub.add_parser("vidore", help="run MTEB's ViDoRe tasks on one or more models")
    which = vid.add_mutually_exclusive_group()
    which.add_argument("--benchmark", help='MTEB benchmark name (default "ViDoRe(v1)")')
    which.add_argument("--tasks", nargs="+", metavar="NAME", help="MTEB task names")
    vid.add_argument(
        "--model", action="append", default=[], metavar="SPEC", help="repeat for more columns"
    )
    vid.add_argument("--multivector", action="store_true", help="MaxSim over per-token rows")
    vid.add_argument("--dimensions", type=int, help="Matryoshka truncation (single vector)")
    _add_storage_option(vid)
    vid.add_argument("--out", type=Path, help="results folder (default: MTEB's cache)")
    vid.add_argument("--offline", action="store_true", help="never contact the Hugging Face hub")
    vid.add_argument("--download", action="store_true", help="only fetch the datasets, then exit")
    vid.add_argument("--resume", action="store_true", help="keep results already in --out")
    vid.add_argument("--batch-size", type=int, default=8)
    _add_http_options(vid)

    mk = sub.add_parser("make-docs", help="generate a local document-retrieval set")
    mk.add_argument("--out", type=Path, required=True)
    mk.add_argument("--n-pages", type=int, default=40)
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--scale", type=float, default=1.0, help="page size factor (tests: 0.25)")

    loc = sub.add_parser("local", help="run the MTEB harness on a local document set")
    loc.add_argument("--docs", type=Path, required=True)
    loc.add_argument("--model", action="append", required=True, metavar="SPEC")
    loc.add_argument("--multivector", action="store_true")
    loc.add_argument("--dimensions", type=int)
    _add_storage_option(loc)
    loc.add_argument("--out", type=Path, help="results folder (default: MTEB's cache)")
    loc.add_argument("--batch-size", type=int, default=8)
    _add_http_options(loc)

    par = sub.add_parser("parity", help="compare variants with the reference on a document set")
    par.add_argument("--models", required=True, help="comma-separated specs, baseline first")
    par.add_argument("--docs", type=Path, required=True)
    par.add_argument("--out", type=Path, required=True)
    par.add_argument("--heatmaps", type=int, default=4, help="pages per variant to draw")
    par.add_argument("--single-only", action="store_true", help="skip multi-vector comparisons")
    _add_http_options(par)
    return parser


def _open(spec_texts: Sequence[str], args: argparse.Namespace) -> tuple[list, list]:
    """Parse all specs first (cheap, catches typos), then open the backends in order."""
    from eval.backends import open_backend, parse_spec

    specs = [parse_spec(s) for s in spec_texts]
    backends = []
    opened: dict[tuple[str, str | None], Any] = {}
    for spec in specs:
        key = (spec.kind, spec.target)
        if key not in opened:  # the same model twice (e.g. reference vs reference) loads once
            opened[key] = open_backend(spec, **(_http_options(args) if spec.kind == "http" else {}))
        backends.append(opened[key])
    return specs, backends


def _close(backends: Sequence[Any]) -> None:
    for backend in {id(b): b for b in backends}.values():
        backend.close()


def _mteb_models(args: argparse.Namespace, tasks: list, out: Path | None) -> dict[str, dict]:
    """Evaluate every --model on ``tasks``; return ``{column label: {task: MTEB scores}}``."""
    from eval.backends import column_labels
    from eval.report import slug

    if args.storage and not args.multivector:
        raise ValueError("--storage applies to multi-vectors: add --multivector")
    specs, backends = _open(args.model, args)
    columns: dict[str, dict] = {}
    try:
        labels = column_labels(specs, backends)
        for label, spec, backend in zip(labels, specs, backends, strict=True):
            name = f"vlembed/{slug(label)}" if spec.label or label != backend.name else None
            print(f"evaluating {label} on {len(tasks)} task(s)", file=sys.stderr)
            if args.storage:
                columns.update(_per_storage_option(args, name, label, backend, tasks, out))
                continue
            columns[label] = _run(args, name, backend, tasks, out)
    finally:
        _close(backends)
    return columns


def _run(
    args: argparse.Namespace, name: str | None, backend: Any, tasks: list, out: Path | None, **kw
) -> dict[str, dict]:
    from eval.mteb_encoder import VlembedEncoder
    from eval.mteb_run import evaluate, split_scores

    encoder = VlembedEncoder(
        name, backend=backend, multivector=args.multivector, dimensions=args.dimensions, **kw
    )
    results = evaluate(
        encoder, tasks, out, batch_size=args.batch_size, resume=getattr(args, "resume", False)
    )
    return {r.task_name: split_scores(r) for r in results}


def _per_storage_option(
    args: argparse.Namespace, name: str | None, label: str, backend: Any, tasks: list, out
) -> dict[str, dict]:
    """One column per ``--storage`` option; each task's inputs are embedded once for all."""
    from eval.backends import RememberingBackend

    remembering = RememberingBackend(backend)
    columns: dict[str, dict] = {f"{label} {o.spec}": {} for o in args.storage}
    for task in tasks:
        for options in args.storage:
            scores = _run(args, name, remembering, [task], out, storage=options)
            columns[f"{label} {options.spec}"].update(scores)
        remembering.forget()
    return columns


def _vidore(args: argparse.Namespace) -> int:
    from eval import vidore

    if not args.model and not args.download:
        print("error: give --model SPEC (or --download to only fetch the data)", file=sys.stderr)
        return 2
    if args.offline:
        vidore.offline()  # before mteb/datasets are imported by anything below
    tasks = vidore.resolve_tasks(args.benchmark, args.tasks)
    names = [t.metadata.name for t in tasks]
    print(f"loading data for {len(tasks)} task(s): {', '.join(names)}", file=sys.stderr)
    missing = vidore.load_task_data(tasks)
    if missing:
        benchmark = None if args.tasks else (args.benchmark or vidore.DEFAULT_BENCHMARK)
        print(vidore.missing_message(missing, benchmark=benchmark), file=sys.stderr)
        return 2
    if args.download:
        print(f"all {len(tasks)} dataset(s) are in the local cache", file=sys.stderr)
        return 0
    columns = _mteb_models(args, tasks, args.out)
    return _print_scores(columns, names, args.out, "vidore")


def _print_scores(columns: dict[str, dict], names: list[str], out: Path | None, stem: str) -> int:
    from eval.report import score_table, write_json

    main = {
        label: {t: s["main_score"] for t, s in scores.items()} for label, scores in columns.items()
    }
    table = score_table(main, names)
    print(table)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}_table.md").write_text(table, encoding="utf-8")
        write_json(out / f"{stem}_scores.json", columns)
        print(f"wrote {out / f'{stem}_table.md'} and MTEB results under {out}", file=sys.stderr)
    return 0


def _make_docs(args: argparse.Namespace) -> int:
    import time

    from eval.make_docs import make_docs

    start = time.perf_counter()
    docs = make_docs(args.out, args.n_pages, args.seed, scale=args.scale)
    kinds = ", ".join(f"{n} {k}" for k, n in docs.manifest["kinds"].items())
    print(
        f"wrote {len(docs.corpus)} pages ({kinds}) and {len(docs.queries)} queries to "
        f"{args.out} in {time.perf_counter() - start:.1f} s",
        file=sys.stderr,
    )
    return 0


def _local(args: argparse.Namespace) -> int:
    from eval.local_task import local_task

    task = local_task(args.docs)
    columns = _mteb_models(args, [task], args.out)
    name = task.metadata.name
    for label, scores in columns.items():
        s = scores[name]
        print(f"{label}: nDCG@5 {s['ndcg_at_5'] * 100:.2f}  recall@5 {s['recall_at_5'] * 100:.2f}")
    if args.out is not None:
        from eval.report import write_json

        args.out.mkdir(parents=True, exist_ok=True)
        write_json(args.out / "local_scores.json", columns)
    return 0


def _parity(args: argparse.Namespace) -> int:
    from eval.docset import read_docset
    from eval.parity import run_parity

    docs = read_docset(args.docs)
    spec_texts = [s for s in args.models.split(",") if s.strip()]
    specs, backends = _open(spec_texts, args)
    try:
        run_parity(
            specs,
            backends,
            docs,
            args.out,
            multivector=not args.single_only,
            n_heatmaps=args.heatmaps,
        )
    finally:
        _close(backends)
    print((args.out / "parity.md").read_text(encoding="utf-8"))
    print(f"wrote {args.out / 'parity.md'}, parity.json and heatmaps/", file=sys.stderr)
    return 0


_COMMANDS = {"vidore": _vidore, "make-docs": _make_docs, "local": _local, "parity": _parity}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``vlembed eval``; returns the exit status (see the module docstring)."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    from vlembed.errors import ServiceError

    try:
        return _COMMANDS[args.command](args)
    except ServiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
