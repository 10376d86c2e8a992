"""Write the text GGUF (one per task) and the mmproj GGUF with gguf-py's typed writers.

Why gguf-py directly rather than the pinned ``convert_hf_to_gguf.py``: jina-v4 needs three
things that script does not do — merge a task's LoRA in f32 while streaming, read the flat
pre-5.0 keys and the 5.x keys alike, and add the flat patch weight the patched server uses.
The metadata written here is the set the pinned script writes for Qwen2.5-VL (checked by a
test that converts the same checkpoint both ways), so llama.cpp's loader needs no change.
Tensors are written in two passes (tensor infos first, then data one tensor at a time), so
memory stays at one tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from gguf_convert import tensor_map
from gguf_convert.checkpoint import Checkpoint
from vlembed import constants


def load_gguf() -> ModuleType:
    """gguf-py (the ``gguf`` package of the convert extra): one copy, imported on use.

    Its key names and typed writers are llama.cpp's own; a test converts the same checkpoint
    with the pinned tree's convert_hf_to_gguf.py and compares the metadata, so a gguf release
    that drifted from the pinned server would fail there.
    """
    import gguf

    return gguf


@dataclass
class Planned:
    """One output tensor: its name, shape (row-major, as numpy) and how to produce it."""

    name: str
    shape: tuple[int, ...]
    produce: Callable[[], np.ndarray]


def _cast(gguf: ModuleType, data: np.ndarray, dtype: str) -> tuple[np.ndarray, object | None]:
    """Norms and biases (1-D) stay f32 as upstream does; matrices take the requested type."""
    if data.ndim < 2 or dtype == "f32":
        return data.astype(np.float32, copy=False), None
    if dtype == "f16":
        return data.astype(np.float16), None
    qtype = gguf.GGMLQuantizationType.BF16
    return gguf.quants.quantize(data.astype(np.float32, copy=False), qtype), qtype


def _nbytes(shape: tuple[int, ...], dtype: str) -> tuple[np.dtype, int]:
    n = int(np.prod(shape))
    if len(shape) < 2 or dtype == "f32":
        return np.dtype(np.float32), n * 4
    return (np.dtype(np.float16), n * 2) if dtype == "f16" else (np.dtype(np.uint8), n * 2)


def _tensor_dtype(name: str, dtype: str) -> str:
    """The flat patch weight stays f32 in every file type: it multiplies exact f32 patch rows,
    rounding it to f16/bf16 only loses precision, and it is small (~5.7 MiB for a 1280-wide
    tower)."""
    return "f32" if name == tensor_map.PATCH_EMBED_FLAT else dtype


def _write(
    gguf: ModuleType,
    writer,
    path: Path,
    planned: list[Planned],
    dtype: str,
    progress: Callable[[str], None],
) -> None:
    for p in planned:
        np_dtype, nbytes = _nbytes(p.shape, _tensor_dtype(p.name, dtype))
        raw = gguf.GGMLQuantizationType.BF16 if np_dtype == np.uint8 else None
        shape = p.shape if raw is None else (*p.shape[:-1], p.shape[-1] * 2)
        writer.add_tensor_info(p.name, shape, np_dtype, nbytes, raw_dtype=raw)
    tmp = path.with_name(path.name + ".partial")
    writer.write_header_to_file(tmp)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for i, p in enumerate(planned, 1):
        data, _ = _cast(gguf, p.produce(), _tensor_dtype(p.name, dtype))
        if tuple(data.shape[:-1]) != p.shape[:-1]:
            raise AssertionError(f"{p.name}: produced {data.shape}, planned {p.shape}")
        writer.write_tensor_data(data)
        progress(f"{path.name}: {i}/{len(planned)} {p.name}")
    writer.close()
    tmp.replace(path)  # atomic: a half-written file never carries the final name


def _file_type(gguf: ModuleType, dtype: str) -> int:
    return {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "bf16": gguf.LlamaFileType.MOSTLY_BF16,
    }[dtype]


def write_text_gguf(
    ckpt: Checkpoint,
    task: str | None,
    out: Path,
    dtype: str,
    tokenizer: Iterable[tuple[str, int]],
    merges: list[str],
    name: str,
    progress: Callable[[str], None] = lambda _: None,
) -> Path:
    """The language model with ``task``'s LoRA merged in f32 (``None``: base weights as is)."""
    gguf = load_gguf()
    tc = ckpt.text_config
    arch = "qwen2vl"
    w = gguf.GGUFWriter(None, arch)
    w.add_type("model")
    w.add_name(name)
    w.add_block_count(int(tc["num_hidden_layers"]))
    w.add_context_length(int(tc.get("max_position_embeddings", 128000)))
    w.add_embedding_length(int(tc["hidden_size"]))
    w.add_feed_forward_length(int(tc["intermediate_size"]))
    w.add_head_count(int(tc["num_attention_heads"]))
    w.add_head_count_kv(int(tc.get("num_key_value_heads", tc["num_attention_heads"])))
    rope = tc.get("rope_scaling") or tc.get("rope_parameters") or {}
    section = list(rope.get("mrope_section", []))
    if len(section) != 3:
        raise ValueError(f"config has no 3-part mrope_section (got {section!r})")
    w.add_rope_dimension_sections(section + [0])
    w.add_rope_freq_base(float(rope.get("rope_theta", tc.get("rope_theta", 1e6))))
    w.add_layer_norm_rms_eps(float(tc.get("rms_norm_eps", 1e-6)))
    w.add_file_type(_file_type(gguf, dtype))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokens, types = zip(*tokenizer, strict=True)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(list(tokens))
    w.add_token_types(list(types))
    w.add_token_merges(merges)
    w.add_eos_token_id(constants.IM_END_ID)
    w.add_pad_token_id(constants.ENDOFTEXT_ID)
    w.add_bos_token_id(constants.ENDOFTEXT_ID)
    w.add_add_bos_token(False)  # jina-v4 prompts carry no BOS

    planned: list[Planned] = []
    for hf in ckpt.names():
        gg = tensor_map.text_name(hf)
        if gg is None:
            continue
        if hf == "lm_head.weight" and ckpt.config.get("tie_word_embeddings", False):
            continue
        planned.append(Planned(gg, ckpt.shape(hf), lambda hf=hf: ckpt.load(hf, task)))
    if not any(p.name == "token_embd.weight" for p in planned):
        raise ValueError("checkpoint has no language model embeddings (embed_tokens)")
    _write(gguf, w, out, planned, dtype, progress)
    return out


def write_mmproj_gguf(
    ckpt: Checkpoint,
    out: Path,
    dtype: str,
    name: str,
    progress: Callable[[str], None] = lambda _: None,
) -> Path:
    """The vision tower + merger, with ``v.patch_embd.weight_flat`` for precomputed patches."""
    gguf = load_gguf()
    vc = ckpt.config["vision_config"]
    tc = ckpt.text_config
    pre = ckpt.preprocessor
    depth = int(vc["depth"])
    fullatt = list(vc.get("fullatt_block_indexes", []))
    period = fullatt[0] + 1 if fullatt else 0
    if fullatt and fullatt != list(range(period - 1, depth, period)):
        raise ValueError(
            f"fullatt_block_indexes {fullatt} are not periodic [p-1, 2p-1, ...]: llama.cpp "
            "stores a single window-attention period"
        )
    w = gguf.GGUFWriter(None, "clip")
    w.add_type("mmproj")
    w.add_name(name)
    w.add_file_type(_file_type(gguf, dtype))
    w.add_clip_has_vision_encoder(True)
    w.add_vision_projection_dim(int(vc.get("out_hidden_size", tc["hidden_size"])))
    w.add_vision_image_size(560)  # what the pinned converter writes for Qwen2.5-VL
    w.add_vision_patch_size(int(vc.get("patch_size", constants.PATCH_SIZE)))
    w.add_vision_embedding_length(int(vc["hidden_size"]))
    w.add_vision_feed_forward_length(tensor_map.padded_ffn_width(int(vc["intermediate_size"])))
    w.add_vision_block_count(depth)
    w.add_vision_head_count(int(vc["num_heads"]))
    w.add_vision_image_mean([float(x) for x in pre.get("image_mean", constants.IMAGE_MEAN)])
    w.add_vision_image_std([float(x) for x in pre.get("image_std", constants.IMAGE_STD)])
    w.add_clip_projector_type(gguf.VisionProjectorType.QWEN25VL)
    w.add_vision_use_silu(vc.get("hidden_act", "silu") == "silu")
    if period:
        w.add_vision_n_wa_pattern(period)
    w.add_vision_attention_layernorm_eps(float(tc.get("rms_norm_eps", 1e-6)))
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    planned: list[Planned] = []
    for hf in ckpt.names():
        if not hf.startswith("model.visual."):
            continue
        for gg, shape in tensor_map.vision_shapes(hf, ckpt.shape(hf)):

            def produce(hf: str = hf, gg: str = gg) -> np.ndarray:
                return dict(tensor_map.vision_tensors(hf, ckpt.load(hf)))[gg]

            planned.append(Planned(gg, shape, produce))
    if not planned:
        raise ValueError("checkpoint has no vision tower (visual.* tensors)")
    _write(gguf, w, out, planned, dtype, progress)
    return out
