"""``vlembed index`` and ``vlembed search``: thin command lines over :class:`vlembed.Index`.

Without ``--server`` each command starts its own ``vlembed serve`` (same ``--model`` flag and
default as ``vlembed serve``) and stops it at the end. ``vlembed index --ray`` runs the same job
as a Ray Data pipeline against every ``--server`` given (:mod:`vlembed.index.distributed`).
Exit status: 0 when everything was indexed, 1 when some file was skipped or named nothing (the
summary says which), 2 when the run could not proceed (service unreachable, another model's
index, bad flags, Ray missing).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Iterator, Sequence

from vlembed.client import Client
from vlembed.errors import ServiceError
from vlembed.index.api import DEFAULT_INDEX, Index
from vlembed.index.codec import MAX_POOL_FACTOR, POOL_METHODS, StorageOptions
from vlembed.index.store import ModelMismatchError

__all__ = ["command_main", "index_main", "search_main"]


def _service_flags(p: argparse.ArgumentParser, servers: bool = False) -> None:
    p.add_argument(
        "--index", default=DEFAULT_INDEX, help="index directory or URI (s3://…) [%(default)s]"
    )
    if servers:
        p.add_argument(
            "--server",
            action="append",
            help="URL of a running vlembed serve (default: start one); with --ray, repeat it "
            "for each replica",
        )
    else:
        p.add_argument("--server", help="URL of a running vlembed serve (default: start one)")
    p.add_argument(
        "--model", help="model for the service started without --server (as vlembed serve)"
    )
    p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="argument for the started vlembed serve, repeatable (--serve-arg=--threads=2)",
    )
    p.add_argument("--api-key", help="bearer token of the service")


@contextlib.contextmanager
def _servers(args: argparse.Namespace) -> Iterator[list[str]]:
    """The URLs of ``--server``, or of a service started for this command."""
    if args.server:
        yield args.server if isinstance(args.server, list) else [args.server]
        return
    from vlembed.index.service import local_service

    with local_service(args.model, args.serve_arg) as url:
        yield [url]


@contextlib.contextmanager
def _client(args: argparse.Namespace, concurrency: int = 1) -> Iterator[Client]:
    with _servers(args) as urls:
        with Client(urls[0], api_key=args.api_key, concurrency=concurrency) as client:
            yield client


def _index_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="vlembed index", description="index PDFs and images into a local document index"
    )
    p.add_argument("paths", nargs="+", metavar="PATH", help="files, folders (recursive), globs")
    _service_flags(p, servers=True)
    p.add_argument(
        "--pool-factor",
        type=int,
        choices=range(1, MAX_POOL_FACTOR + 1),
        help="new index: keep ~1 multi-vector row in N (hierarchical token pooling) [1]",
    )
    p.add_argument("--pool-method", choices=POOL_METHODS, default="ward", help="[%(default)s]")
    p.add_argument("--binary", action="store_true", help="new index: store sign bits of rows")
    p.add_argument("--concurrency", type=int, default=3, help="requests in flight [%(default)s]")
    p.add_argument("--batch", type=int, default=2, help="pages per request [%(default)s]")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    ray = p.add_argument_group("Ray (pip install 'vlembed[ray]')")
    ray.add_argument(
        "--ray",
        nargs="?",
        const="",
        metavar="ADDRESS",
        help="run as a Ray Data job: on a local Ray without ADDRESS, else on the cluster at "
        "ADDRESS (auto, ray://host:port, host:port); write --ray=ADDRESS before the paths",
    )
    ray.add_argument(
        "--per-server",
        type=int,
        default=2,
        help="with --ray: embedding actors (requests in flight) per --server [%(default)s]",
    )
    return p


def _ray_address(value: str) -> str | None:
    """``--ray``'s ADDRESS, refusing what looks like a path swallowed by the optional value."""
    if value == "":
        return None
    if value in ("auto", "local") or "://" in value or re.fullmatch(r"[\w.-]+:\d+", value):
        return value
    raise ValueError(
        f"--ray ADDRESS must be auto, local, ray://host:port or host:port, got {value!r} "
        "(a path right after --ray is taken as its ADDRESS: put --ray after the paths)"
    )


def _index_ray(args: argparse.Namespace, options: StorageOptions | None) -> int:
    from vlembed.index.distributed import add_paths_ray

    address = _ray_address(args.ray)
    index = Index(args.index)
    with _servers(args) as urls:
        report = add_paths_ray(
            index.store,
            args.paths,
            urls,
            options,
            address=address,
            api_key=args.api_key,
            per_server=args.per_server,
            pages_per_request=args.batch,
            progress=not args.quiet,
        )
    print(report.summary(), file=sys.stderr)
    return 0 if report.ok else 1


def index_main(argv: Sequence[str]) -> int:
    args = _index_parser().parse_args(argv)
    if args.concurrency < 1 or args.batch < 1:
        print("vlembed index: --concurrency and --batch must be >= 1", file=sys.stderr)
        return 2
    options = None
    if args.pool_factor is not None or args.binary:
        options = StorageOptions(args.pool_factor or 1, args.pool_method, args.binary)
    if args.ray is not None:
        try:
            return _index_ray(args, options)
        except (ServiceError, ModelMismatchError, ValueError, RuntimeError) as exc:
            print(f"vlembed index: {exc}", file=sys.stderr)
            return 2
    if args.server and len(args.server) > 1:
        print("vlembed index: several --server need --ray", file=sys.stderr)
        return 2
    index = Index(args.index)
    try:
        with _client(args, concurrency=1) as client:
            report = index.add(
                args.paths,
                client=client,
                options=options,
                concurrency=args.concurrency,
                pages_per_request=args.batch,
                progress=not args.quiet,
            )
    except (ServiceError, ModelMismatchError, ValueError, RuntimeError) as exc:
        print(f"vlembed index: {exc}", file=sys.stderr)
        return 2
    print(report.summary(), file=sys.stderr)
    return 0 if report.ok else 1


def _search_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vlembed search", description="search a document index")
    p.add_argument("query", help="the question")
    _service_flags(p)
    p.add_argument("-k", type=int, default=10, help="hits [%(default)s]")
    p.add_argument("--candidates", type=int, help="first-stage candidates [max(4k, 50)]")
    p.add_argument("--json", action="store_true", help="one JSON document on stdout")
    return p


def search_main(argv: Sequence[str]) -> int:
    args = _search_parser().parse_args(argv)
    index = Index(args.index)
    if index.meta is None:
        print(f"vlembed search: {index.path} is not an index (run vlembed index)", file=sys.stderr)
        return 2
    try:
        with _client(args) as client:
            hits = index.search(args.query, k=args.k, client=client, candidates=args.candidates)
    except (ServiceError, ModelMismatchError, ValueError, RuntimeError) as exc:
        print(f"vlembed search: {exc}", file=sys.stderr)
        return 2
    if args.json:
        json.dump({"query": args.query, "hits": [h.to_json() for h in hits]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for rank, hit in enumerate(hits, 1):
            print(f"{rank:3d}  {hit.score:10.4f}  {hit.source}  page {hit.page}")
    return 0


def command_main(name: str, argv: Sequence[str]) -> int:
    """Entry point used by ``vlembed.cli`` for both subcommands."""
    if name == "index":
        return index_main(argv)
    if name == "search":
        return search_main(argv)
    raise ValueError(f"unknown command {name!r}; valid: index, search")
