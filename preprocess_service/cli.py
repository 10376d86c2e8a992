"""The ``vlembed`` console script: one entry point, one subcommand per job.

Each subcommand imports its package lazily, so ``vlembed serve`` never pulls in torch and a
base install (no extras) can run everything that serving needs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path


def _make_synthetic(args: argparse.Namespace) -> int:
    import time

    from eval.synthetic import make_checkpoint

    start = time.perf_counter()
    out = make_checkpoint(
        Path(args.out),
        args.preset,
        args.seed,
        layout=args.layout,
        vocab_gguf=Path(args.vocab) if args.vocab else None,
    )
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    took = time.perf_counter() - start
    print(f"wrote {args.preset} checkpoint ({size / 1e6:.1f} MB) in {took:.1f} s", file=sys.stderr)
    print(out)
    return 0


def _passthrough(module: str) -> Callable[[list[str]], int]:
    """Subcommands that own their argument parsing (``main(argv) -> int`` in ``module``)."""

    def run(argv: list[str]) -> int:
        import importlib

        return int(importlib.import_module(module).main(argv) or 0)

    return run


# subcommand -> module with main(argv); each parses its own flags
_DELEGATED: dict[str, tuple[str, str]] = {
    "build-server": ("llama_patches.build", "fetch, patch and build the pinned llama.cpp"),
    "convert": ("gguf_convert.cli", "convert a jina-v4 / Qwen2.5-VL checkpoint to GGUF"),
    "serve": ("preprocess_service.serve", "run the embeddings API (and its llama-servers)"),
    "eval": ("eval.cli", "ViDoRe / MTEB runs, offline document set, parity reports"),
    "bench": ("bench.run", "throughput against the PyTorch reference"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlembed", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    syn = sub.add_parser(
        "make-synthetic", help="write a random checkpoint in the real jina-embeddings-v4 layout"
    )
    syn.add_argument("--preset", choices=["tiny", "bench"], default="tiny")
    syn.add_argument("--seed", type=int, default=0)
    syn.add_argument("--out", required=True, help="directory to (re)create")
    syn.add_argument(
        "--layout",
        choices=["jina", "qwen"],
        default="jina",
        help="jina: jina-v4 layout with task adapters; qwen: plain Qwen2.5-VL, retrieval merged",
    )
    syn.add_argument("--vocab", help="ggml-vocab-qwen2.gguf (default: from the pinned llama.cpp)")
    syn.set_defaults(func=_make_synthetic)
    for name, (_, help_text) in _DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _DELEGATED:
        return _passthrough(_DELEGATED[argv[0]][0])(argv[1:])
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
