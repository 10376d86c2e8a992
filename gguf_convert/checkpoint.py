"""Streamed access to a jina-v4 / Qwen2.5-VL checkpoint, with task LoRA merged on the fly.

Tensors are read one at a time (safetensors is memory-mapped), so a conversion's peak memory is
about the largest tensor plus its merged copy, not the model.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from gguf_convert.layout import (
    PROJECTOR_PREFIX,
    CheckpointFiles,
    find_checkpoint_files,
    parse_adapter_key,
    to_hf_key,
)
from vlembed.tasks import ordered_adapter_tasks


@dataclass
class Checkpoint:
    """A checkpoint directory: config, where each tensor lives, and the task adapters."""

    files: CheckpointFiles
    config: dict
    preprocessor: dict
    tensor_files: dict[str, tuple[Path, str]]  # hf name -> (file, stored name)
    lora_scale: float = 1.0
    # (hf module, task) -> (A [r, in], B [out, r]) float32
    adapters: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    @property
    def tasks(self) -> tuple[str, ...]:
        found = {task for _, task in self.adapters}
        return ordered_adapter_tasks(found)

    @property
    def has_projector(self) -> bool:
        return PROJECTOR_PREFIX + "weight" in self.tensor_files

    @property
    def text_config(self) -> dict:
        """Text hyper-parameters: nested in 5.x configs, flat at the top in hub configs."""
        return self.config.get("text_config") or self.config

    def shape(self, hf_name: str) -> tuple[int, ...]:
        from safetensors import safe_open

        path, stored = self.tensor_files[hf_name]
        with safe_open(str(path), "pt") as f:
            return tuple(f.get_slice(stored).get_shape())

    def load(self, hf_name: str, task: str | None = None) -> np.ndarray:
        """One tensor as float32; with ``task``, that task's LoRA merged: W + B·A·alpha/r."""
        from safetensors import safe_open

        path, stored = self.tensor_files[hf_name]
        with safe_open(str(path), "pt") as f:
            data = f.get_tensor(stored).float().numpy()
        if task is not None and hf_name.endswith(".weight"):
            ab = self.adapters.get((hf_name[: -len(".weight")], task))
            if ab is not None:
                a, b = ab
                data = data + (b @ a) * np.float32(self.lora_scale)
        return np.ascontiguousarray(data, dtype=np.float32)

    def names(self) -> Iterator[str]:
        return iter(sorted(self.tensor_files))


def open_checkpoint(root: Path) -> Checkpoint:
    """Index a checkpoint directory; raise with a clear message on anything missing."""
    from safetensors import safe_open

    files = find_checkpoint_files(root)
    config = json.loads((files.root / "config.json").read_text())
    if config.get("model_type") not in ("qwen2_5_vl", None) and "vision_config" not in config:
        raise ValueError(
            f"{str(root)!r}: model_type {config.get('model_type')!r} is not Qwen2.5-VL"
        )
    pre_path = files.root / "preprocessor_config.json"
    preprocessor = json.loads(pre_path.read_text()) if pre_path.is_file() else {}
    tensor_files: dict[str, tuple[Path, str]] = {}
    for path in files.weight_files:
        with safe_open(str(path), "pt") as f:
            for stored in f.keys():
                tensor_files[to_hf_key(stored)] = (path, stored)
    ckpt = Checkpoint(
        files=files, config=config, preprocessor=preprocessor, tensor_files=tensor_files
    )
    if files.adapter_dir is not None:
        acfg = json.loads((files.adapter_dir / "adapter_config.json").read_text())
        ckpt.lora_scale = float(acfg["lora_alpha"]) / float(acfg["r"])
        pending: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        with safe_open(str(files.adapter_dir / "adapter_model.safetensors"), "pt") as f:
            for name in f.keys():
                key = parse_adapter_key(name)
                pending.setdefault((key.module, key.task), {})[key.ab] = (
                    f.get_tensor(name).float().numpy()
                )
        for k, ab in pending.items():
            if set(ab) != {"A", "B"}:
                raise ValueError(f"adapter {k[0]!r} for task {k[1]!r} lacks lora_A or lora_B")
            ckpt.adapters[k] = (ab["A"], ab["B"])
    return ckpt
