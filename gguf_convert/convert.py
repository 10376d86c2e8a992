"""Orchestrates one conversion: checkpoint → per-task text GGUFs, mmproj, projectors, manifest.

Tasks are served by merging each task's LoRA into its own text GGUF (W' = W + B·A·alpha/r in
f32), one llama-server per task sharing one mmproj file. That keeps every request on the plain,
well-trodden embedding path (no per-request adapter switching inside a batch) and makes the
merged weights directly comparable with the reference; the cost is one text model in memory per
task served (docs/convert.md has the numbers).

Idempotent: a file whose inputs (source fingerprint, task, dtype) match the existing manifest
and whose checksum still matches is not rewritten, so an interrupted run can simply be re-run.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from gguf_convert.checkpoint import Checkpoint, open_checkpoint
from gguf_convert.layout import PROJECTOR_PREFIX
from gguf_convert.vocab import gguf_vocab
from gguf_convert.writer import write_mmproj_gguf, write_text_gguf
from vlembed import constants
from vlembed.constants import DTYPES, MMPROJ_QUANT_TYPES, QUANT_TYPES
from vlembed.manifest import MANIFEST, Manifest, TaskFiles, load_manifest, sha256_file
from vlembed.tasks import IMAGE_TEMPLATE, TEXT_PREFIX

# Bumped whenever the files written for the same source change (2: vision MLP zero-padded to a
# multiple of 256), so an earlier conversion is redone rather than reused.
LAYOUT_VERSION = 2


def source_fingerprint(ckpt: Checkpoint) -> str:
    """Changes when the checkpoint's config, weights or adapters change (name, size, mtime),
    or when this converter's output layout does (LAYOUT_VERSION)."""
    h = hashlib.sha256((ckpt.files.root / "config.json").read_bytes())
    h.update(f"layout:{LAYOUT_VERSION}".encode())
    paths = list(ckpt.files.weight_files)
    if ckpt.files.adapter_dir is not None:
        paths += sorted(ckpt.files.adapter_dir.iterdir())
    for p in paths:
        st = p.stat()
        h.update(f"{p.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _fresh(previous: Manifest | None, fingerprint: str, root: Path, name: str) -> bool:
    """True when ``name`` was made from this same source and is intact on disk."""
    if previous is None or previous.source_fingerprint != fingerprint:
        return False
    rec = previous.files.get(name)
    path = root / name
    return (
        bool(rec)
        and path.is_file()
        and path.stat().st_size == rec["bytes"]
        and (path.stat().st_mtime == rec.get("mtime") or sha256_file(path) == rec["sha256"])
    )


def write_projector(ckpt: Checkpoint, task: str | None, out: Path) -> Path:
    """The multi-vector projector with the task's LoRA merged, as .npz (numpy alone loads it)."""
    weight = ckpt.load(PROJECTOR_PREFIX + "weight", task)
    bias = (
        ckpt.load(PROJECTOR_PREFIX + "bias")
        if PROJECTOR_PREFIX + "bias" in (ckpt.tensor_files)
        else np.zeros(weight.shape[0], np.float32)
    )
    tmp = out.with_name(out.name + ".partial.npz")
    np.savez(tmp, weight=weight, bias=bias)
    tmp.replace(out)
    return out


def quantize(src: Path, dst: Path, qtype: str, threads: int | None = None) -> Path:
    """Run the built llama-quantize (the same build as the server, so formats match)."""
    from llama_patches.build import quantize_binary

    cmd = [str(quantize_binary()), str(src), str(dst.with_name(dst.name + ".partial")), qtype]
    if threads:
        cmd.append(str(threads))
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"llama-quantize {qtype} failed:\n{proc.stderr[-2000:]}")
    dst.with_name(dst.name + ".partial").replace(dst)
    return dst


def convert(
    hf_dir: Path,
    out_dir: Path,
    tasks: list[str] | None = None,
    dtype: str = "f32",
    quants: list[str] | None = None,
    progress: Callable[[str], None] | None = None,
    mmproj_quants: list[str] | None = None,
) -> Manifest:
    """Convert ``hf_dir`` into ``out_dir``; return the manifest written there.

    ``quants`` are llama-quantize types for the text GGUFs, ``mmproj_quants`` for the vision
    tower; both are made from the ``dtype`` files (bf16 is the sensible base for them). Files
    already converted from the same source (fingerprint and checksum) are kept.
    """
    _check_types(dtype, quants or [], mmproj_quants or [])
    say = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
    ckpt = open_checkpoint(Path(hf_dir))
    wanted = _wanted_tasks(ckpt, tasks)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = source_fingerprint(ckpt)
    try:
        previous: Manifest | None = load_manifest(out_dir)
    except (FileNotFoundError, ValueError, TypeError, KeyError):
        previous = None
    if previous is not None and previous.source_fingerprint != fingerprint:
        previous = None
    manifest = _new_manifest(ckpt, wanted, fingerprint, previous)
    name = manifest.model_name
    (out_dir / manifest.tokenizer).write_bytes((ckpt.files.root / manifest.tokenizer).read_bytes())
    vocab, merges = gguf_vocab(
        ckpt.files.root / manifest.tokenizer, int(ckpt.text_config["vocab_size"])
    )
    adapters = bool(ckpt.tasks)

    def made(file: str, write: Callable[[Path], object]) -> str:
        """``file`` in ``out_dir``: kept when converted from this source before, else written."""
        if _fresh(previous, fingerprint, out_dir, file):
            say(f"{file}: up to date")
        else:
            write(out_dir / file)
        return file

    def quantized(src: str, q: str) -> str:
        """``src`` quantised to ``q``, named like ``src``."""
        qname = src.replace(f"-{dtype}.gguf", f"-{q}.gguf")
        return made(
            qname, lambda dst: say(f"{qname}: quantising") or quantize(out_dir / src, dst, q)
        )

    start = time.perf_counter()
    mm = made(
        f"mmproj-{dtype}.gguf",
        lambda dst: write_mmproj_gguf(ckpt, dst, dtype, name, progress=say),
    )
    manifest.mmproj[dtype] = mm
    for q in mmproj_quants or []:
        # The flat patch weight is named *.weight_flat, which llama-quantize leaves as it is:
        # 1176 columns are no multiple of a quant block. The MLP is padded to 3584 (tensor_map),
        # so every other matrix quantises.
        manifest.mmproj[q] = quantized(mm, q)
    for task in wanted:
        adapter = task if adapters else None
        files = TaskFiles()
        files.text[dtype] = made(
            f"text-{task}-{dtype}.gguf",
            lambda dst, adapter=adapter, task=task: write_text_gguf(
                ckpt, adapter, dst, dtype, vocab, merges, f"{name}-{task}", progress=say
            ),
        )
        for q in quants or []:
            files.text[q] = quantized(files.text[dtype], q)
        if ckpt.has_projector:
            files.projector = f"projector-{task}.npz"
            write_projector(ckpt, adapter, out_dir / files.projector)
        manifest.tasks[task] = files
    manifest.record_files(out_dir)
    (out_dir / MANIFEST).write_text(manifest.to_json())
    say(f"converted {name} ({', '.join(wanted)}) in {time.perf_counter() - start:.1f} s")
    return manifest


def _check_types(dtype: str, quants: list[str], mmproj_quants: list[str]) -> None:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; choose one of {list(DTYPES)}")
    for q in quants:
        if q not in QUANT_TYPES:
            raise ValueError(f"unknown quantisation {q!r}; choose from {list(QUANT_TYPES)}")
    for q in mmproj_quants:
        if q not in MMPROJ_QUANT_TYPES:
            raise ValueError(
                f"vision tower quantisation {q!r} not supported; choose from "
                f"{list(MMPROJ_QUANT_TYPES)}"
            )


def _wanted_tasks(ckpt: Checkpoint, tasks: list[str] | None) -> list[str]:
    """The adapter tasks to convert; a checkpoint without adapters has one, named by the user."""
    available = ckpt.tasks
    if available:
        wanted = list(available) if not tasks or tasks == ["all"] else tasks
        unknown = [t for t in wanted if t not in available]
        if unknown:
            raise ValueError(f"unknown task(s) {unknown}; this checkpoint has {list(available)}")
        return wanted
    # a plain Qwen2.5-VL (e.g. a merged "-vllm-" jina variant): one task, the one merged in
    if tasks and (len(tasks) != 1 or tasks[0] == "all"):
        raise ValueError("a checkpoint without adapters has one task; name it with --task")
    return tasks or ["retrieval"]


def _new_manifest(
    ckpt: Checkpoint, wanted: list[str], fingerprint: str, previous: Manifest | None
) -> Manifest:
    """What the service will read about this model; files are filled in as they are made."""
    from llama_patches.build import PIN, patch_hash

    tc, vc, pre = ckpt.text_config, ckpt.config["vision_config"], ckpt.preprocessor
    manifest = Manifest(
        model_name=ckpt.files.root.name,
        source_kind="jina-v4" if ckpt.tasks else "qwen2.5-vl",
        hidden_size=int(tc["hidden_size"]),
        multi_vector_dim=(
            int(ckpt.config.get("multi_vector_projector_dim", 128)) if ckpt.has_projector else None
        ),
        matryoshka_dims=[int(d) for d in ckpt.config.get("matryoshka_dims", [])]
        or [int(tc["hidden_size"])],
        prompts=dict(TEXT_PREFIX),
        image_prompt=IMAGE_TEMPLATE,
        min_pixels=int(pre.get("min_pixels", constants.MIN_PIXELS)),
        max_pixels=int(pre.get("max_pixels", constants.MAX_PIXELS)),
        patch_size=int(vc.get("patch_size", constants.PATCH_SIZE)),
        merge_size=int(vc.get("spatial_merge_size", constants.MERGE_SIZE)),
        temporal_patch_size=int(vc.get("temporal_patch_size", constants.TEMPORAL_PATCH_SIZE)),
        mmproj={},
        tasks={},
        tokenizer="tokenizer.json",
        llama_cpp={"pin": PIN, "patch_hash": patch_hash()},
        source_fingerprint=fingerprint,
        default_task=wanted[0],
        files=dict(previous.files) if previous else {},
    )
    if not ckpt.has_projector:
        manifest.notes.append(
            "no multi_vector_projector in the checkpoint: single-vector embeddings only"
        )
    if not ckpt.tasks:
        manifest.notes.append(
            f"no task adapters: weights served as they are, under the task name {wanted[0]!r}"
        )
    return manifest
