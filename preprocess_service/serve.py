"""``vlembed serve``: the embeddings API, with its llama-servers started and supervised here.

Every flag has an environment variable (``VLEMBED_*``) so containers configure it without a
command line. With no ``--model`` it makes the tiny random checkpoint, converts it and serves
it: a smoke test of the whole stack, loudly labelled as random weights.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import httpx

log = logging.getLogger("vlembed.serve")

VARIANTS = ("f32", "f16", "bf16", "Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "IQ4_XS", "IQ4_NL")


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"VLEMBED_{name}", default)


def build_parser() -> argparse.ArgumentParser:
    in_container = Path("/.dockerenv").exists()
    p = argparse.ArgumentParser(prog="vlembed serve", description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default=_env("MODEL"),
        help="converted directory (manifest.json) or a HF checkpoint to convert; "
        "default: a tiny random checkpoint (smoke test)",
    )
    p.add_argument("--host", default=_env("HOST", "0.0.0.0" if in_container else "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(_env("PORT", "8000") or 8000))
    p.add_argument(
        "--backend",
        action="append",
        metavar="[TASK=]URL",
        default=[b for b in (_env("BACKENDS") or "").split(",") if b.strip()],
        help="use running llama-servers instead of starting them (repeatable)",
    )
    p.add_argument("--api-key", default=_env("API_KEY"), help="require Authorization: Bearer KEY")
    p.add_argument(
        "--parallel",
        type=int,
        default=int(_env("PARALLEL", "2") or 2),
        help="slots per llama-server",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=int(_env("THREADS", "0") or 0) or None,
        help="threads per llama-server",
    )
    p.add_argument(
        "--variant",
        default=_env("VARIANT"),
        choices=VARIANTS,
        help="text GGUF variant (default: the converted dtype)",
    )
    p.add_argument(
        "--tasks",
        default=_env("TASKS"),
        help="comma-separated tasks to serve (default: all in the manifest)",
    )
    p.add_argument(
        "--ctx-size",
        type=int,
        default=int(_env("CTX_SIZE", "4096") or 4096),
        help="context per slot (tokens); also the batch size",
    )
    p.add_argument(
        "--max-queue",
        type=int,
        default=int(_env("MAX_QUEUE", "256") or 256),
        help="inputs in flight before answering 429",
    )
    p.add_argument(
        "--request-timeout", type=float, default=float(_env("REQUEST_TIMEOUT", "120") or 120)
    )
    p.add_argument(
        "--allow-url-fetch",
        action="store_true",
        default=_env("ALLOW_URL_FETCH", "") in ("1", "true"),
        help="fetch http(s) image URLs",
    )
    p.add_argument(
        "--allow-file-dir",
        default=_env("ALLOW_FILE_DIR"),
        help="serve file:// image paths inside this directory",
    )
    p.add_argument(
        "--flash-attn",
        default=_env("FLASH_ATTN", "auto"),
        choices=["auto", "on", "off"],
        help="flash attention in the language model; auto: off for the f32 (parity) "
        "variant, on otherwise (costs ~7e-6 of row cosine). The vision tower always uses it",
    )
    p.add_argument(
        "--mmproj-variant",
        default=_env("MMPROJ_VARIANT", "auto"),
        help="vision tower GGUF variant; auto: f32 for the f32 variant, else the one named like "
        "the text variant if converted (--mmproj-quant), else bf16, f16, f32",
    )
    p.add_argument(
        "--vision-batch-tokens",
        type=int,
        default=int(_env("VISION_BATCH_TOKENS", "1024") or 1024),
        help="encode same-size images of concurrent requests in one vision forward, up to this "
        "many image tokens (a 448x448 image is 256); 1 turns it off. Measured on 2 CPU cores: "
        "0-15%% more images/s with 4-8 requests in flight, 110-230 MB more peak memory",
    )
    p.add_argument(
        "--repack",
        default=_env("REPACK", "auto"),
        choices=["auto", "on", "off"],
        help="llama.cpp CPU weight repacking; auto: off for K-quant and IQ variants, whose "
        "tiled VNNI kernels only run on weights that are not repacked (1.55x text measured)",
    )
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "info"))
    return p


def default_model_dir() -> Path:
    """The tiny random checkpoint, converted (built once, cached)."""
    from llama_patches.build import cache_root

    log.warning("=" * 72)
    log.warning("no --model given: serving a TINY RANDOM-WEIGHT checkpoint (smoke test only)")
    log.warning("its vectors mean nothing; pass --model DIR for a real model")
    log.warning("=" * 72)
    root = cache_root() / "models"
    return resolve_model_dir(root / "tiny-random", make_tiny=True)


def resolve_model_dir(path: Path, make_tiny: bool = False) -> Path:
    """A converted directory as is; a HF checkpoint converted once into the cache."""
    if (path / "manifest.json").is_file():
        return path
    from llama_patches.build import cache_root

    if make_tiny:
        hf = path.with_name(path.name + "-hf")
        if not (hf / "config.json").is_file():
            from eval.synthetic import make_checkpoint

            make_checkpoint(hf, "tiny", 0)
        out = path
    elif (path / "config.json").is_file():
        hf = path
        out = cache_root() / "models" / (path.resolve().name + "-gguf")
    else:
        raise SystemExit(
            f"vlembed serve: {str(path)!r} is neither a converted model "
            "(manifest.json) nor a Hugging Face checkpoint (config.json)"
        )
    try:
        from gguf_convert.convert import convert
    except ImportError as exc:  # torch & co. are in the convert extra
        raise SystemExit(
            "vlembed serve: converting a checkpoint needs the convert extra: "
            "pip install 'vlembed[convert]'"
        ) from exc
    convert(hf, out, dtype="f32" if make_tiny else "f16")
    return out


def _parse_backends(specs: list[str], default_task: str) -> list[tuple[str, str]]:
    out = []
    for spec in specs:
        task, sep, url = spec.strip().partition("=")
        if not sep:
            task, url = default_task, spec.strip()
        if not url.startswith(("http://", "https://")):
            raise SystemExit(f"vlembed serve: backend {spec!r} is not [TASK=]http(s)://host:port")
        out.append((task, url.rstrip("/")))
    return out


def pick_mmproj(text_variant: str, available: list[str], wanted: str = "auto") -> str:
    """The vision tower file to serve with ``text_variant``.

    auto: the f32 tower for the f32 (parity) variant; otherwise a tower quantised like the text
    model when one was converted, then bf16 (1.7x faster than f32 on CPUs with AVX512-BF16),
    f16, f32.
    """
    if wanted != "auto":
        if wanted not in available:
            raise SystemExit(f"vlembed serve: mmproj variant {wanted!r} not converted: {available}")
        return wanted
    order = ["f32"] if text_variant == "f32" else [text_variant, "bf16", "f16", "f32"]
    return next((v for v in order if v in available), available[0])


def resolve_flash_attn(variant: str, flash_attn: str) -> str:
    """auto: off for the f32 parity variant (flash attention costs ~7e-6 of row cosine)."""
    if flash_attn != "auto":
        return flash_attn
    return "off" if variant == "f32" else "on"


# Weight types ggml's tiled VNNI matmul covers; it skips weights the CPU repack buffer has
# interleaved, and on an AVX512-VNNI EPYC it is 1.55x faster than the Q4_K repack kernel
# (Q4_K_M text 910 vs 587 tok/s, llama-bench pp256). Q4_0 / IQ4_NL have no tiled kernel and
# are faster repacked (545 vs 384 tok/s).
TILED_VARIANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ3", "IQ2", "IQ1")


def resolve_repack(variant: str, repack: str) -> bool:
    if repack != "auto":
        return repack == "on"
    return not variant.startswith(TILED_VARIANTS)


def build_state(args: argparse.Namespace):
    from preprocess_service.api.app import AppState
    from preprocess_service.api.inputs import InputPolicy
    from preprocess_service.backend import Backend, BackendPool
    from preprocess_service.embedder import EmbeddingService, Limits
    from preprocess_service.model import load_served_model
    from preprocess_service.supervisor import (
        ManagedServer,
        ServerSpec,
        free_port,
        llama_server_binary,
    )

    model_dir = resolve_model_dir(Path(args.model)) if args.model else default_model_dir()
    model = load_served_model(model_dir)
    m = model.manifest
    tasks = [t.strip() for t in args.tasks.split(",")] if args.tasks else list(m.tasks)
    unknown = [t for t in tasks if t not in m.tasks]
    if unknown:
        raise SystemExit(f"vlembed serve: unknown task(s) {unknown}; the model has {list(m.tasks)}")
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=32)
    pools = {t: BackendPool(t) for t in tasks}
    managed: list[tuple[ManagedServer, str]] = []
    if args.backend:
        for task, url in _parse_backends(args.backend, m.default_task):
            if task not in pools:
                raise SystemExit(f"vlembed serve: backend task {task!r} is not served ({tasks})")
            pools[task].backends.append(Backend(url, task, httpx.AsyncClient(limits=limits)))
        empty = [t for t, p in pools.items() if not p.backends]
        if empty:
            raise SystemExit(f"vlembed serve: no --backend for task(s) {empty}")
    else:
        from llama_patches.build import cache_root

        binary = llama_server_binary()
        for task in tasks:
            files = m.tasks[task].text
            variant = args.variant or next(iter(files))
            if variant not in files:
                raise SystemExit(
                    f"vlembed serve: variant {variant!r} not converted for {task!r}: {list(files)}"
                )
            mm_variant = pick_mmproj(variant, list(m.mmproj), args.mmproj_variant)
            spec = ServerSpec(
                binary=binary,
                model=model_dir / files[variant],
                mmproj=model_dir / m.mmproj[mm_variant],
                port=free_port(),
                parallel=args.parallel,
                threads=args.threads,
                ctx_per_slot=args.ctx_size,
                flash_attn=resolve_flash_attn(variant, args.flash_attn),
                repack=resolve_repack(variant, args.repack),
                vision_batch_tokens=max(1, args.vision_batch_tokens),
            )
            log_path = cache_root() / "logs" / f"llama-server-{task}-{spec.port}.log"
            managed.append((ManagedServer(spec, log_path), task))
            pools[task].backends.append(Backend(spec.url, task, httpx.AsyncClient(limits=limits)))
    service = EmbeddingService(
        model=model,
        pools=pools,
        limits=Limits(max_queue=args.max_queue, request_timeout=args.request_timeout),
    )
    policy = InputPolicy(
        allow_url_fetch=args.allow_url_fetch,
        allow_file_dir=Path(args.allow_file_dir) if args.allow_file_dir else None,
    )
    return AppState(service=service, policy=policy, api_key=args.api_key, managed=managed)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    import uvicorn

    from preprocess_service.api.app import create_app

    app = create_app(build_state(args))
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level.lower())
    return 0
