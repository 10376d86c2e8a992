"""Checkpoint layouts: jina-embeddings-v4 (old flat keys + PEFT task adapters) and transformers 5.

jina-embeddings-v4 stores its Qwen2.5-VL base weights in the pre-5.0 flat key format
(``model.layers.N…``, ``visual.blocks.N…``) while its adapter keys already use the 5.x names
(``…model.language_model.layers.N…``). Everything that reads a checkpoint (the PyTorch reference
and the converter) goes through this one table, so both sides agree on what a key means.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

# flat (jina-v4 / Qwen2.5-VL pre-5.0) prefix -> transformers 5.x prefix
_FLAT_TO_HF: tuple[tuple[str, str], ...] = (
    ("model.layers.", "model.language_model.layers."),
    ("model.embed_tokens.", "model.language_model.embed_tokens."),
    ("model.norm.", "model.language_model.norm."),
    ("visual.", "model.visual."),
)

PROJECTOR_PREFIX = "multi_vector_projector."

_ADAPTER_KEY = re.compile(
    r"^base_model\.model\.(?P<module>.+)\.lora_(?P<ab>[AB])\.(?P<task>[^.]+)\.weight$"
)


def to_hf_key(name: str) -> str:
    """Map a flat checkpoint key to its transformers 5.x name (5.x names pass through)."""
    for flat, hf in _FLAT_TO_HF:
        if name.startswith(flat):
            return hf + name[len(flat) :]
    return name


def to_flat_key(name: str) -> str:
    """Map a transformers 5.x key to the flat format jina-embeddings-v4 ships."""
    for flat, hf in _FLAT_TO_HF:
        if name.startswith(hf):
            return flat + name[len(hf) :]
    return name


def adapter_key(module: str, ab: str, task: str) -> str:
    """The PEFT key jina-embeddings-v4 uses for one LoRA matrix of one task."""
    return f"base_model.model.{module}.lora_{ab}.{task}.weight"


@dataclass(frozen=True)
class AdapterKey:
    """A parsed adapter tensor name: which module (transformers 5.x path), A or B, which task."""

    module: str
    ab: str
    task: str


def parse_adapter_key(name: str) -> AdapterKey:
    """Parse ``base_model.model.<module>.lora_{A,B}.<task>.weight``; raise on anything else."""
    m = _ADAPTER_KEY.match(name)
    if m is None:
        raise ValueError(f"not a jina-v4 task adapter key: {name!r}")
    return AdapterKey(module=to_hf_key(m["module"]), ab=m["ab"], task=m["task"])


@dataclass(frozen=True)
class CheckpointFiles:
    """Where a checkpoint directory keeps its pieces."""

    root: Path
    weight_files: tuple[Path, ...]
    adapter_dir: Path | None


def find_checkpoint_files(root: Path) -> CheckpointFiles:
    """Locate config, weight shards (via the index when sharded) and adapters; explain failures."""
    root = Path(root)
    if not (root / "config.json").is_file():
        raise FileNotFoundError(f"{str(root)!r} has no config.json: not a Hugging Face checkpoint")
    index = root / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        names = sorted(set(weight_map.values()))
        missing = [n for n in names if not (root / n).is_file()]
        if missing:
            raise FileNotFoundError(
                f"{str(root)!r}: shards named in model.safetensors.index.json are missing: "
                + ", ".join(missing)
            )
        files = tuple(root / n for n in names)
    elif (root / "model.safetensors").is_file():
        files = (root / "model.safetensors",)
    else:
        raise FileNotFoundError(
            f"{str(root)!r} has neither model.safetensors nor model.safetensors.index.json"
        )
    adapters = root / "adapters"
    has_adapters = (adapters / "adapter_model.safetensors").is_file()
    return CheckpointFiles(
        root=root, weight_files=files, adapter_dir=adapters if has_adapters else None
    )
