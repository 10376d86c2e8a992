"""HF (transformers 5.x names) → GGUF tensor names, as a data table.

Names follow the pinned llama.cpp (``qwen2vl`` text arch, ``clip`` mmproj with the
``qwen2.5vl_merger`` projector), so its loader needs no change for them. ``{bid}`` stands for the
block index. Tensors that split or gain a derived twin are handled by ``vision_tensors`` below.
"""

from __future__ import annotations

import re

import numpy as np

# Qwen2.5-VL language model (jina-embeddings-v4 backbone)
TEXT_TENSORS: dict[str, str] = {
    "model.language_model.embed_tokens.weight": "token_embd.weight",
    "model.language_model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",  # absent when embeddings are tied (jina-v4)
    "model.language_model.layers.{bid}.input_layernorm.weight": "blk.{bid}.attn_norm.weight",
    "model.language_model.layers.{bid}.post_attention_layernorm.weight": (
        "blk.{bid}.ffn_norm.weight"
    ),
    "model.language_model.layers.{bid}.self_attn.q_proj.weight": "blk.{bid}.attn_q.weight",
    "model.language_model.layers.{bid}.self_attn.q_proj.bias": "blk.{bid}.attn_q.bias",
    "model.language_model.layers.{bid}.self_attn.k_proj.weight": "blk.{bid}.attn_k.weight",
    "model.language_model.layers.{bid}.self_attn.k_proj.bias": "blk.{bid}.attn_k.bias",
    "model.language_model.layers.{bid}.self_attn.v_proj.weight": "blk.{bid}.attn_v.weight",
    "model.language_model.layers.{bid}.self_attn.v_proj.bias": "blk.{bid}.attn_v.bias",
    "model.language_model.layers.{bid}.self_attn.o_proj.weight": "blk.{bid}.attn_output.weight",
    "model.language_model.layers.{bid}.mlp.gate_proj.weight": "blk.{bid}.ffn_gate.weight",
    "model.language_model.layers.{bid}.mlp.up_proj.weight": "blk.{bid}.ffn_up.weight",
    "model.language_model.layers.{bid}.mlp.down_proj.weight": "blk.{bid}.ffn_down.weight",
}

# Qwen2.5-VL vision tower + patch merger
VISION_TENSORS: dict[str, str] = {
    "model.visual.blocks.{bid}.norm1.weight": "v.blk.{bid}.ln1.weight",
    "model.visual.blocks.{bid}.norm2.weight": "v.blk.{bid}.ln2.weight",
    "model.visual.blocks.{bid}.attn.proj.weight": "v.blk.{bid}.attn_out.weight",
    "model.visual.blocks.{bid}.attn.proj.bias": "v.blk.{bid}.attn_out.bias",
    "model.visual.blocks.{bid}.mlp.gate_proj.weight": "v.blk.{bid}.ffn_gate.weight",
    "model.visual.blocks.{bid}.mlp.gate_proj.bias": "v.blk.{bid}.ffn_gate.bias",
    "model.visual.blocks.{bid}.mlp.up_proj.weight": "v.blk.{bid}.ffn_up.weight",
    "model.visual.blocks.{bid}.mlp.up_proj.bias": "v.blk.{bid}.ffn_up.bias",
    "model.visual.blocks.{bid}.mlp.down_proj.weight": "v.blk.{bid}.ffn_down.weight",
    "model.visual.blocks.{bid}.mlp.down_proj.bias": "v.blk.{bid}.ffn_down.bias",
    "model.visual.merger.ln_q.weight": "v.post_ln.weight",
    "model.visual.merger.mlp.0.weight": "mm.0.weight",
    "model.visual.merger.mlp.0.bias": "mm.0.bias",
    "model.visual.merger.mlp.2.weight": "mm.2.weight",
    "model.visual.merger.mlp.2.bias": "mm.2.bias",
}

PATCH_EMBED = "model.visual.patch_embed.proj.weight"
# The conv3d kernel flattened to [embed, 3*2*14*14]: the patched server multiplies precomputed
# HF patch rows (laid out [C, T, 14, 14]) by it in one matmul. Because conv3d stride == kernel,
# that matmul IS the conv3d.
PATCH_EMBED_FLAT = "v.patch_embd.weight_flat"
_QKV = re.compile(r"^model\.visual\.blocks\.(\d+)\.attn\.qkv\.(weight|bias)$")
_FFN = re.compile(
    r"^model\.visual\.blocks\.\d+\.mlp\.(gate_proj|up_proj|down_proj)\.(weight|bias)$"
)

# ggml's fast CPU matmuls need the reduced dimension to be a multiple of a block: 32 for the
# llamafile kernels (f32, f16, bf16, Q8_0), 256 for the tiled VNNI K-quant kernels. Qwen2.5-VL's
# ViT MLP is 3420 wide, so its down projection fell back to one dot product per output (29 % of
# a 448x448 image's time, perf) and could not be K-quantised. Padding the MLP's hidden width with
# zeros is exact: a padded gate/up row gives silu(0 + 0) * (0 + 0) = 0, which meets a zero
# column of the down projection. Cost: 3420 -> 3584 is 4.8 % more MLP work.
VISION_FFN_MULTIPLE = 256


def padded_ffn_width(width: int) -> int:
    """The vision MLP's hidden width as written: ``width`` rounded up to VISION_FFN_MULTIPLE."""
    return -(-width // VISION_FFN_MULTIPLE) * VISION_FFN_MULTIPLE


def _ffn_axis(hf_name: str) -> int | None:
    """The hidden-width axis of a vision MLP tensor (None: not one, or down_proj's bias)."""
    m = _FFN.match(hf_name)
    if not m or m.groups() == ("down_proj", "bias"):
        return None
    return 1 if m.group(1) == "down_proj" else 0


def _pad_ffn(axis: int, data: np.ndarray) -> np.ndarray:
    """Zero-pad ``axis``: rows of gate/up (and their biases), columns of down."""
    extra = padded_ffn_width(data.shape[axis]) - data.shape[axis]
    if extra == 0:
        return data
    widths = [(0, 0)] * data.ndim
    widths[axis] = (0, extra)
    return np.pad(data, widths)


def _compile(table: dict[str, str]) -> list[tuple[re.Pattern[str], str]]:
    out = []
    for hf, gg in table.items():
        pattern = "^" + re.escape(hf).replace(r"\{bid\}", r"(?P<bid>\d+)") + "$"
        out.append((re.compile(pattern), gg))
    return out


_TEXT = _compile(TEXT_TENSORS)
_VISION = _compile(VISION_TENSORS)


def _lookup(table: list[tuple[re.Pattern[str], str]], name: str) -> str | None:
    for pattern, gg in table:
        m = pattern.match(name)
        if m:
            return gg.format(bid=m.groupdict().get("bid"))
    return None


def text_name(hf_name: str) -> str | None:
    """GGUF name of a language-model tensor, or None when it is not one."""
    return _lookup(_TEXT, hf_name)


def vision_tensors(hf_name: str, data: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """GGUF (name, data) pairs for one vision tensor; [] when it is not a vision tensor.

    qkv is split into q, k, v (llama.cpp keeps them apart); the conv3d patch kernel
    [embed, 3, 2, 14, 14] becomes the two temporal conv2d halves upstream's raw-image path uses
    plus the flat [embed, 1176] matrix for precomputed patches.
    """
    if hf_name == PATCH_EMBED:
        embed = data.shape[0]
        return [
            ("v.patch_embd.weight", np.ascontiguousarray(data[:, :, 0])),
            ("v.patch_embd.weight.1", np.ascontiguousarray(data[:, :, 1])),
            (PATCH_EMBED_FLAT, np.ascontiguousarray(data.reshape(embed, -1))),
        ]
    m = _QKV.match(hf_name)
    if m:
        bid, kind = m.groups()
        q, k, v = np.split(data, 3, axis=0)
        return [
            (f"v.blk.{bid}.attn_{x}.{kind}", np.ascontiguousarray(t))
            for x, t in zip("qkv", (q, k, v), strict=True)
        ]
    gg = _lookup(_VISION, hf_name)
    if gg is None:
        return []
    axis = _ffn_axis(hf_name)
    return [(gg, data if axis is None else _pad_ffn(axis, data))]


def vision_shapes(hf_name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...]]]:
    """Shapes ``vision_tensors`` will produce, without loading the data."""
    fake = np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), shape, [0] * len(shape))
    axis = _ffn_axis(hf_name)
    if axis is not None:  # np.pad would materialise the zero-strided array
        padded = list(shape)
        padded[axis] = padded_ffn_width(shape[axis])
        return [(_lookup(_VISION, hf_name), tuple(padded))]
    return [(n, tuple(t.shape)) for n, t in vision_tensors(hf_name, fake)]
