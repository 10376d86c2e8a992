"""Tensor name/shape mapping from the HF checkpoint to GGUF."""

from __future__ import annotations

import numpy as np

from gguf_convert import tensor_map


def test_vision_mlp_is_zero_padded_to_a_block_multiple_and_stays_exact() -> None:
    """3420 -> 3584: ggml's fast CPU kernels need the reduced width in whole blocks. The padded
    MLP must compute exactly what the original does (silu(0) * 0 = 0 meets zero columns)."""
    rng = np.random.default_rng(0)
    hidden, width = 64, 3420
    gate, up = rng.standard_normal((2, width, hidden), dtype=np.float32)
    gate_b, up_b = rng.standard_normal((2, width), dtype=np.float32)
    down = rng.standard_normal((hidden, width), dtype=np.float32)
    down_b = rng.standard_normal(hidden, dtype=np.float32)
    prefix = "model.visual.blocks.0.mlp."
    out = {}
    for name, data in (
        ("gate_proj.weight", gate),
        ("gate_proj.bias", gate_b),
        ("up_proj.weight", up),
        ("up_proj.bias", up_b),
        ("down_proj.weight", down),
        ("down_proj.bias", down_b),
    ):
        ((gg, padded),) = tensor_map.vision_tensors(prefix + name, data)
        assert tensor_map.vision_shapes(prefix + name, data.shape) == [(gg, padded.shape)]
        out[gg] = padded
    assert out["v.blk.0.ffn_gate.weight"].shape == (3584, hidden)
    assert out["v.blk.0.ffn_up.bias"].shape == (3584,)
    assert out["v.blk.0.ffn_down.weight"].shape == (hidden, 3584)
    assert not out["v.blk.0.ffn_down.weight"][:, width:].any()
    assert out["v.blk.0.ffn_down.bias"].shape == (hidden,)

    def mlp(g, gb, u, ub, d, x):
        a = x @ g.T + gb
        return (a / (1 + np.exp(-a)) * (x @ u.T + ub)) @ d.T

    x = rng.standard_normal((8, hidden), dtype=np.float32).astype(np.float64)
    want = mlp(gate, gate_b, up, up_b, down, x)
    got = mlp(
        *(
            out[f"v.blk.0.ffn_{k}"]
            for k in ("gate.weight", "gate.bias", "up.weight", "up.bias", "down.weight")
        ),
        x,
    )
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-9)
    # widths already in whole blocks are left alone
    assert tensor_map.padded_ffn_width(256) == 256 and tensor_map.padded_ffn_width(216) == 256
