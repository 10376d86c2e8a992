"""``vlembed convert``: a jina-v4 or Qwen2.5-VL checkpoint directory → GGUF files + manifest."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gguf_convert.convert import convert
from vlembed.constants import DTYPES, MMPROJ_QUANT_TYPES, QUANT_TYPES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vlembed convert", description=__doc__)
    p.add_argument("--hf", required=True, type=Path, help="Hugging Face checkpoint directory")
    p.add_argument("--out", required=True, type=Path, help="output directory (manifest.json)")
    p.add_argument(
        "--task",
        default="all",
        help="retrieval | text-matching | code | all (comma-separated list allowed)",
    )
    p.add_argument("--dtype", choices=DTYPES, default="f16")
    p.add_argument(
        "--quant",
        default="",
        help=f"comma-separated llama-quantize types for the text GGUFs: {', '.join(QUANT_TYPES)}",
    )
    p.add_argument(
        "--mmproj-quant",
        default="",
        help="comma-separated llama-quantize types for the vision tower: "
        f"{', '.join(MMPROJ_QUANT_TYPES)}; serve picks the one named like the text variant",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    tasks = [t.strip() for t in args.task.split(",") if t.strip()]
    quants = [q.strip() for q in args.quant.split(",") if q.strip()]
    mm_quants = [q.strip() for q in args.mmproj_quant.split(",") if q.strip()]
    try:
        manifest = convert(
            args.hf, args.out, tasks=tasks, dtype=args.dtype, quants=quants, mmproj_quants=mm_quants
        )
    except (FileNotFoundError, ValueError, RuntimeError) as exc:
        print(f"vlembed convert: error: {exc}", file=sys.stderr)
        return 2
    print(args.out / "manifest.json")
    for task, files in manifest.tasks.items():
        print(f"  {task}: {', '.join(files.text.values())}", file=sys.stderr)
    print(f"  vision: {', '.join(manifest.mmproj.values())}", file=sys.stderr)
    return 0
