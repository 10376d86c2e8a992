"""Random checkpoints in the real jina-embeddings-v4 layout, for tests and benchmarks.

No weights can be downloaded here, so every test and benchmark runs on checkpoints this module
writes: the same files, key names, config extras, adapters and tokenizer as the real model,
with deterministic random weights. ``tiny`` builds and runs in seconds; ``bench`` has the real
jina-v4 widths with 4 LLM and 4 ViT layers; ``full`` is the real model's shape and depth
(3.75 B parameters, 7.5 GB of bf16 in two shards), for benchmarks only.

Weights are drawn, rounded to bf16 and written one tensor at a time, so writing ``full`` needs
about its largest tensor in memory (the 1.2 GB f32 embedding), not the 15 GB f32 model.

Each tensor is drawn from its own generator seeded by (seed, tensor name), so a checkpoint is
identical run to run and independent of iteration order.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gguf_convert.layout import adapter_key, to_flat_key
from vlembed import constants
from vlembed.tasks import ADAPTER_TASKS

# LLM projections that carry task LoRA in jina-embeddings-v4 (vision is excluded).
LORA_TARGETS: tuple[str, ...] = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


@dataclass(frozen=True)
class Preset:
    """Model shape of a synthetic checkpoint."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    mrope_section: tuple[int, int, int]
    vit_hidden: int
    vit_depth: int
    vit_heads: int
    vit_intermediate: int
    fullatt_blocks: tuple[int, ...]
    lora_r: int
    lora_alpha: int
    projector_dim: int = 128
    matryoshka_dims: tuple[int, ...] = field(default=(128, 256, 512, 1024, 2048))
    shard_bytes: int = 1 << 30


PRESETS: dict[str, Preset] = {
    # head_dim 32: sum(mrope_section) == 16. alpha != r so the alpha/r scale is exercised.
    "tiny": Preset(
        hidden=128,
        layers=3,
        heads=4,
        kv_heads=2,
        intermediate=256,
        mrope_section=(4, 6, 6),
        vit_hidden=128,
        vit_depth=4,
        vit_heads=4,
        # not a multiple of 32, like the real 3420: the converter's zero padding of the vision
        # MLP (to 256) is on the path every parity test takes
        vit_intermediate=216,
        fullatt_blocks=(1, 3),
        lora_r=4,
        lora_alpha=8,
        projector_dim=32,
        matryoshka_dims=(32, 64, 128),
    ),
    # real jina-embeddings-v4 widths, 4 + 4 layers.
    "bench": Preset(
        hidden=2048,
        layers=4,
        heads=16,
        kv_heads=2,
        intermediate=11008,
        mrope_section=(16, 24, 24),
        vit_hidden=1280,
        vit_depth=4,
        vit_heads=16,
        vit_intermediate=3420,
        fullatt_blocks=(3,),
        lora_r=32,
        lora_alpha=32,
    ),
    # jina-embeddings-v4 itself: Qwen2.5-VL-3B (36 LLM layers, 32 ViT layers with full attention
    # in blocks 7, 15, 23, 31), shards of at most 5 GB like the published checkpoint.
    "full": Preset(
        hidden=2048,
        layers=36,
        heads=16,
        kv_heads=2,
        intermediate=11008,
        mrope_section=(16, 24, 24),
        vit_hidden=1280,
        vit_depth=32,
        vit_heads=16,
        vit_intermediate=3420,
        fullatt_blocks=(7, 15, 23, 31),
        lora_r=32,
        lora_alpha=32,
        shard_bytes=5_000_000_000,
    ),
}


def jina_config(p: Preset) -> dict[str, Any]:
    """config.json as jina-embeddings-v4 ships it: flat text fields, nested vision, extras."""
    return {
        "architectures": ["JinaEmbeddingsV4Model"],
        "model_type": "qwen2_5_vl",
        "attention_dropout": 0.0,
        "bos_token_id": constants.ENDOFTEXT_ID,
        "eos_token_id": constants.IM_END_ID,
        "vision_start_token_id": constants.VISION_START_ID,
        "vision_end_token_id": constants.VISION_END_ID,
        "vision_token_id": constants.VISION_PAD_ID,
        "image_token_id": constants.IMAGE_PAD_ID,
        "video_token_id": constants.VIDEO_PAD_ID,
        "hidden_act": "silu",
        "hidden_size": p.hidden,
        "initializer_range": 0.02,
        "intermediate_size": p.intermediate,
        "max_position_embeddings": 128000,
        "max_window_layers": p.layers,
        "num_attention_heads": p.heads,
        "num_hidden_layers": p.layers,
        "num_key_value_heads": p.kv_heads,
        "rms_norm_eps": 1e-06,
        "rope_scaling": {
            "type": "mrope",
            "rope_type": "default",
            "mrope_section": list(p.mrope_section),
        },
        "rope_theta": 1000000.0,
        "sliding_window": 32768,
        "use_sliding_window": False,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "use_cache": False,
        "vocab_size": constants.VOCAB_SIZE,
        "vision_config": {
            "depth": p.vit_depth,
            "hidden_act": "silu",
            "hidden_size": p.vit_hidden,
            "intermediate_size": p.vit_intermediate,
            "num_heads": p.vit_heads,
            "in_chans": 3,
            "out_hidden_size": p.hidden,
            "patch_size": constants.PATCH_SIZE,
            "spatial_merge_size": constants.MERGE_SIZE,
            "spatial_patch_size": constants.PATCH_SIZE,
            "temporal_patch_size": constants.TEMPORAL_PATCH_SIZE,
            "tokens_per_second": 2,
            "window_size": 112,
            "fullatt_block_indexes": list(p.fullatt_blocks),
        },
        # jina-embeddings-v4 extras
        "single_vector_pool_strategy": "mean",
        "multi_vector_projector_dim": p.projector_dim,
        "matryoshka_dims": list(p.matryoshka_dims),
        "task_names": list(ADAPTER_TASKS),
    }


def preprocessor_config() -> dict[str, Any]:
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2_5_VLProcessor",
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "rescale_factor": 1 / 255,
        "image_mean": list(constants.IMAGE_MEAN),
        "image_std": list(constants.IMAGE_STD),
        "min_pixels": constants.MIN_PIXELS,
        "max_pixels": constants.MAX_PIXELS,
        "patch_size": constants.PATCH_SIZE,
        "temporal_patch_size": constants.TEMPORAL_PATCH_SIZE,
        "merge_size": constants.MERGE_SIZE,
    }


def _generator(seed: int, name: str) -> torch.Generator:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little"))


def _init_tensor(seed: int, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Random values at a scale that keeps activations in a realistic range.

    Linear weights get std 1/sqrt(fan_in) scaled below 1 so the residual stream neither dies
    nor grows past f16 range over the layers; norm weights sit near 1; embeddings near 0.02
    like trained Qwen2 embeddings.
    """
    g = _generator(seed, name)
    if (
        name.endswith("norm.weight")
        or "layernorm" in name
        or name.endswith("ln_q.weight")
        or ("norm1" in name or "norm2" in name)
    ):
        return 1.0 + 0.1 * torch.randn(shape, generator=g)
    if name.endswith(".bias"):
        return 0.02 * torch.randn(shape, generator=g)
    if "embed_tokens" in name:
        return 0.02 * torch.randn(shape, generator=g)
    fan_in = math.prod(shape[1:])
    return torch.randn(shape, generator=g) * (0.5 / math.sqrt(fan_in))


def _hf_config(p: Preset):
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(**jina_config(p))


def base_shapes(p: Preset) -> dict[str, tuple[int, ...]]:
    """Base tensor names (transformers 5.x) and shapes, lm_head dropped (tied embeddings).

    Read off a model on the meta device, so the names are whatever transformers builds.
    """
    from transformers import Qwen2_5_VLForConditionalGeneration

    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(_hf_config(p))
    return {
        name: tuple(t.shape)
        for name, t in model.state_dict().items()
        if not name.startswith("lm_head.")
    }


def projector_shapes(p: Preset) -> dict[str, tuple[int, ...]]:
    return {
        "multi_vector_projector.weight": (p.projector_dim, p.hidden),
        "multi_vector_projector.bias": (p.projector_dim,),
    }


def parameter_count(p: Preset) -> int:
    """Parameters of the checkpoint's weights (base + projector; the task adapters apart)."""
    shapes = {**base_shapes(p), **projector_shapes(p)}
    return sum(math.prod(s) for s in shapes.values())


def base_state_dict(p: Preset, seed: int) -> dict[str, torch.Tensor]:
    """Base weights under their transformers 5.x names, in f32 and all in memory (small presets)."""
    return {name: _init_tensor(seed, name, shape) for name, shape in base_shapes(p).items()}


def projector_state_dict(p: Preset, seed: int) -> dict[str, torch.Tensor]:
    return {name: _init_tensor(seed, name, shape) for name, shape in projector_shapes(p).items()}


def lora_modules(p: Preset) -> list[str]:
    """Modules that carry task LoRA: every LLM projection and the multi-vector projector."""
    out = [f"model.language_model.layers.{i}.{t}" for i in range(p.layers) for t in LORA_TARGETS]
    out.append("multi_vector_projector")
    return out


def lora_state_dict(
    p: Preset, seed: int, base_std: dict[str, float], shapes: dict[str, tuple[int, ...]]
) -> dict[str, torch.Tensor]:
    """Task LoRA for every LLM projection and the projector; B is non-zero so tasks differ.

    Scaled so each task's delta B·A·alpha/r is about a third of the base weight's spread.
    ``base_std`` and ``shapes`` give each module's f32 weight spread and shape, so the base
    weights need not be in memory.
    """
    scale = p.lora_alpha / p.lora_r
    out: dict[str, torch.Tensor] = {}
    for module in lora_modules(p):
        n_out, n_in = shapes[module + ".weight"]
        a_std = 1.0 / math.sqrt(n_in)
        b_std = 0.33 * base_std[module] / (scale * math.sqrt(p.lora_r) * a_std)
        for task in ADAPTER_TASKS:
            ka, kb = adapter_key(module, "A", task), adapter_key(module, "B", task)
            out[ka] = torch.randn((p.lora_r, n_in), generator=_generator(seed, ka)) * a_std
            out[kb] = torch.randn((n_out, p.lora_r), generator=_generator(seed, kb)) * b_std
    return out


def adapter_config(p: Preset) -> dict[str, Any]:
    return {
        "peft_type": "LORA",
        "task_type": "FEATURE_EXTRACTION",
        "base_model_name_or_path": "jinaai/jina-embeddings-v4",
        "r": p.lora_r,
        "lora_alpha": p.lora_alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "inference_mode": True,
        "target_modules": (
            r"(.*(model).*(down_proj|gate_proj|up_proj|k_proj|q_proj|v_proj|o_proj).*$"
            r"|.*(multi_vector_projector).*$)"
        ),
        "task_names": list(ADAPTER_TASKS),
    }


def write_safetensors(
    path: Path,
    shapes: dict[str, tuple[int, ...]],
    draw: Callable[[str], torch.Tensor],
    dtype: torch.dtype = torch.bfloat16,
) -> None:
    """A safetensors file written one tensor at a time: ``draw(name)`` is called in file order
    and its result dropped once written.

    The header is known from the shapes alone, so nothing but the current tensor is held.
    """
    item = torch.empty((), dtype=dtype).element_size()
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        n = math.prod(shape) * item
        header[name] = {
            "dtype": _SAFETENSORS_DTYPES[dtype],
            "shape": list(shape),
            "data_offsets": [offset, offset + n],
        }
        offset += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    with path.open("wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for name, shape in shapes.items():
            t = draw(name).to(dtype).contiguous()
            if tuple(t.shape) != tuple(shape):
                raise ValueError(f"{name!r}: drew shape {tuple(t.shape)}, header says {shape}")
            f.write(t.reshape(-1).view(torch.uint8).numpy().data)


_SAFETENSORS_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def _save_sharded(
    shapes: dict[str, tuple[int, ...]],
    draw: Callable[[str], torch.Tensor],
    out: Path,
    shard_bytes: int,
) -> None:
    """model.safetensors, or model-0000N-of-0000M.safetensors + index when over shard_bytes.

    Tensors go in name order, bf16, a new shard starting where the next tensor would overflow.
    """
    shards: list[dict[str, tuple[int, ...]]] = [{}]
    size = 0
    for name in sorted(shapes):
        nbytes = math.prod(shapes[name]) * 2
        if shards[-1] and size + nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = shapes[name]
        size += nbytes
    if len(shards) == 1:
        write_safetensors(out / "model.safetensors", shards[0], draw)
        return
    weight_map: dict[str, str] = {}
    total = 0
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(out / fname, shard, draw)
        for name, shape in shard.items():
            weight_map[name] = fname
            total += math.prod(shape) * 2
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def _write_jina_weights(p: Preset, seed: int, out: Path) -> dict[str, float]:
    """The base + projector shards, each tensor drawn as it is written; returns the f32 spread
    of every LoRA target's weight (what the adapters are scaled by)."""
    stored: dict[str, tuple[str, tuple[int, ...]]] = {
        to_flat_key(name): (name, shape) for name, shape in base_shapes(p).items()
    }
    stored.update({name: (name, shape) for name, shape in projector_shapes(p).items()})
    targets = {m + ".weight" for m in lora_modules(p)}
    spread: dict[str, float] = {}

    def draw(key: str) -> torch.Tensor:
        name, shape = stored[key]
        t = _init_tensor(seed, name, shape)
        if name in targets:
            spread[name[: -len(".weight")]] = float(t.std())
        return t

    _save_sharded({k: shape for k, (_, shape) in stored.items()}, draw, out, p.shard_bytes)
    return spread


def write_tokenizer(out: Path, vocab_gguf: Path) -> None:
    from gguf_convert.tokenizer_build import build_tokenizer

    tok = build_tokenizer(vocab_gguf)
    tok.save(str(out / "tokenizer.json"))
    added = {
        str(tok.token_to_id(t)): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for t in constants.SPECIAL_TOKENS
    }
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "Qwen2Tokenizer",
                "added_tokens_decoder": added,
                "bos_token": None,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "model_max_length": 131072,
                "clean_up_tokenization_spaces": False,
                "split_special_tokens": False,
                "errors": "replace",
            },
            indent=2,
        )
    )


def make_checkpoint(
    out: Path,
    preset: str = "tiny",
    seed: int = 0,
    *,
    layout: str = "jina",
    vocab_gguf: Path | None = None,
    plain_task: str = "retrieval",
) -> Path:
    """Write a random checkpoint and return its directory.

    ``layout="jina"`` is the real jina-embeddings-v4 layout (flat base keys, bf16, adapters,
    projector, jina config extras). ``layout="qwen"`` is a plain Qwen2.5-VL directory (hub
    layout) with ``plain_task``'s LoRA merged in and no projector, like the merged vLLM variants
    of jina-v4 (single vector only).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    if layout not in ("jina", "qwen"):
        raise ValueError(f"unknown layout {layout!r}; choose 'jina' or 'qwen'")
    if layout == "qwen" and preset == "full":
        raise ValueError("layout 'qwen' merges in memory (15 GB of f32 at full); use 'jina'")
    if vocab_gguf is None:
        from llama_patches.build import pristine_source

        vocab_gguf = pristine_source() / "models" / "ggml-vocab-qwen2.gguf"
    p = PRESETS[preset]
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)

    shapes = {**base_shapes(p), **projector_shapes(p)}
    if layout == "jina":
        spread = _write_jina_weights(p, seed, out)
        lora = lora_state_dict(p, seed, spread, shapes)
        (out / "adapters").mkdir()
        write_safetensors(
            out / "adapters" / "adapter_model.safetensors",
            {k: tuple(v.shape) for k, v in lora.items()},
            lambda k: lora[k],
        )
        (out / "adapters" / "adapter_config.json").write_text(
            json.dumps(adapter_config(p), indent=2)
        )
        config = jina_config(p)
    else:
        # Hub Qwen2.5-VL checkpoints keep the flat key names and flat config too. Built in
        # memory: fine for tiny and bench, not for full.
        base = base_state_dict(p, seed)
        spread = {m: float(base[m + ".weight"].std()) for m in lora_modules(p)[:-1]}
        spread["multi_vector_projector"] = float(
            projector_state_dict(p, seed)["multi_vector_projector.weight"].std()
        )
        lora = lora_state_dict(p, seed, spread, shapes)
        merged = merged_task_weights(base, lora, p, plain_task)
        tensors = {to_flat_key(k): v for k, v in merged.items()}
        _save_sharded(
            {k: tuple(v.shape) for k, v in tensors.items()}, tensors.__getitem__, out, p.shard_bytes
        )
        config = jina_config(p)
        config["architectures"] = ["Qwen2_5_VLForConditionalGeneration"]
        for extra in (
            "single_vector_pool_strategy",
            "multi_vector_projector_dim",
            "matryoshka_dims",
            "task_names",
        ):
            del config[extra]
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "preprocessor_config.json").write_text(json.dumps(preprocessor_config(), indent=2))
    write_tokenizer(out, vocab_gguf)
    return out


def merged_task_weights(
    base: dict[str, torch.Tensor], lora: dict[str, torch.Tensor], p: Preset, task: str
) -> dict[str, torch.Tensor]:
    """Base weights (5.x names) with ``task``'s LoRA merged in f32: W' = W + B·A·alpha/r.

    Works on the bf16-rounded values the jina layout stores, so the plain layout describes
    the same model as the jina checkpoint of the same seed.
    """
    scale = p.lora_alpha / p.lora_r
    merged = {}
    for name, w in base.items():
        w32 = w.to(torch.bfloat16).float()
        module = name[: -len(".weight")] if name.endswith(".weight") else None
        ka = adapter_key(module, "A", task) if module else None
        if ka is not None and ka in lora:
            a = lora[ka].to(torch.bfloat16).float()
            b = lora[adapter_key(module, "B", task)].to(torch.bfloat16).float()
            w32 = w32 + (b @ a) * scale
        merged[name] = w32
    return merged


def main(argv: list[str] | None = None) -> int:
    """``vlembed make-synthetic``: write a random checkpoint and print its directory."""
    import argparse
    import sys
    import time

    p = argparse.ArgumentParser(
        prog="vlembed make-synthetic",
        description="write a random checkpoint in the real jina-embeddings-v4 layout",
    )
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="directory to (re)create")
    p.add_argument(
        "--layout",
        choices=["jina", "qwen"],
        default="jina",
        help="jina: jina-v4 layout with task adapters; qwen: plain Qwen2.5-VL, retrieval merged",
    )
    p.add_argument("--vocab", help="ggml-vocab-qwen2.gguf (default: from the pinned llama.cpp)")
    args = p.parse_args(argv)
    start = time.perf_counter()
    out = make_checkpoint(
        Path(args.out),
        args.preset,
        args.seed,
        layout=args.layout,
        vocab_gguf=Path(args.vocab) if args.vocab else None,
    )
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    took = time.perf_counter() - start
    print(f"wrote {args.preset} checkpoint ({size / 1e6:.1f} MB) in {took:.1f} s", file=sys.stderr)
    print(out)
    return 0
