"""Converter checks that need no llama.cpp build: tensors, metadata, manifest, failures."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gguf_convert.convert import convert
from gguf_convert.tensor_map import padded_ffn_width
from gguf_convert.writer import load_gguf
from vlembed.manifest import load_manifest


@pytest.fixture(scope="module")
def converted(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("conv") / "tiny-f32"
    convert(tiny_checkpoint, out, dtype="f32", progress=lambda _: None)
    return out


def _tensors(path: Path) -> dict[str, np.ndarray]:
    gguf = load_gguf()
    reader = gguf.GGUFReader(str(path))
    return {t.name: np.array(t.data) for t in reader.tensors}


def _fields(path: Path) -> dict[str, object]:
    gguf = load_gguf()
    reader = gguf.GGUFReader(str(path))
    out = {}
    for k, f in reader.fields.items():
        if k.startswith("GGUF.") or k in ("general.name", "general.size_label"):
            continue
        out[k] = f.contents()
    return out


def test_text_gguf_equals_reference_merged_weights(converted: Path, tiny_reference) -> None:
    """Merge computed independently from the reference's unmerged LoRA modules."""
    for task in tiny_reference.tasks:
        tensors = _tensors(converted / f"text-{task}-f32.gguf")
        worst = 0.0
        for module_name, lora in tiny_reference.lora_modules.items():
            bid = module_name.split(".")[3]
            proj = module_name.split(".")[-1]
            gg = {
                "q_proj": "attn_q",
                "k_proj": "attn_k",
                "v_proj": "attn_v",
                "o_proj": "attn_output",
                "gate_proj": "ffn_gate",
                "up_proj": "ffn_up",
                "down_proj": "ffn_down",
            }[proj]
            want = (
                lora.base.weight.detach().numpy()
                + (lora.b[task].numpy() @ lora.a[task].numpy()) * lora.scale
            )
            got = tensors[f"blk.{bid}.{gg}.weight"]
            assert got.shape == want.shape
            worst = max(worst, float(np.abs(got - want).max()))
        assert worst <= 1e-6, (task, worst)
        emb = tiny_reference.model.language_model.embed_tokens.weight.detach().numpy()
        assert np.array_equal(tensors["token_embd.weight"], emb)


def test_tasks_differ_and_projector_matches(converted: Path, tiny_reference) -> None:
    q = {
        t: _tensors(converted / f"text-{t}-f32.gguf")["blk.0.attn_q.weight"]
        for t in tiny_reference.tasks
    }
    assert not np.allclose(q["retrieval"], q["code"])
    for task in tiny_reference.tasks:
        proj = np.load(converted / f"projector-{task}.npz")
        lora = tiny_reference.projector
        want = (
            lora.base.weight.detach().numpy()
            + (lora.b[task].numpy() @ lora.a[task].numpy()) * lora.scale
        )
        assert np.abs(proj["weight"] - want).max() <= 1e-6
        assert np.array_equal(proj["bias"], lora.base.bias.detach().numpy())


def test_mmproj_has_flat_patch_weight(converted: Path, tiny_reference) -> None:
    t = _tensors(converted / "mmproj-f32.gguf")
    conv = tiny_reference.model.visual.patch_embed.proj.weight.detach().numpy()
    assert np.array_equal(t["v.patch_embd.weight_flat"], conv.reshape(conv.shape[0], 1176))
    assert np.array_equal(t["v.patch_embd.weight"], conv[:, :, 0])
    assert np.array_equal(t["v.patch_embd.weight.1"], conv[:, :, 1])


def test_metadata_matches_pinned_converter(
    tiny_plain_checkpoint: Path, llama_source: Path, tmp_path: Path
) -> None:
    """Our gguf-py writer emits what upstream's convert_hf_to_gguf.py emits for Qwen2.5-VL."""
    ours = tmp_path / "ours"
    convert(tiny_plain_checkpoint, ours, dtype="f32", progress=lambda _: None)
    env = {"PYTHONPATH": str(llama_source / "gguf-py")}
    script = str(llama_source / "convert_hf_to_gguf.py")
    for extra, name in (([], "text.gguf"), (["--mmproj"], "mmproj.gguf")):
        subprocess.run(
            [
                sys.executable,
                script,
                str(tiny_plain_checkpoint),
                "--outtype",
                "f32",
                "--outfile",
                str(tmp_path / name),
                *extra,
            ],
            check=True,
            capture_output=True,
            env={**env, "PATH": "/usr/bin:/bin"},
        )
    up_text, our_text = _fields(tmp_path / "text.gguf"), _fields(ours / "text-retrieval-f32.gguf")
    assert {k: v for k, v in our_text.items() if k != "tokenizer.ggml.add_bos_token"} == up_text
    mm_up = tmp_path / "mmproj.gguf"
    mm_ours = ours / "mmproj-f32.gguf"
    ours_f, up_f = _fields(mm_ours), _fields(mm_up)
    ffn = "clip.vision.feed_forward_length"
    assert ours_f.pop(ffn) == padded_ffn_width(up_f.pop(ffn))
    assert ours_f == up_f
    up_t, our_t = _tensors(mm_up), _tensors(mm_ours)
    assert set(our_t) == set(up_t) | {"v.patch_embd.weight_flat"}
    padded = 0
    for name, data in up_t.items():
        got = our_t[name]
        if got.shape != data.shape:  # the vision MLP, zero-padded at the end (tensor_map)
            padded += 1
            got, rest = got[tuple(slice(0, n) for n in data.shape)], got
            assert np.count_nonzero(rest) == np.count_nonzero(got), name
        assert np.array_equal(got, data), name
    assert padded == 5 * 4  # gate, up (+ biases), down in each of the tiny model's 4 blocks
    up_t, our_t = _tensors(tmp_path / "text.gguf"), _tensors(ours / "text-retrieval-f32.gguf")
    assert set(our_t) == set(up_t)
    for name, data in up_t.items():
        assert np.array_equal(our_t[name], data), name


def test_manifest(converted: Path) -> None:
    m = load_manifest(converted)
    assert set(m.tasks) == {"retrieval", "text-matching", "code"}
    assert m.multi_vector_dim == 32 and m.matryoshka_dims == [32, 64, 128]
    assert m.hidden_size == 128 and m.source_kind == "jina-v4"
    assert m.llama_cpp["pin"] == "llama-cpp-python==0.3.36"
    for name, rec in m.files.items():
        assert (converted / name).stat().st_size == rec["bytes"]
        assert len(rec["sha256"]) == 64


def test_plain_checkpoint_is_single_vector(tiny_plain_checkpoint: Path, tmp_path: Path) -> None:
    m = convert(tiny_plain_checkpoint, tmp_path / "plain", dtype="f16", progress=lambda _: None)
    assert m.source_kind == "qwen2.5-vl" and m.multi_vector_dim is None
    assert list(m.tasks) == ["retrieval"] and m.tasks["retrieval"].projector is None
    assert any("single-vector" in n for n in m.notes)


def test_rerun_is_idempotent(tiny_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "again"
    convert(tiny_checkpoint, out, tasks=["code"], dtype="f32", progress=lambda _: None)
    before = (out / "text-code-f32.gguf").stat().st_mtime_ns
    said: list[str] = []
    convert(tiny_checkpoint, out, tasks=["code"], dtype="f32", progress=said.append)
    assert (out / "text-code-f32.gguf").stat().st_mtime_ns == before
    assert "text-code-f32.gguf: up to date" in said
    assert not list(out.glob("*.partial*"))


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_types(tiny_checkpoint: Path, tmp_path: Path, dtype: str) -> None:
    gguf = load_gguf()
    convert(tiny_checkpoint, tmp_path, tasks=["retrieval"], dtype=dtype, progress=lambda _: None)
    reader = gguf.GGUFReader(str(tmp_path / f"text-retrieval-{dtype}.gguf"))
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    assert types["blk.0.attn_q.weight"] == dtype.upper()
    assert types["blk.0.attn_norm.weight"] == "F32"


def test_errors(tiny_checkpoint: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="config.json"):
        convert(tmp_path, tmp_path / "o")
    with pytest.raises(ValueError, match="unknown task"):
        convert(tiny_checkpoint, tmp_path / "o", tasks=["summarise"])
    with pytest.raises(ValueError, match="unknown dtype"):
        convert(tiny_checkpoint, tmp_path / "o", dtype="f8")
    # llama-quantize would abort on a vision tower at an IQ type; refuse before writing anything
    with pytest.raises(ValueError, match="vision tower quantisation 'IQ4_XS'"):
        convert(tiny_checkpoint, tmp_path / "o", mmproj_quants=["IQ4_XS"])
    assert not (tmp_path / "o").exists()
    broken = tmp_path / "broken"
    shutil.copytree(tiny_checkpoint, broken)
    (broken / "model.safetensors").unlink()
    index = {"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}
    (broken / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(FileNotFoundError, match="missing"):
        convert(broken, tmp_path / "o")


def test_cli_reports_errors_cleanly(tmp_path: Path) -> None:
    from vlembed.cli import main

    assert main(["convert", "--hf", str(tmp_path), "--out", str(tmp_path / "o")]) == 2


def test_cli_passes_tower_quantisations_and_reports_errors(
    tiny_checkpoint: Path, tmp_path: Path, capsys
) -> None:
    from gguf_convert.cli import main

    args = ["--hf", str(tiny_checkpoint), "--out", str(tmp_path / "o"), "--task", "retrieval"]
    assert main([*args, "--mmproj-quant", "IQ4_NL"]) == 2
    assert "vision tower quantisation 'IQ4_NL'" in capsys.readouterr().err
    assert main([*args, "--dtype", "f32", "--mmproj-quant", "Q8_0"]) == 0
    err = capsys.readouterr().err
    assert "vision: mmproj-f32.gguf, mmproj-Q8_0.gguf" in err
    assert load_manifest(tmp_path / "o").mmproj == {
        "f32": "mmproj-f32.gguf",
        "Q8_0": "mmproj-Q8_0.gguf",
    }
