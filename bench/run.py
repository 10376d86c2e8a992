"""``vlembed bench``: throughput against the PyTorch reference, side by side, in one run.

Everything is measured on this machine in the same run, so the ratios are what matter: the HF
reference (f32, bf16), the upstream raw-image path, and vlembed end to end through its HTTP
service at each GGUF variant; preprocessing alone against HF's PIL processor; the service's own
overhead (time in the service minus time waiting on llama-server); and scaling with requests in
flight. Each number is the median of ``--repeats`` runs after a warm-up, with min/max spread.
Results go to a JSON file and docs/BENCHMARKS.md (tables + a PNG chart).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from PIL import Image

from bench.serving import REPO, ServeProcess, page_image, split_variant
from vlembed.client import image_data_uri as data_uri
from vlembed.constants import DTYPES
from vlembed.tasks import IMAGE_TEMPLATE, TEXT_PREFIX

# TEXT[/MMPROJ]: the text GGUF variant and, after a slash, the vision tower's (default: what
# serve picks). Quantised text and towers are made from the bf16 conversion.
VARIANTS = (
    "f32",
    "f16",
    "bf16",
    "Q8_0/bf16",
    "Q8_0/Q8_0",
    "Q6_K/Q6_K",
    "Q4_K_M/bf16",
    "Q4_K_M/Q4_K_M",
    "IQ4_XS/Q4_K_M",
)


def stats(samples: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(samples),
        "min": min(samples),
        "max": max(samples),
        "n": len(samples),
    }


def timed(fn: Callable[[], object], repeats: int, warmup: int = 1) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return stats(out)


def bench_text(n_tokens: int, tokenizer) -> str:
    words = (
        "the invoice total for the third quarter rose sharply while operating costs fell "
        "across every region reported in the annual filing"
    ).split()
    text, i = [], 0
    while len(tokenizer.encode(TEXT_PREFIX["passage"] + " ".join(text)).ids) < n_tokens:
        text.append(words[i % len(words)])
        i += 1
    return " ".join(text)


# --- the pieces -------------------------------------------------------------------------------


def prepare_models(preset: str, cache: Path, variants: list[str]) -> tuple[Path, dict[str, Path]]:
    """The checkpoint and, per variant label, the converted directory that serves it."""
    from gguf_convert.convert import convert
    from gguf_convert.synthetic import make_checkpoint

    hf = cache / f"{preset}-hf"
    if not (hf / "config.json").is_file():
        print(f"making the {preset} checkpoint", file=sys.stderr)
        make_checkpoint(hf, preset, 0)
    split = {v: split_variant(v) for v in variants}
    text_quants = sorted({t for t, _ in split.values() if t not in DTYPES})
    mm_quants = sorted({m for _, m in split.values() if m not in (*DTYPES, "auto")})
    dirs: dict[str, Path] = {}
    for dtype in DTYPES:
        base = dtype == "bf16"  # quantised files are made from bf16
        wanted = [v for v, (t, _) in split.items() if t == dtype or (base and t not in DTYPES)]
        if not wanted:
            continue
        out = cache / f"{preset}-{dtype}"
        convert(
            hf,
            out,
            tasks=["retrieval"],
            dtype=dtype,
            quants=text_quants if base else [],
            mmproj_quants=mm_quants if base else [],
            progress=lambda _: None,
        )
        for v in wanted:
            dirs[v] = out
    return hf, dirs


def bench_reference(
    hf: Path, img: Image.Image, page: Image.Image, text: str, repeats: int, threads: int
) -> dict:
    import torch

    from eval.reference import ReferenceEmbedder

    torch.set_num_threads(threads)
    out = {}
    for name, dtype in (("hf-f32", torch.float32), ("hf-bf16", torch.bfloat16)):
        ref = ReferenceEmbedder(hf, dtype=dtype)
        n_text = len(ref.encode_text(text, "passage").token_ids)
        out[name] = {
            "image_s": timed(lambda ref=ref: ref.encode_image(img), repeats),
            "page_s": timed(lambda ref=ref: ref.encode_image(page), repeats),
            "text_s": timed(lambda ref=ref: ref.encode_text(text, "passage"), repeats),
            "text_tokens": n_text,
        }
        del ref
    return out


def bench_preprocess(repeats: int) -> dict:
    from transformers import Qwen2VLImageProcessorPil

    from preprocess_service.image import patchify

    hf = Qwen2VLImageProcessorPil(size={"shortest_edge": 3136, "longest_edge": 602112})
    out = {}
    for name, size in (
        ("448x448", (448, 448)),
        ("page 1275x1650", (1275, 1650)),
        ("photo 4000x3000", (4000, 3000)),
    ):
        img = page_image(*size, seed=1)
        ours = timed(lambda img=img: patchify(img), repeats * 3)
        theirs = timed(lambda img=img: hf(images=[img], return_tensors="np"), repeats * 3)
        out[name] = {
            "vlembed_s": ours,
            "hf_s": theirs,
            "speedup": theirs["median"] / ours["median"],
        }
    return out


def bench_vlembed(
    dirs: dict[str, Path],
    img: Image.Image,
    page: Image.Image,
    text: str,
    repeats: int,
    threads: int,
) -> dict:
    out = {}
    uri = data_uri(img)
    page_uri = data_uri(page)
    for variant, model_dir in dirs.items():
        svc = ServeProcess(model_dir, variant, threads, parallel=1)
        try:
            with httpx.Client() as client:
                img_body = {"input": [{"image": uri}], "task": "retrieval.passage"}
                page_body = {"input": [{"image": page_uri}], "task": "retrieval.passage"}
                text_body = {"input": [text], "task": "retrieval.passage"}
                res = {}
                for name, body in (("image", img_body), ("page", page_body), ("text", text_body)):
                    svc.post(client, body)  # warm-up
                    totals, backends = [], []
                    for _ in range(repeats):
                        total, backend = svc.post(client, body)
                        totals.append(total)
                        backends.append(backend)
                    res[f"{name}_s"] = stats(totals)
                    res[f"{name}_overhead"] = stats(
                        [(t - b) / b for t, b in zip(totals, backends, strict=True)]
                    )
                out[f"vlembed-{variant}"] = res
        finally:
            svc.stop()
    return out


def bench_raw_path(dirs: dict[str, Path], img: Image.Image, repeats: int, threads: int) -> dict:
    """The upstream raw-image path (llama.cpp's own resize + conv2d) vs precomputed patches,
    straight against llama-server at F32 (no service in between)."""
    from preprocess_service.image import patchify
    from preprocess_service.supervisor import (
        ManagedServer,
        ServerSpec,
        free_port,
        llama_server_binary,
    )
    from vlembed.wire import encode_patches

    model_dir = dirs.get("f32") or next(iter(dirs.values()))
    manifest = json.loads((model_dir / "manifest.json").read_text())
    spec = ServerSpec(
        binary=llama_server_binary(),
        model=model_dir / manifest["tasks"]["retrieval"]["text"]["f32"],
        mmproj=model_dir / next(iter(manifest["mmproj"].values())),
        port=free_port(),
        parallel=1,
        threads=threads,
        ctx_per_slot=2048,
    )
    server = ManagedServer(spec, Path("/dev/null"))
    server.start()
    try:
        with httpx.Client(timeout=600) as client:
            for _ in range(600):
                try:
                    if client.get(spec.url + "/health").status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            marker = client.get(spec.url + "/props").json()["media_marker"]
            prompt = IMAGE_TEMPLATE.format(image=marker)
            buf = io.BytesIO()
            img.save(buf, "PNG")
            raw = {
                "content": {
                    "prompt_string": prompt,
                    "multimodal_data": [base64.b64encode(buf.getvalue()).decode()],
                },
                "rows_format": "f32",
            }
            pre = {
                "content": {
                    "prompt_string": prompt,
                    "multimodal_patches": [encode_patches(*patchify(img))],
                },
                "rows_format": "f32",
            }
            return {
                "raw_image_s": timed(
                    lambda: client.post(spec.url + "/embeddings", json=raw).raise_for_status(),
                    repeats,
                ),
                "precomputed_s": timed(
                    lambda: client.post(spec.url + "/embeddings", json=pre).raise_for_status(),
                    repeats,
                ),
            }
    finally:
        server.stop()


def bench_concurrency(
    model_dir: Path,
    variant: str,
    img: Image.Image,
    threads: int,
    levels: tuple[int, ...] = (1, 2, 4, 8),
    per_level: int = 8,
) -> dict:
    svc = ServeProcess(model_dir, variant, threads, parallel=max(levels))
    uri = data_uri(img)
    out = {}
    try:
        with httpx.Client(limits=httpx.Limits(max_connections=32)) as client:
            body = {"input": [{"image": uri}], "task": "retrieval.passage"}
            svc.post(client, body)
            for level in levels:
                t = time.perf_counter()
                with ThreadPoolExecutor(level) as pool:
                    list(pool.map(lambda _: svc.post(client, body), range(per_level)))
                took = time.perf_counter() - t
                out[str(level)] = {"images_per_s": per_level / took, "seconds": took}
    finally:
        svc.stop()
    return out


# (label, image sizes of the requests in flight); in flight = slots. Mixed sizes only share a
# forward since patch 0009.
BATCHING_CASES = (
    ("448x448", [(448, 448)] * 4),
    ("224x224", [(224, 224)] * 8),
    ("448x448, 336x448, 448x336, 392x392", [(448, 448), (336, 448), (448, 336), (392, 392)]),
    ("pages 1275x1650 + 1650x1275", [(1275, 1650), (1650, 1275)]),
)


def bench_vision_batching(model_dir: Path, variant: str, threads: int, repeats: int) -> dict:
    """The images of concurrent requests in one vision forward (patches 0006, 0009) against one
    image per forward: throughput with as many requests in flight as slots, and peak memory."""
    from preprocess_service.supervisor import VISION_BATCH_TOKENS

    out = {}
    for label, sizes in BATCHING_CASES:
        in_flight = len(sizes)
        uris = [data_uri(page_image(w, h, seed=s)) for s, (w, h) in enumerate(sizes)]
        bodies = [{"input": [{"image": u}], "task": "retrieval.passage"} for u in uris]
        for tokens in (1, VISION_BATCH_TOKENS):
            svc = ServeProcess(
                model_dir, variant, threads, parallel=in_flight, vision_batch_tokens=tokens
            )
            try:
                with httpx.Client(limits=httpx.Limits(max_connections=32)) as client:
                    svc.post(client, bodies[0])
                    rates = []
                    for _ in range(repeats):
                        t = time.perf_counter()
                        with ThreadPoolExecutor(in_flight) as pool:
                            list(pool.map(lambda b, svc=svc: svc.post(client, b), bodies * 2))
                        rates.append(2 * in_flight / (time.perf_counter() - t))
                    out[f"{label}, {in_flight} in flight, batch {tokens}"] = {
                        "images": label,
                        "in_flight": in_flight,
                        "vision_batch_tokens": tokens,
                        "images_per_s": stats(rates),
                        "peak_rss_mb": svc.peak_rss_mb(),
                    }
            finally:
                svc.stop()
    return out


def patch_wire_bytes(page: Image.Image) -> dict[str, int]:
    """Bytes of one page's llama-server request body, f32 JSON vs VLP1 (prompt included)."""
    from preprocess_service.image import patch_levels
    from vlembed.wire import encode_patches, encode_patches_body

    levels = patch_levels(page)
    request = {"content": {"prompt_string": IMAGE_TEMPLATE}, "rows_format": "f32"}
    as_json = {
        **request,
        "content": {
            "prompt_string": IMAGE_TEMPLATE,
            "multimodal_patches": [encode_patches(levels.rows(), levels.grid)],
        },
    }
    return {
        "patches": levels.levels.shape[0],
        "f32": len(json.dumps(as_json).encode()),
        "auto": len(encode_patches_body(request, [levels])),
    }


def bench_patch_transport(
    model_dir: Path,
    variant: str,
    page: Image.Image,
    threads: int,
    repeats: int,
    preset: str,
    rounds: int = 2,
) -> dict:
    """Pages through the service with f32 JSON patches vs VLP1 bodies (``--patch-transport``),
    one serve after the other, ``rounds`` times alternating so that drift of a shared machine
    hits both; per transport, every page's time over all rounds."""
    body = {"input": [{"image": data_uri(page)}], "task": "retrieval.passage"}
    times: dict[str, list[float]] = {"f32": [], "auto": []}
    backend: dict[str, list[float]] = {"f32": [], "auto": []}
    for _ in range(rounds):
        for transport in times:
            svc = ServeProcess(model_dir, variant, threads, parallel=1, patch_transport=transport)
            try:
                with httpx.Client() as client:
                    svc.post(client, body)  # warm-up
                    for _ in range(repeats):
                        total, waited = svc.post(client, body)
                        times[transport].append(total)
                        backend[transport].append(waited)
            finally:
                svc.stop()
    wire = patch_wire_bytes(page)
    return {
        "preset": preset,
        "date": time.strftime("%Y-%m-%d"),
        "threads": threads,
        "variant": variant,
        "rounds": rounds,
        "patches": wire["patches"],
        "runs": {
            t: {"page_s": stats(times[t]), "backend_s": stats(backend[t]), "wire_bytes": wire[t]}
            for t in times
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vlembed bench", description=__doc__.splitlines()[0])
    p.add_argument(
        "--preset",
        default="bench",
        choices=["tiny", "bench", "full"],
        help="full: the document-page benchmark on the real depth alone (bench.full_page)",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--image-size", type=int, default=448)
    p.add_argument("--text-tokens", type=int, default=443)
    p.add_argument(
        "--skip",
        default="",
        help="comma list of: hf,preprocess,vlembed,raw,concurrency,batching,transport,quality",
    )
    p.add_argument("--json", type=Path, default=REPO / "docs" / "benchmarks.json")
    p.add_argument("--markdown", type=Path, default=REPO / "docs" / "BENCHMARKS.md")
    args, rest = p.parse_known_args(argv)
    if args.preset == "full":
        from bench.full_page import main as full_page

        return full_page([*rest, "--repeats", str(args.repeats), "--threads", str(args.threads)])
    if rest:
        p.error(f"unrecognized arguments: {' '.join(rest)}")
    from vlembed.paths import cache_root

    skip = set(filter(None, args.skip.split(",")))
    variants = [v for v in args.variants.split(",") if v]
    hf, dirs = prepare_models(args.preset, cache_root() / "bench", variants)
    from tokenizers import Tokenizer

    text = bench_text(args.text_tokens, Tokenizer.from_file(str(hf / "tokenizer.json")))
    img = page_image(args.image_size, args.image_size)
    # a US-letter page scanned at 150 dpi: 2976 patches, 744 image tokens at the default limit
    page = page_image(1275, 1650, seed=1)
    results: dict = {
        "machine": {
            "cpu_count": os.cpu_count(),
            "platform": platform.platform(),
            "processor": _cpu_name(),
            "threads": args.threads,
        },
        "preset": args.preset,
        "repeats": args.repeats,
        "image": f"{args.image_size}x{args.image_size}",
        "date": time.strftime("%Y-%m-%d"),
    }
    if "hf" not in skip:
        results["reference"] = bench_reference(hf, img, page, text, args.repeats, args.threads)
    if "preprocess" not in skip:
        results["preprocess"] = bench_preprocess(args.repeats)
    if "quality" not in skip:
        from bench.quality import measure

        results["quality"] = measure(hf, dirs, args.threads)
    if "vlembed" not in skip:
        results["vlembed"] = bench_vlembed(dirs, img, page, text, args.repeats, args.threads)
    if "raw" not in skip:
        results["raw_path"] = bench_raw_path(dirs, img, args.repeats, args.threads)
    if "concurrency" not in skip:
        best = "Q4_K_M/Q4_K_M" if "Q4_K_M/Q4_K_M" in dirs else next(iter(dirs))
        results["concurrency"] = {
            "variant": best,
            "levels": bench_concurrency(dirs[best], best, img, args.threads),
        }
    if "batching" not in skip:
        best = "Q4_K_M/Q4_K_M" if "Q4_K_M/Q4_K_M" in dirs else next(iter(dirs))
        results["vision_batching"] = {
            "variant": best,
            "runs": bench_vision_batching(dirs[best], best, args.threads, args.repeats),
        }
    if "transport" not in skip:
        best = "Q4_K_M/Q4_K_M" if "Q4_K_M/Q4_K_M" in dirs else next(iter(dirs))
        results["patch_transport"] = bench_patch_transport(
            dirs[best], best, page, args.threads, args.repeats, args.preset
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2))
    from bench.report import write_report

    write_report(results, args.markdown)
    print(args.markdown)
    return 0


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())
