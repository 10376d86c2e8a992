"""docs/BENCHMARKS.md is generated from the bench JSON: tables, ratios and the merged notes."""

from __future__ import annotations

from pathlib import Path

from bench.report import write_report
from bench.run import split_variant, stats


def _engine(image: float, page: float, text: float, **extra) -> dict:
    return {
        "image_s": stats([image]),
        "page_s": stats([page]),
        "text_s": stats([text]),
        **extra,
    }


def test_split_variant() -> None:
    assert split_variant("Q4_K_M/bf16") == ("Q4_K_M", "bf16")
    assert split_variant("Q8_0") == ("Q8_0", "auto")


def test_report_tables_and_ratios(tmp_path: Path) -> None:
    results = {
        "machine": {"processor": "cpu", "cpu_count": 2, "threads": 2},
        "preset": "bench",
        "image": "448x448",
        "date": "2026-11-30",
        "reference": {"hf-f32": _engine(2.0, 8.0, 1.0, text_tokens=400)},
        "vlembed": {
            "vlembed-Q4_K_M/Q4_K_M": _engine(
                1.0, 2.0, 0.5, image_overhead=stats([0.01]), text_overhead=stats([0.02])
            )
        },
        "vision_batching": {
            "variant": "Q4_K_M/Q4_K_M",
            "runs": {
                "a": {
                    "size": 224,
                    "in_flight": 8,
                    "vision_batch_tokens": 1024,
                    "images_per_s": stats([3.5]),
                    "peak_rss_mb": 946.0,
                }
            },
        },
        "patch_transport": {
            "preset": "tiny",
            "date": "2026-12-01",
            "threads": 2,
            "variant": "Q4_K_M/Q4_K_M",
            "rounds": 2,
            "patches": 2976,
            "runs": {
                "f32": {
                    "page_s": stats([2.5]),
                    "backend_s": stats([2.4]),
                    "wire_bytes": 18665647,
                },
                "auto": {
                    "page_s": stats([2.0]),
                    "backend_s": stats([1.9]),
                    "wire_bytes": 1753122,
                },
            },
        },
    }
    (tmp_path / "BENCHMARKS.notes.md").write_text("## Goals\n\nhand-written\n")
    out = tmp_path / "BENCHMARKS.md"
    write_report(results, out)
    md = out.read_text()
    # image 2.0 / 1.0 s, text 1.0 / 0.5 s, page 8.0 / 2.0 s against HF f32
    assert (
        "| vlembed-Q4_K_M/Q4_K_M | 1.00 (1.00–1.00) | 1.00 | 2.00 | 0.50 (0.50–0.50) | 800 |" in md
    )
    assert "| vlembed-Q4_K_M/Q4_K_M | 2.00 (2.00–2.00) | 0.50 | 4.00 |" in md
    assert "1.0 % / 2.0 %" in md
    assert "| 224x224 | 8 | 1024 | 3.50 (3.50–3.50) | 946 |" in md
    assert "(tiny preset, Q4_K_M/Q4_K_M, page 1275x1650, 2976 patches, 2 threads" in md
    assert "| f32 | 18,665,647 | 2.50 (2.50–2.50) | 2.40 (2.40–2.40) |" in md
    assert "| auto | 1,753,122 | 2.00 (2.00–2.00) | 1.90 (1.90–1.90) |" in md
    assert md.rstrip().endswith("hand-written")
