"""What ``--model`` names, as a converted directory: convert once, reuse from the cache.

``--model`` (serve, index) takes a converted directory (``manifest.json``), a Hugging Face
checkpoint directory, or a Hugging Face repo id such as ``jinaai/jina-embeddings-v4`` (optionally
``@revision``). A repo id is downloaded with ``huggingface_hub`` into its own cache and converted
once into ``$VLEMBED_CACHE/models/<repo>--<revision>``; with no network the error says exactly
what to download and where to put it. No ``--model`` is the tiny random checkpoint (a smoke
test). Conversion, and so torch, is imported only when something must be converted.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from pathlib import Path

from vlembed.manifest import MANIFEST
from vlembed.paths import models_dir

log = logging.getLogger("vlembed.resolve")

_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")

Downloader = Callable[[str, str | None], Path]


def is_repo_id(ref: str) -> bool:
    """``owner/name`` or ``owner/name@revision`` that is not an existing local path."""
    return bool(_REPO_ID.match(ref)) and not Path(ref).exists()


def resolve_model(
    ref: str | None, *, dtype: str = "f16", download: Downloader | None = None
) -> Path:
    """A converted model directory for ``ref`` (see the module docstring).

    Args:
        ref: Directory, repo id, or ``None`` for the tiny random checkpoint.
        dtype: Text GGUF dtype when a conversion is needed.
        download: ``(repo_id, revision) -> checkpoint directory``; default: huggingface_hub's
            ``snapshot_download`` (tests pass a function that returns a local directory).
    """
    if ref is None:
        return tiny_random_model()
    path = Path(ref).expanduser()
    if (path / MANIFEST).is_file():
        return path
    if (path / "config.json").is_file():
        return _converted(path, models_dir() / (path.resolve().name + "-gguf"), dtype)
    if is_repo_id(ref):
        repo, _, revision = ref.partition("@")
        hf = (download or _snapshot_download)(repo, revision or None)
        slug = repo.replace("/", "--") + "--" + (revision or hf.name)[:12]
        return _converted(hf, models_dir() / slug, dtype)
    raise FileNotFoundError(
        f"{ref!r} is neither a converted model (manifest.json), a Hugging Face checkpoint "
        "directory (config.json), nor a Hugging Face repo id (owner/name)"
    )


def tiny_random_model() -> Path:
    """The tiny random checkpoint, made and converted once (f32, the parity dtype)."""
    out = models_dir() / "tiny-random"
    if (out / MANIFEST).is_file():
        return out
    hf = out.with_name("tiny-random-hf")
    if not (hf / "config.json").is_file():
        from gguf_convert.synthetic import make_checkpoint

        make_checkpoint(hf, "tiny", 0)
    return _converted(hf, out, "f32")


def _converted(hf: Path, out: Path, dtype: str) -> Path:
    try:
        from gguf_convert.convert import convert
    except ImportError as exc:  # torch & co. are in the convert extra
        raise RuntimeError(
            "converting a checkpoint needs the convert extra: pip install 'vlembed[convert]'"
        ) from exc
    convert(hf, out, dtype=dtype)  # reuses an up-to-date conversion (source fingerprint)
    return out


def _snapshot_download(repo: str, revision: str | None) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise RuntimeError(
            f"downloading {repo!r} needs huggingface_hub (pip install 'vlembed[convert]')"
        ) from exc
    try:
        return Path(snapshot_download(repo, revision=revision))
    except Exception as exc:  # offline, gated, unknown repo: each a different hub error
        target = models_dir() / (repo.split("/")[-1] + "-hf")
        rev = f" --revision {revision}" if revision else ""
        raise RuntimeError(
            f"cannot download {repo!r} ({exc.__class__.__name__}: {exc}). Without network: on "
            f"a machine with it run `huggingface-cli download {repo}{rev} --local-dir "
            f"{target.name}`, copy that directory here (e.g. to {target}) and pass "
            f"--model {target}"
        ) from exc
