"""``vlembed bench --preset full``: a document page on jina-embeddings-v4's full shape.

The ``full`` preset is the real model's depth and widths (3.75 B parameters), so a page pays for
all 32 vision layers (28 of them window layers) and all 36 LLM layers, which the ``bench``
preset's 4 + 4 layers under-weight. HF f32 alone needs ~15 GB, so the engines run one after
another, each in its own process that exits before the next starts, and each engine's peak
resident memory is that process tree's own (VmHWM): the HF Python process, or ``vlembed serve``
plus its llama-server. The machine's load average and available memory are recorded around
every engine, because a shared machine's neighbours move these numbers.

Writes docs/benchmarks-full.json and docs/BENCHMARKS.full.md, and puts that section into
docs/BENCHMARKS.md between markers (``vlembed bench`` keeps it when it rewrites the rest).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.serving import REPO, ServeProcess, page_image, split_variant

# HF reference engines (the torch dtype), then vlembed variants (TEXT/MMPROJ, as bench.run).
HF_ENGINES = {"hf-f32": "float32", "hf-bf16": "bfloat16"}
VLEMBED_VARIANTS = ("bf16/bf16", "Q8_0/Q8_0", "Q4_K_M/Q4_K_M")
# Available memory an HF engine needs before it starts: the weights in its dtype plus
# activations and the interpreter (3.75 B x 4 or 2 bytes, plus ~1.5 GB).
HF_NEEDS_GB = {"hf-f32": 16.5, "hf-bf16": 9.0}
PAGE_SIZE = (1275, 1650)  # a US-letter page at 150 dpi: 2976 patches, 744 image tokens
MARK_START = "<!-- full-page:start -->"
MARK_END = "<!-- full-page:end -->"


def machine_state() -> dict[str, float]:
    """Load averages (1, 5, 15 min) and available memory, as ``uptime`` and ``free`` show."""
    load = os.getloadavg()
    avail_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            avail_kb = int(line.split()[1])
    return {
        "load1": load[0],
        "load5": load[1],
        "load15": load[2],
        "mem_available_gb": avail_kb / 2**20,
        "time": time.strftime("%H:%M:%S"),
    }


def vm_hwm_mb(pid: int) -> float:
    """Peak resident memory of one process (VmHWM), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmHWM for process {pid}")


def reset_peak(pid: int) -> None:
    """Start a process's VmHWM afresh from its current RSS (Linux ``clear_refs`` 5)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def tree_pids(pid: int) -> list[int]:
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [pid, *(p for c in children for p in tree_pids(int(c)))]


def tree_peak_mb(pid: int) -> float:
    """Sum of the peaks of a process and its descendants; an upper bound of their joint peak,
    and equal to it when, as here, the service's own memory hardly moves."""
    return sum(vm_hwm_mb(p) for p in tree_pids(pid))


def wait_for_memory(need_gb: float, patience_s: float) -> dict[str, float]:
    """The machine state once ``need_gb`` is available, or after ``patience_s`` regardless."""
    deadline = time.monotonic() + patience_s
    state = machine_state()
    while state["mem_available_gb"] < need_gb and time.monotonic() < deadline:
        time.sleep(15)
        state = machine_state()
    return state


def run_hf_engine(checkpoint: Path, dtype: str, warmup: int, repeats: int, threads: int) -> dict:
    """One HF engine in this process: load, ``warmup`` pages, ``repeats`` timed pages."""
    import torch

    from eval.reference import ReferenceEmbedder

    torch.set_num_threads(threads)
    page = page_image(*PAGE_SIZE, seed=1)
    t = time.perf_counter()
    ref = ReferenceEmbedder(checkpoint, dtype=getattr(torch, dtype))
    load_s = time.perf_counter() - t
    load_peak = vm_hwm_mb(os.getpid())
    reset_peak(os.getpid())
    print(f"loaded in {load_s:.0f} s", file=sys.stderr, flush=True)
    for _ in range(warmup):
        t = time.perf_counter()
        ref.encode_image(page)
        print(f"warm-up page {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
    pages = []
    for _ in range(repeats):
        t = time.perf_counter()
        ref.encode_image(page)
        pages.append(time.perf_counter() - t)
        print(f"page {pages[-1]:.1f} s", file=sys.stderr, flush=True)
    return {
        "page_s": pages,
        "load_s": load_s,
        "load_peak_rss_mb": load_peak,
        "peak_rss_mb": vm_hwm_mb(os.getpid()),
    }


def hf_engine(name: str, checkpoint: Path, warmup: int, repeats: int, threads: int) -> dict:
    """An HF engine in its own Python process, so its peak memory is its own and is freed."""
    cmd = [
        sys.executable,
        "-m",
        "bench.full_page",
        "--hf-engine",
        HF_ENGINES[name],
        "--checkpoint",
        str(checkpoint),
        "--warmup",
        str(warmup),
        "--repeats",
        str(repeats),
        "--threads",
        str(threads),
    ]
    # stderr passes through: the child's per-page progress lines show while it runs
    proc = subprocess.run(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed with exit status {proc.returncode}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def vlembed_engine(model_dir: Path, variant: str, warmup: int, repeats: int, threads: int) -> dict:
    """``vlembed serve`` at ``variant``: ``warmup`` pages, ``repeats`` timed pages end to end."""
    from vlembed.client import image_data_uri

    body = {
        "input": [{"image": image_data_uri(page_image(*PAGE_SIZE, seed=1))}],
        "task": "retrieval.passage",
    }
    t = time.perf_counter()
    svc = ServeProcess(model_dir, variant, threads, parallel=1, ready_timeout=1200)
    load_s = time.perf_counter() - t
    try:
        load_peak = tree_peak_mb(svc.proc.pid)
        for pid in tree_pids(svc.proc.pid):
            reset_peak(pid)
        with httpx.Client() as client:
            for _ in range(warmup):
                svc.post(client, body)
            pages = [svc.post(client, body)[0] for _ in range(repeats)]
            peak = tree_peak_mb(svc.proc.pid)
    finally:
        svc.stop()
    return {"page_s": pages, "load_s": load_s, "load_peak_rss_mb": load_peak, "peak_rss_mb": peak}


def run_engines(
    engines: list[str],
    hf: Path,
    dirs: dict[str, Path],
    warmup: int,
    repeats: int,
    threads: int,
    done: Callable[[str, dict], None],
) -> None:
    """Every engine in turn, each result handed to ``done`` as it comes (a long run that is
    stopped keeps what finished); one that cannot start (memory) or fails is recorded."""
    for name in engines:
        need = HF_NEEDS_GB.get(name, 0.0)
        before = wait_for_memory(need, patience_s=600)
        print(f"{name}: start {before}", file=sys.stderr, flush=True)
        res: dict = {"before": before, "warmup": warmup, "repeats": repeats}
        if before["mem_available_gb"] < need:
            res["skipped"] = f"{before['mem_available_gb']:.1f} GB available, {need} GB needed"
        else:
            try:
                if name in HF_ENGINES:
                    res.update(hf_engine(name, hf, warmup, repeats, threads))
                else:
                    variant = name.removeprefix("vlembed-")
                    res.update(vlembed_engine(dirs[variant], variant, warmup, repeats, threads))
            except (RuntimeError, httpx.HTTPError) as exc:
                res["failed"] = str(exc)[-500:]
        res["after"] = machine_state()
        print(f"{name}: {res}", file=sys.stderr, flush=True)
        done(name, res)


def _median_range(xs: list[float]) -> str:
    import statistics

    return f"{statistics.median(xs):.1f} ({min(xs):.1f}–{max(xs):.1f})"


# Load average (1 min) on 2 cores below which the machine counts as otherwise idle: the engine
# itself accounts for up to ~2.
IDLE_LOAD = 2.5


def _load_line(engines: dict) -> str:
    """Whether the machine was otherwise idle, as the load averages recorded around the engines
    say (a shared machine's neighbours move these numbers)."""
    loads = [r[k]["load1"] for r in engines.values() for k in ("before", "after") if k in r]
    if loads and max(loads) <= IDLE_LOAD:
        return (
            f"- machine otherwise idle: load average (1 min) {min(loads):.1f}–{max(loads):.1f} "
            "around the engines (one engine on 2 threads accounts for up to 2)."
        )
    return (
        "- **run on a loaded, shared machine**: other jobs ran at the same time, so absolute "
        "times are inflated and the ratios are noisy; the load average (1 min) around each "
        "engine is in the table."
    )


def report_section(results: dict) -> str:
    """The markdown section: one table, the machine, the load it ran under."""
    m = results["machine"]
    engines = results["engines"]
    base = engines.get("hf-f32", {}).get("page_s")
    lines = [
        MARK_START,
        "## Document page on the `full` preset (jina-embeddings-v4's real depth)",
        "",
        "Written by `vlembed bench --preset full` (docs/benchmarks-full.json). The `full` "
        "synthetic preset has the real model's shape: 36 LLM layers, 32 ViT layers (full "
        "attention in 7, 15, 23, 31), real widths and vocabulary, "
        f"{results['parameters'] / 1e9:.2f} B parameters, bf16 on disk in two shards; "
        "random weights. One 1275×1650 page (2976 patches, 744 image tokens); warm-up + timed "
        "pages per engine as listed, median (min–max) of the timed ones. Engines ran one after "
        "another, each in its own process. Peak RSS is VmHWM while embedding pages (reset once "
        "the engine is loaded): the HF Python process; `vlembed serve` plus its llama-server "
        "(summed). The load peak also counts the checkpoint pages safetensors maps while "
        "copying (page cache, not held afterwards). vlembed variants are TEXT/MMPROJ as in the "
        "tables above.",
        "",
        f"- machine: {m['processor']}, {m['cpu_count']} cores, {m['threads']} threads used, "
        f"{m['mem_total_gb']:.0f} GB RAM; date {results['date']}",
        _load_line(engines),
        *([f"- {results['note']}"] if results.get("note") else []),
        "",
        "| engine | pages | s/page | × HF f32 | peak RSS (GB) | load: s, peak RSS (GB) | "
        "load avg before → after | MemAvailable before (GB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    import statistics

    for name, r in engines.items():
        state = (
            f"{r['before']['load1']:.1f} → {r['after']['load1']:.1f} | "
            f"{r['before']['mem_available_gb']:.1f}"
        )
        if "page_s" not in r:
            why = r.get("skipped") or "failed: " + r.get("failed", "?").splitlines()[-1][:80]
            lines.append(f"| {name} | – | not run ({why}) | – | – | – | {state} |")
            continue
        speed = f"{statistics.median(base) / statistics.median(r['page_s']):.2f}" if base else "–"
        lines.append(
            f"| {name} | {r['warmup']} + {r['repeats']} | {_median_range(r['page_s'])} | {speed} | "
            f"{r['peak_rss_mb'] / 1024:.1f} | "
            f"{r['load_s']:.0f}, {r['load_peak_rss_mb'] / 1024:.1f} | {state} |"
        )
    lines.append(MARK_END)
    return "\n".join(lines) + "\n"


def insert_section(markdown: Path, section: str) -> None:
    """Replace the marked section of BENCHMARKS.md, or add it before the notes if absent."""
    text = markdown.read_text() if markdown.is_file() else "# Benchmarks\n"
    if MARK_START in text and MARK_END in text:
        head, rest = text.split(MARK_START, 1)
        tail = rest.split(MARK_END, 1)[1].lstrip("\n")
        text = head + section + ("\n" + tail if tail else "")
    else:
        text = text.rstrip("\n") + "\n\n" + section
    markdown.write_text(text)


def _write_section(results: dict, markdown: Path) -> None:
    section = report_section(results)
    (markdown.parent / "BENCHMARKS.full.md").write_text(section)
    insert_section(markdown, section)


def _machine(threads: int) -> dict:
    from bench.run import _cpu_name

    total_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            total_kb = int(line.split()[1])
    return {
        "processor": _cpu_name(),
        "cpu_count": os.cpu_count(),
        "threads": threads,
        "mem_total_gb": total_kb / 2**20,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vlembed bench --preset full", description=__doc__)
    p.add_argument("--preset", default="full")
    p.add_argument("--warmup", type=int, default=1, help="untimed pages per engine first")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument(
        "--engines",
        default=",".join([*HF_ENGINES, *(f"vlembed-{v}" for v in VLEMBED_VARIANTS)]),
    )
    p.add_argument("--json", type=Path, default=REPO / "docs" / "benchmarks-full.json")
    p.add_argument("--markdown", type=Path, default=REPO / "docs" / "BENCHMARKS.md")
    p.add_argument("--note", help="a line for the docs section (what ran, what did not, why)")
    p.add_argument(
        "--render", action="store_true", help="only rewrite the docs section from --json"
    )
    p.add_argument("--hf-engine", help=argparse.SUPPRESS)  # the child process of one HF engine
    p.add_argument("--checkpoint", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.hf_engine:
        res = run_hf_engine(
            args.checkpoint, args.hf_engine, args.warmup, args.repeats, args.threads
        )
        print(json.dumps(res))
        return 0
    if args.render:
        results = json.loads(args.json.read_text())
        if args.note is not None:
            results["note"] = args.note
            args.json.write_text(json.dumps(results, indent=2))
        _write_section(results, args.markdown)
        return 0

    from bench.run import prepare_models
    from gguf_convert.synthetic import PRESETS, parameter_count
    from vlembed.paths import cache_root

    engines = [e for e in args.engines.split(",") if e]
    variants = [e.removeprefix("vlembed-") for e in engines if e not in HF_ENGINES]
    for v in variants:
        split_variant(v)
    hf, dirs = prepare_models(args.preset, cache_root() / "bench", variants)
    results = {
        "machine": _machine(args.threads),
        "preset": args.preset,
        "parameters": parameter_count(PRESETS[args.preset]),
        "warmup": args.warmup,
        "repeats": args.repeats,
        "date": time.strftime("%Y-%m-%d"),
        "engines": {},
    }
    if args.note:
        results["note"] = args.note
    # A run of some engines keeps the others' results from an earlier run on the same machine.
    if args.json.is_file():
        earlier = json.loads(args.json.read_text())
        if all(earlier.get(k) == results[k] for k in ("preset", "machine")):
            for r in earlier["engines"].values():
                r.setdefault("warmup", earlier["warmup"])
                r.setdefault("repeats", earlier["repeats"])
            results["engines"] = earlier["engines"]

    def done(name: str, res: dict) -> None:
        results["engines"][name] = res
        args.json.write_text(json.dumps(results, indent=2))
        _write_section(results, args.markdown)

    run_engines(engines, hf, dirs, args.warmup, args.repeats, args.threads, done)
    print(args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
