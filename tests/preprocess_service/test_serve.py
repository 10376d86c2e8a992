"""How ``vlembed serve`` turns a converted model and its flags into llama-server command lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from preprocess_service.serve import build_state, pick_mmproj, resolve_flash_attn, resolve_repack
from preprocess_service.settings import parse_settings
from preprocess_service.supervisor import ServerSpec


def test_pick_mmproj() -> None:
    every = ["bf16", "f32", "Q4_K_M"]
    assert pick_mmproj("f32", every) == "f32"
    assert pick_mmproj("Q4_K_M", every) == "Q4_K_M"
    assert pick_mmproj("Q8_0", every) == "bf16"
    assert pick_mmproj("Q8_0", ["f16", "f32"]) == "f16"
    assert pick_mmproj("f32", ["bf16"]) == "bf16"
    assert pick_mmproj("Q4_K_M", every, "f32") == "f32"
    with pytest.raises(SystemExit, match="not converted"):
        pick_mmproj("Q4_K_M", every, "Q6_K")


def test_flash_attn_and_repack_auto() -> None:
    assert resolve_flash_attn("f32", "auto") == "off"
    assert resolve_flash_attn("Q8_0", "auto") == "on"
    assert resolve_flash_attn("Q8_0", "off") == "off"
    # tiled VNNI kernels (K-quants, IQ4_XS) only run on weights that are not repacked
    assert [resolve_repack(v, "auto") for v in ("Q4_K_M", "Q6_K", "IQ4_XS", "Q5_K_M")] == [
        False
    ] * 4
    assert [resolve_repack(v, "auto") for v in ("Q4_0", "IQ4_NL", "Q8_0", "f32")] == [True] * 4
    assert resolve_repack("Q4_K_M", "on") is True


def test_server_argv_carries_the_choices() -> None:
    spec = ServerSpec(
        binary=Path("llama-server"),
        model=Path("t.gguf"),
        mmproj=Path("m.gguf"),
        port=1,
        flash_attn="on",
        repack=False,
    )
    argv = spec.argv()
    assert argv[argv.index("-fa") + 1] == "on"
    assert argv[argv.index("--mmproj-flash-attn") + 1] == "on"
    assert "--no-repack" in argv
    assert "--no-repack" not in ServerSpec(Path("s"), Path("t"), Path("m"), 1).argv()


def test_build_state_wires_the_flags_into_each_server(tiny_converted: Path, monkeypatch) -> None:
    monkeypatch.setenv("VLEMBED_LLAMA_SERVER", "/nonexistent/llama-server")  # nothing is started
    args = parse_settings(
        ["--model", str(tiny_converted), "--tasks", "retrieval,code", "--flash-attn", "auto"]
    )
    state = build_state(args)
    specs = [server.spec for server, _ in state.managed]
    assert [s.model.name for s in specs] == ["text-retrieval-f32.gguf", "text-code-f32.gguf"]
    for s in specs:
        assert s.mmproj.name == "mmproj-f32.gguf"
        assert s.flash_attn == "off"  # the f32 parity variant
        assert s.repack is True
    args = parse_settings(
        ["--model", str(tiny_converted), "--tasks", "retrieval", "--flash-attn", "on"]
    )
    ((server, _),) = build_state(args).managed
    assert server.spec.flash_attn == "on"
