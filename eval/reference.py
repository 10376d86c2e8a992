"""The PyTorch reference embedder: what "correct" means for every vector vlembed produces.

It runs HF transformers 5.x Qwen2.5-VL in float32 on a jina-embeddings-v4 layout directory (real
or synthetic) or a plain Qwen2.5-VL directory, and reproduces jina-v4's semantics:

- text: ``"Query: "``/``"Passage: "`` + text, no chat template, no BOS; single vector = mean of
  all rows (prefix included), L2-normalised. text-matching always uses ``"Query: "``.
- image: ``<|im_start|>user\\n<|vision_start|><|image_pad|>…<|vision_end|>Describe the
  image.<|im_end|>\\n``; single vector = mean of the rows from ``<|vision_start|>`` to
  ``<|vision_end|>`` inclusive.
- interleaved content (vlembed's definition): ``<|im_start|>user\\n`` + the parts in order (text
  verbatim, each image as a vision block) + ``<|im_end|>\\n``. Single vector = mean over all rows
  when any text part is present, else the mean over the span from the first ``<|vision_start|>``
  to the last ``<|vision_end|>``. One image alone uses the image template above.
- multi-vector: the task's projector on every row (template tokens included), each row L2-normed.
- Matryoshka: truncate the single vector, renormalise.

Task LoRA is applied UNMERGED (y = x·Wᵀ + x·Aᵀ·Bᵀ·alpha/r), independently of the converter's merge,
so a wrong merge shows up as a parity failure. The prompt strings are spelled here on purpose
rather than imported from the service: the service is checked against this module.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from PIL import Image
from torch import nn

from gguf_convert.layout import (
    PROJECTOR_PREFIX,
    find_checkpoint_files,
    parse_adapter_key,
    to_hf_key,
)
from vlembed.tasks import ordered_adapter_tasks

Role = Literal["query", "passage"]
Part = str | Image.Image

IMAGE_PAD = "<|image_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"
IMAGE_PROMPT = "<|im_start|>user\n{vision}Describe the image.<|im_end|>\n"
CONTENT_PROMPT = "<|im_start|>user\n{parts}<|im_end|>\n"
TEXT_PREFIX: dict[Role, str] = {"query": "Query: ", "passage": "Passage: "}


def text_prefix(task: str, role: Role) -> str:
    """jina-v4: text-matching is symmetric and always uses the query prefix."""
    return TEXT_PREFIX["query"] if task == "text-matching" else TEXT_PREFIX[role]


@dataclass
class Encoded:
    """One input's reference outputs. ``rows`` are final hidden states (after the last norm)."""

    token_ids: list[int]
    rows: np.ndarray  # [n_tokens, hidden] float32
    pool_start: int  # single vector = mean(rows[pool_start:pool_end]), then L2
    pool_end: int
    single: np.ndarray  # [hidden] float32, L2-normalised
    multi: np.ndarray | None  # [n_tokens, projector_dim] rows L2-normalised; None without projector
    image_token_mask: np.ndarray  # [n_tokens] bool

    def truncated(self, dim: int) -> np.ndarray:
        """Matryoshka: the first ``dim`` components of the pooled vector, renormalised."""
        pooled = self.rows[self.pool_start : self.pool_end].mean(axis=0)
        head = pooled[:dim]
        return (head / np.linalg.norm(head)).astype(np.float32)


class LoraLinear(nn.Module):
    """A frozen Linear plus per-task LoRA terms, applied unmerged; ``task=None`` is the base."""

    def __init__(self, base: nn.Linear, scale: float) -> None:
        super().__init__()
        self.base = base
        self.scale = scale
        self.a: dict[str, torch.Tensor] = {}
        self.b: dict[str, torch.Tensor] = {}
        self.task: str | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        if self.task is None:
            return y
        return y + (x @ self.a[self.task].T) @ self.b[self.task].T * self.scale


def _load_safetensors(files: tuple[Path, ...] | list[Path]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for f in files:
        out.update(load_file(str(f)))
    return out


def _build_model(config, dtype: torch.dtype) -> nn.Module:
    """An uninitialised Qwen2.5-VL in ``dtype``: every weight is overwritten by the checkpoint,
    so random init (tens of seconds and a second copy's worth of time at full depth) is skipped,
    and a bf16 model never passes through a float32 one."""
    from transformers import Qwen2_5_VLModel
    from transformers.initialization import no_init_weights

    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with no_init_weights():
            model = Qwen2_5_VLModel(config)
    finally:
        torch.set_default_dtype(previous)
    return model.eval().to(dtype)


def _load_weights(model: nn.Module, files: tuple[Path, ...]) -> dict[str, torch.Tensor]:
    """Copy the checkpoint into ``model`` one tensor at a time (peak memory: the model plus one
    tensor, not the model twice over); returns the projector's tensors, which are not part of
    Qwen2.5-VL. Raises ValueError when the checkpoint and the model disagree on names."""
    from safetensors import safe_open

    params = model.state_dict()
    seen: set[str] = set()
    unexpected: list[str] = []
    projector: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for path in files:
            with safe_open(str(path), "pt") as f:
                for key in f.keys():
                    if key.startswith(PROJECTOR_PREFIX):
                        projector[key[len(PROJECTOR_PREFIX) :]] = f.get_tensor(key).float()
                        continue
                    if key.startswith("lm_head."):
                        continue
                    name = to_hf_key(key)[len("model.") :]
                    if name not in params:
                        unexpected.append(name)
                        continue
                    params[name].copy_(f.get_tensor(key))
                    seen.add(name)
    missing = [n for n in params if n not in seen]
    if missing or unexpected:
        raise ValueError(
            f"checkpoint does not match Qwen2.5-VL: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    return projector


class ReferenceEmbedder:
    """HF transformers Qwen2.5-VL with jina-v4 pooling, float32 on CPU, deterministic."""

    def __init__(
        self, model_dir: Path | str, task: str = "retrieval", dtype: torch.dtype = torch.float32
    ) -> None:
        from transformers import Qwen2_5_VLConfig

        torch.manual_seed(0)
        torch.use_deterministic_algorithms(True)
        self.model_dir = Path(model_dir)
        files = find_checkpoint_files(self.model_dir)
        raw_config = json.loads((self.model_dir / "config.json").read_text())
        self.config = Qwen2_5_VLConfig(**{k: v for k, v in raw_config.items() if k != "auto_map"})
        self.dtype = dtype
        self.model = _build_model(self.config, dtype)
        projector = _load_weights(self.model, files.weight_files)
        self.projector: nn.Linear | None = None
        if projector:
            w = projector["weight"]
            self.projector = nn.Linear(w.shape[1], w.shape[0], bias="bias" in projector)
            self.projector.load_state_dict(projector)
            self.projector = LoraLinear(self.projector, 1.0)  # type: ignore[assignment]
        self.lora_modules: dict[str, LoraLinear] = {}
        self.tasks: tuple[str, ...] = ()
        if files.adapter_dir is not None:
            self._attach_adapters(files.adapter_dir)
        self.task: str | None = None
        if self.tasks:
            self.set_task(task)
        if dtype != torch.float32:  # benchmarks only: parity is always measured in float32
            self.model.to(dtype)
            for m in self.lora_modules.values():
                m.a = {k: v.to(dtype) for k, v in m.a.items()}
                m.b = {k: v.to(dtype) for k, v in m.b.items()}

        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(self.model_dir / "tokenizer.json"))
        pre = json.loads((self.model_dir / "preprocessor_config.json").read_text())
        from transformers import Qwen2VLImageProcessorPil

        self.min_pixels = int(pre.get("min_pixels", 3136))
        self.max_pixels = int(pre.get("max_pixels", 602112))
        self.image_processor = Qwen2VLImageProcessorPil(
            size={"shortest_edge": self.min_pixels, "longest_edge": self.max_pixels},
            image_mean=pre.get("image_mean"),
            image_std=pre.get("image_std"),
        )
        self.merge = self.config.vision_config.spatial_merge_size
        self.hidden_size = self.config.text_config.hidden_size

    def _attach_adapters(self, adapter_dir: Path) -> None:
        cfg = json.loads((adapter_dir / "adapter_config.json").read_text())
        scale = float(cfg["lora_alpha"]) / float(cfg["r"])
        tensors = _load_safetensors([adapter_dir / "adapter_model.safetensors"])
        tasks: set[str] = set()
        for name, t in tensors.items():
            key = parse_adapter_key(name)
            tasks.add(key.task)
            if key.module == "multi_vector_projector":
                if self.projector is None:
                    raise ValueError("adapter for multi_vector_projector but no projector weights")
                target: LoraLinear = self.projector  # type: ignore[assignment]
                target.scale = scale
            else:
                target = self._wrap(key.module, scale)
            (target.a if key.ab == "A" else target.b)[key.task] = t.float()
        self.tasks = ordered_adapter_tasks(tasks)

    def _wrap(self, hf_module: str, scale: float) -> LoraLinear:
        """Replace ``model.language_model.layers.N.x_proj`` by a LoraLinear (once)."""
        if hf_module in self.lora_modules:
            return self.lora_modules[hf_module]
        path = hf_module[len("model.") :].split(".")
        parent = self.model
        for part in path[:-1]:
            parent = getattr(parent, part)
        base = getattr(parent, path[-1])
        if not isinstance(base, nn.Linear):
            raise ValueError(f"adapter targets {hf_module!r}, which is not a Linear layer")
        wrapped = LoraLinear(base, scale)
        setattr(parent, path[-1], wrapped)
        self.lora_modules[hf_module] = wrapped
        return wrapped

    def set_task(self, task: str) -> None:
        if self.tasks and task not in self.tasks:
            raise ValueError(f"unknown task {task!r}; this checkpoint has {list(self.tasks)}")
        self.task = task if self.tasks else None
        for m in self.lora_modules.values():
            m.task = self.task
        if isinstance(self.projector, LoraLinear):
            self.projector.task = self.task

    # --- inputs ---------------------------------------------------------------------------

    def image_inputs(self, image: Image.Image) -> tuple[torch.Tensor, tuple[int, int, int]]:
        """HF's own patches and grid for one image (the preprocessing parity target)."""
        out = self.image_processor(images=[image], return_tensors="pt")
        grid = tuple(int(x) for x in out["image_grid_thw"][0])
        return out["pixel_values"].float(), grid  # type: ignore[return-value]

    def _vision_block(self, grid: tuple[int, int, int]) -> str:
        t, h, w = grid
        return VISION_START + IMAGE_PAD * (t * h * w // (self.merge**2)) + VISION_END

    # --- encoding -------------------------------------------------------------------------

    def encode_text(self, text: str, role: Role = "query") -> Encoded:
        prompt = text_prefix(self.task or "retrieval", role) + text
        ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        return self._run(ids, [], [], pool=(0, len(ids)))

    def encode_image(self, image: Image.Image) -> Encoded:
        pixels, grid = self.image_inputs(image)
        prompt = IMAGE_PROMPT.format(vision=self._vision_block(grid))
        ids = self.tokenizer.encode(prompt, add_special_tokens=False).ids
        return self._run(ids, [pixels], [grid], pool=self._vision_span(ids))

    def encode_content(self, parts: list[Part]) -> Encoded:
        """Interleaved text and images as ONE prompt (see the module docstring)."""
        if len(parts) == 1 and isinstance(parts[0], Image.Image):
            return self.encode_image(parts[0])
        pixels, grids, pieces = [], [], []
        for part in parts:
            if isinstance(part, Image.Image):
                px, grid = self.image_inputs(part)
                pixels.append(px)
                grids.append(grid)
                pieces.append(self._vision_block(grid))
            else:
                pieces.append(part)
        ids = self.tokenizer.encode(
            CONTENT_PROMPT.format(parts="".join(pieces)), add_special_tokens=False
        ).ids
        has_text = any(isinstance(p, str) for p in parts)
        pool = (0, len(ids)) if has_text else self._vision_span(ids)
        return self._run(ids, pixels, grids, pool=pool)

    def _vision_span(self, ids: list[int]) -> tuple[int, int]:
        start_id = self.tokenizer.token_to_id(VISION_START)
        end_id = self.tokenizer.token_to_id(VISION_END)
        return ids.index(start_id), len(ids) - ids[::-1].index(end_id)

    @torch.inference_mode()
    def _run(
        self,
        ids: list[int],
        pixels: list[torch.Tensor],
        grids: list[tuple[int, int, int]],
        pool: tuple[int, int],
    ) -> Encoded:
        input_ids = torch.tensor([ids], dtype=torch.long)
        image_id = self.tokenizer.token_to_id(IMAGE_PAD)
        is_image = input_ids == image_id
        kwargs: dict[str, torch.Tensor] = {
            "input_ids": input_ids,
            "attention_mask": torch.ones_like(input_ids),
            # without mm_token_type_ids transformers 5 silently falls back to 1-D positions
            "mm_token_type_ids": is_image.to(torch.int32),
        }
        if pixels:
            kwargs["pixel_values"] = torch.cat(pixels, dim=0).to(self.dtype)
            kwargs["image_grid_thw"] = torch.tensor(grids, dtype=torch.long)
        rows = self.model(**kwargs).last_hidden_state[0].float()
        pooled = rows[pool[0] : pool[1]].mean(dim=0)
        single = torch.nn.functional.normalize(pooled, dim=-1)
        multi = None
        if self.projector is not None:
            multi = torch.nn.functional.normalize(self.projector(rows), dim=-1).numpy()
        return Encoded(
            token_ids=ids,
            rows=rows.numpy().astype(np.float32),
            pool_start=pool[0],
            pool_end=pool[1],
            single=single.numpy().astype(np.float32),
            multi=multi,
            image_token_mask=is_image[0].numpy(),
        )
