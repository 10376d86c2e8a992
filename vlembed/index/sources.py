"""Which files an ``index`` call means, and the content hash that makes re-indexing incremental.

Paths may be files, folders (walked recursively for known extensions) or glob patterns
(``**`` allowed). Every file is keyed by its absolute path, so the same index is updated
whatever directory the command runs from.
"""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["IMAGE_SUFFIXES", "PDF_SUFFIXES", "SUPPORTED_SUFFIXES", "expand_paths", "file_hash"]

PDF_SUFFIXES = (".pdf",)
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff", ".avif")
SUPPORTED_SUFFIXES = PDF_SUFFIXES + IMAGE_SUFFIXES
_GLOB_CHARS = set("*?[")


def _supported(path: Path) -> bool:
    return path.suffix.lower() in SUPPORTED_SUFFIXES


def expand_paths(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Path], list[str]]:
    """Files to index (absolute, sorted, unique) and the arguments that matched nothing.

    A file named explicitly is taken whatever its suffix (it is then reported if it cannot be
    read); folders and globs yield only supported suffixes.
    """
    found: dict[Path, None] = {}
    missing: list[str] = []
    for raw in paths:
        text = os.fspath(raw)
        path = Path(text).expanduser()
        if path.is_file():
            found[path.resolve()] = None
        elif path.is_dir():
            for child in sorted(path.rglob("*")):
                if child.is_file() and _supported(child):
                    found[child.resolve()] = None
        elif _GLOB_CHARS & set(text):
            hits = [Path(h) for h in sorted(glob.glob(os.path.expanduser(text), recursive=True))]
            files = [h.resolve() for h in hits if h.is_file() and _supported(h)]
            for h in hits:
                if h.is_dir():
                    files += [c.resolve() for c in sorted(h.rglob("*")) if _supported(c)]
            if not files:
                missing.append(text)
            found.update(dict.fromkeys(files))
        else:
            missing.append(text)
    return sorted(found), missing


def file_hash(path: Path) -> str:
    """SHA-256 of the file's bytes (hex): unchanged content is never embedded twice."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
