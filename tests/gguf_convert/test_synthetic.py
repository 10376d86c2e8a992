import hashlib
import json
import math
from pathlib import Path

import pytest
from safetensors import safe_open

from gguf_convert.layout import parse_adapter_key
from gguf_convert.synthetic import PRESETS, base_shapes, make_checkpoint, projector_shapes
from vlembed.tasks import ADAPTER_TASKS as TASKS


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def test_jina_layout(tiny_checkpoint: Path) -> None:
    cfg = json.loads((tiny_checkpoint / "config.json").read_text())
    assert cfg["architectures"] == ["JinaEmbeddingsV4Model"]
    assert cfg["task_names"] == list(TASKS)
    assert cfg["multi_vector_projector_dim"] == PRESETS["tiny"].projector_dim
    assert (
        sum(cfg["rope_scaling"]["mrope_section"]) * 2
        == cfg["hidden_size"] // cfg["num_attention_heads"]
    )
    vc = cfg["vision_config"]
    assert vc["depth"] >= 4 and vc["fullatt_block_indexes"] and cfg["num_hidden_layers"] >= 2
    with safe_open(str(tiny_checkpoint / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.layers.0.self_attn.q_proj.weight" in keys  # old flat format
    assert "visual.patch_embed.proj.weight" in keys
    assert "multi_vector_projector.weight" in keys and "multi_vector_projector.bias" in keys
    assert not any(k.startswith("lm_head") or "language_model" in k for k in keys)
    with safe_open(str(tiny_checkpoint / "adapters" / "adapter_model.safetensors"), "pt") as f:
        parsed = [parse_adapter_key(k) for k in f.keys()]
        b = f.get_tensor("base_model.model.multi_vector_projector.lora_B.code.weight")
    assert {p.task for p in parsed} == set(TASKS)
    assert any(p.module == "multi_vector_projector" for p in parsed)
    assert not any("visual" in p.module for p in parsed)  # vision carries no LoRA
    assert float(b.float().abs().max()) > 0  # B non-zero: tasks really differ
    acfg = json.loads((tiny_checkpoint / "adapters" / "adapter_config.json").read_text())
    assert acfg["r"] == PRESETS["tiny"].lora_r and acfg["lora_alpha"] == PRESETS["tiny"].lora_alpha
    assert (tiny_checkpoint / "tokenizer.json").is_file()
    assert (tiny_checkpoint / "preprocessor_config.json").is_file()


def test_deterministic_for_a_seed(tmp_path: Path, tiny_checkpoint: Path, vocab_gguf: Path) -> None:
    again = make_checkpoint(tmp_path / "again", "tiny", 0, vocab_gguf=vocab_gguf)
    other = make_checkpoint(tmp_path / "other", "tiny", 1, vocab_gguf=vocab_gguf)
    assert _digest(again) == _digest(tiny_checkpoint)
    assert _digest(other) != _digest(tiny_checkpoint)


def test_shards_with_index_when_large(
    tmp_path: Path, vocab_gguf: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dataclasses

    import gguf_convert.synthetic as syn

    small = dataclasses.replace(PRESETS["tiny"], shard_bytes=20 << 20)
    monkeypatch.setitem(syn.PRESETS, "tiny", small)
    out = make_checkpoint(tmp_path / "sharded", "tiny", 0, vocab_gguf=vocab_gguf)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    shards = set(index["weight_map"].values())
    assert len(shards) >= 2 and all((out / s).is_file() for s in shards)
    assert not (out / "model.safetensors").exists()


def test_unknown_preset_is_rejected(tmp_path: Path, vocab_gguf: Path) -> None:
    with pytest.raises(ValueError, match="unknown preset"):
        make_checkpoint(tmp_path / "x", "huge", 0, vocab_gguf=vocab_gguf)


def test_bench_preset_has_real_jina_widths() -> None:
    p = PRESETS["bench"]
    assert (p.hidden, p.heads, p.kv_heads, p.intermediate) == (2048, 16, 2, 11008)
    assert (p.vit_hidden, p.vit_heads, p.vit_intermediate) == (1280, 16, 3420)
    assert (p.layers, p.vit_depth) == (4, 4)
    assert sum(p.mrope_section) == p.hidden // p.heads // 2


# jina-embeddings-v4's published config (Qwen2.5-VL-3B backbone), spelled out here on purpose.
JINA_V4_TEXT = {
    "hidden_size": 2048,
    "num_hidden_layers": 36,
    "num_attention_heads": 16,
    "num_key_value_heads": 2,
    "intermediate_size": 11008,
    "vocab_size": 151936,
}
JINA_V4_VISION = {
    "depth": 32,
    "hidden_size": 1280,
    "num_heads": 16,
    "intermediate_size": 3420,
    "fullatt_block_indexes": [7, 15, 23, 31],
    "out_hidden_size": 2048,
}


def test_full_preset_is_jina_v4s_shape() -> None:
    from gguf_convert.synthetic import jina_config

    cfg = jina_config(PRESETS["full"])
    assert {k: cfg[k] for k in JINA_V4_TEXT} == JINA_V4_TEXT
    assert {k: cfg["vision_config"][k] for k in JINA_V4_VISION} == JINA_V4_VISION
    assert cfg["torch_dtype"] == "bfloat16" and cfg["tie_word_embeddings"] is True


def test_full_preset_has_jina_v4s_parameter_count() -> None:
    """3.75 B as published: 3.09 B language model (tied embeddings) + 0.67 B vision tower."""
    from gguf_convert.synthetic import parameter_count

    p = PRESETS["full"]
    total = parameter_count(p)
    assert 3.74e9 < total < 3.76e9
    vision = sum(
        math.prod(shape)
        for name, shape in base_shapes(p).items()
        if name.startswith("model.visual")
    )
    assert 0.66e9 < vision < 0.68e9


def test_full_preset_shards_like_the_real_checkpoint() -> None:
    """Two shards of at most 5 GB of bf16, as jina-embeddings-v4 is published."""
    p = PRESETS["full"]
    bf16_bytes = 2 * sum(math.prod(s) for s in {**base_shapes(p), **projector_shapes(p)}.values())
    assert math.ceil(bf16_bytes / p.shard_bytes) == 2


def test_full_preset_refuses_the_in_memory_layout(tmp_path: Path, vocab_gguf: Path) -> None:
    with pytest.raises(ValueError, match="merges in memory"):
        make_checkpoint(tmp_path / "x", "full", 0, layout="qwen", vocab_gguf=vocab_gguf)
    assert not (tmp_path / "x").exists()
