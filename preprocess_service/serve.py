"""``vlembed serve``: the embeddings API, with its llama-servers started and supervised here.

Every flag has an environment variable (``VLEMBED_*``, see ``settings.py``) so containers
configure it without a command line. ``--model`` takes a converted directory, a Hugging Face
checkpoint or repo id (converted once, ``gguf_convert.resolve``); with none it serves the tiny
random checkpoint: a smoke test of the whole stack, loudly labelled as random weights.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import httpx

from preprocess_service.api.guard import GuardConfig
from preprocess_service.api.lifecycle import AppState
from preprocess_service.backend import Backend, BackendPool
from preprocess_service.embedder import EmbeddingService, QueueLimits
from preprocess_service.inputs import InputPolicy
from preprocess_service.model import ServedModel, load_served_model
from preprocess_service.settings import ServeSettings, parse_settings
from preprocess_service.settings import build_parser as _settings_parser
from preprocess_service.supervisor import ManagedServer, ServerSpec, free_port, llama_server_binary
from preprocess_service.validate import Limits
from vlembed.constants import MERGE_SIZE, PATCH_SIZE
from vlembed.paths import logs_dir

__all__ = ["build_parser", "build_state", "main", "pick_mmproj", "resolve_model_dir"]

log = logging.getLogger("vlembed.serve")


def build_parser():
    """The ``vlembed serve`` flags, defaults from the ``VLEMBED_*`` variables now set."""
    return _settings_parser(ServeSettings())


def resolve_model_dir(ref: str | None) -> Path:
    """The converted directory to serve (converting once when ``ref`` is not converted)."""
    from gguf_convert.resolve import resolve_model

    if ref is None:
        log.warning("=" * 72)
        log.warning("no --model given: serving a TINY RANDOM-WEIGHT checkpoint (smoke test only)")
        log.warning("its vectors mean nothing; pass --model DIR or a Hugging Face repo id")
        log.warning("=" * 72)
    try:
        return resolve_model(ref)
    except (FileNotFoundError, RuntimeError, ValueError) as exc:
        raise SystemExit(f"vlembed serve: {exc}") from exc


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


def _tasks(settings: ServeSettings, model: ServedModel) -> list[str]:
    m = model.manifest
    tasks = [t.strip() for t in settings.tasks.split(",")] if settings.tasks else list(m.tasks)
    unknown = [t for t in tasks if t not in m.tasks]
    if unknown:
        raise SystemExit(f"vlembed serve: unknown task(s) {unknown}; the model has {list(m.tasks)}")
    return tasks


def _server_spec(settings: ServeSettings, model: ServedModel, model_dir: Path, task: str, binary):
    m = model.manifest
    files = m.tasks[task].text
    variant = settings.variant or next(iter(files))
    if variant not in files:
        raise SystemExit(
            f"vlembed serve: variant {variant!r} not converted for {task!r}: {list(files)}"
        )
    mm_variant = pick_mmproj(variant, list(m.mmproj), settings.mmproj_variant)
    return ServerSpec(
        binary=binary,
        model=model_dir / files[variant],
        mmproj=model_dir / m.mmproj[mm_variant],
        port=free_port(),
        parallel=settings.parallel,
        threads=settings.threads,
        ctx_per_slot=settings.ctx_size,
        flash_attn=resolve_flash_attn(variant, settings.flash_attn),
        repack=resolve_repack(variant, settings.repack),
        vision_batch_tokens=max(1, settings.vision_batch_tokens),
        # the served max_pixels bounds what one image may cost the vision tower
        image_max_tokens=m.max_pixels // (PATCH_SIZE * MERGE_SIZE) ** 2,
    )


def build_state(settings: ServeSettings, model_dir: Path | None = None) -> AppState:
    model_dir = model_dir or resolve_model_dir(settings.model)
    model = load_served_model(model_dir)
    tasks = _tasks(settings, model)
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=32)
    pools = {t: BackendPool(t) for t in tasks}
    compact = settings.patch_transport == "auto"
    managed: list[tuple[ManagedServer, str]] = []
    if settings.backends:
        for task, url in _parse_backends(settings.backends, model.manifest.default_task):
            if task not in pools:
                raise SystemExit(f"vlembed serve: backend task {task!r} is not served ({tasks})")
            pools[task].backends.append(
                Backend(url, task, httpx.AsyncClient(limits=limits), allow_compact=compact)
            )
        empty = [t for t, p in pools.items() if not p.backends]
        if empty:
            raise SystemExit(f"vlembed serve: no --backend for task(s) {empty}")
    else:
        binary = llama_server_binary()
        for task in tasks:
            spec = _server_spec(settings, model, model_dir, task, binary)
            log_path = logs_dir() / f"llama-server-{task}-{spec.port}.log"
            managed.append((ManagedServer(spec, log_path), task))
            pools[task].backends.append(
                Backend(spec.url, task, httpx.AsyncClient(limits=limits), allow_compact=compact)
            )
    policy = InputPolicy(
        allow_url_fetch=settings.allow_url_fetch,
        allow_file_dir=settings.allow_file_dir,
        max_image_bytes=settings.max_image_bytes,
    )
    service = EmbeddingService(
        model=model,
        pools=pools,
        limits=QueueLimits(max_queue=settings.max_queue, request_timeout=settings.request_timeout),
        policy=policy,
    )
    state = AppState(
        service=service,
        limits=Limits(
            max_items=settings.max_items,
            max_text_chars=settings.max_text_chars,
            max_image_bytes=settings.max_image_bytes,
        ),
        guard=GuardConfig(
            api_key=settings.api_key,
            max_body_bytes=settings.max_body_bytes,
            body_timeout=settings.body_timeout,
        ),
        managed=managed,
        hang_timeout=settings.hang_timeout,
    )
    if settings.index is not None:
        state.search = _open_index(settings.index, state)
    return state


def _open_index(path: Path, state: AppState):
    """The document index for ``/v1/search``, read-only; refused unless its model is ours."""
    from preprocess_service.search import IndexOpenError, SearchService

    try:
        return SearchService.open(path, state.service, state.limits)
    except IndexOpenError as exc:
        raise SystemExit(f"vlembed serve: {exc}") from exc
    except ImportError as exc:
        raise SystemExit(
            f"vlembed serve: --index needs the index extra (pip install 'vlembed[index]'): {exc}"
        ) from exc


def main(argv: list[str] | None = None) -> int:
    settings = parse_settings(argv)
    logging.basicConfig(
        level=settings.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    import uvicorn

    from preprocess_service.api.app import create_app

    app = create_app(build_state(settings))
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level.lower(),
        limit_concurrency=settings.max_connections,
        timeout_keep_alive=5,
    )
    return 0
