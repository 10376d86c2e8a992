"""The ``vlembed`` console script: one entry point, one subcommand per job.

Each subcommand lives in the package that does the job, as ``main(argv) -> int`` that parses its
own flags, and is imported only when it runs: ``vlembed serve`` never pulls in torch, a base
install (no extras) runs everything serving needs, and this module imports nothing of the
project (the table below names modules as strings).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# subcommand -> (module with main(argv), one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("preprocess_service.serve", "run the embeddings API (and its llama-servers)"),
    "index": ("vlembed.index.cli", "index PDFs and images into a local document index"),
    "search": ("vlembed.index.cli", "search a document index"),
    "ui": ("preprocess_service.ui.cli", "serve the search page over a document index"),
    "convert": ("gguf_convert.cli", "convert a jina-v4 / Qwen2.5-VL checkpoint to GGUF"),
    "make-synthetic": (
        "gguf_convert.synthetic",
        "write a random checkpoint in the real jina-embeddings-v4 layout",
    ),
    "build-server": ("llama_patches.build", "fetch, patch and build the pinned llama.cpp"),
    "eval": ("eval.cli", "ViDoRe / MTEB runs, offline document set, parity reports"),
    "bench": ("bench.run", "throughput against the PyTorch reference"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlembed", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"vlembed {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, help_text) in COMMANDS.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def _version() -> str:
    from vlembed import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # prints usage or the version, and exits
        return 2
    module = importlib.import_module(COMMANDS[argv[0]][0])
    runner = getattr(module, "command_main", None) if argv[0] in ("index", "search") else None
    if runner is not None:
        return int(runner(argv[0], argv[1:]) or 0)
    return int(module.main(argv[1:]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
