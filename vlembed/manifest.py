"""manifest.json: everything the service needs to know about a converted model, in one file.

The service reads only this file (and the files it names) to know what it serves: tasks and
their GGUFs, the projector, hidden size, Matryoshka dims, prompts, pixel limits, checksums, and
the llama.cpp pin + patch hash the files were made for.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

FORMAT = "vlembed-manifest/1"
MANIFEST = "manifest.json"


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


@dataclass
class TaskFiles:
    """Per task: text GGUF per variant (f32/f16/bf16/Q8_0/…), projector (.npz) or None."""

    text: dict[str, str] = field(default_factory=dict)
    projector: str | None = None


@dataclass
class Manifest:
    model_name: str
    source_kind: str  # "jina-v4" or "qwen2.5-vl"
    hidden_size: int
    multi_vector_dim: int | None
    matryoshka_dims: list[int]
    prompts: dict[str, str]
    image_prompt: str
    min_pixels: int
    max_pixels: int
    patch_size: int
    merge_size: int
    temporal_patch_size: int
    mmproj: dict[str, str]  # dtype -> file
    tasks: dict[str, TaskFiles]
    tokenizer: str
    llama_cpp: dict[str, str]
    source_fingerprint: str
    default_task: str = "retrieval"
    notes: list[str] = field(default_factory=list)
    files: dict[str, dict[str, Any]] = field(default_factory=dict)
    format: str = FORMAT

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False)

    def record_files(self, root: Path) -> None:
        """Checksums of every file the manifest names (what a deployment verifies)."""
        names = {self.tokenizer, *self.mmproj.values()}
        for t in self.tasks.values():
            names.update(t.text.values())
            if t.projector:
                names.add(t.projector)
        for name in sorted(names):
            path = root / name
            prev = self.files.get(name)
            size = path.stat().st_size
            if prev and prev.get("bytes") == size and prev.get("mtime") == path.stat().st_mtime:
                continue  # unchanged since last recorded: skip re-hashing large files
            self.files[name] = {
                "sha256": sha256_file(path),
                "bytes": size,
                "mtime": path.stat().st_mtime,
            }


def load_manifest(root: Path) -> Manifest:
    """Read ``root/manifest.json``; raise a clear error when it is missing or of another format."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"{str(root)!r} has no {MANIFEST}: convert a checkpoint first (vlembed convert)"
        )
    data = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r}: format {data.get('format')!r}, expected {FORMAT!r}")
    data.pop("format")
    data["tasks"] = {k: TaskFiles(**v) for k, v in data["tasks"].items()}
    return Manifest(**data)
