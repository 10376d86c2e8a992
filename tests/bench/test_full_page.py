"""The full-depth page benchmark's section of docs/BENCHMARKS.md (the run itself is not a test:
it needs a 7.5 GB checkpoint and an hour)."""

from __future__ import annotations

from pathlib import Path

from bench.full_page import MARK_END, MARK_START, insert_section, report_section
from bench.report import write_report


def _state(load: float) -> dict:
    return {"load1": load, "load5": load, "load15": load, "mem_available_gb": 20.0, "time": "t"}


def _results() -> dict:
    return {
        "machine": {"processor": "cpu", "cpu_count": 2, "threads": 2, "mem_total_gb": 24.0},
        "preset": "full",
        "parameters": 3_754_885_248,
        "warmup": 1,
        "repeats": 2,
        "date": "2026-12-01",
        "engines": {
            "hf-f32": {
                "page_s": [60.0, 64.0],
                "warmup": 1,
                "repeats": 2,
                "peak_rss_mb": 15 * 1024,
                "load_s": 90.0,
                "load_peak_rss_mb": 20 * 1024,
                "before": _state(3.0),
                "after": _state(4.0),
            },
            "vlembed-Q4_K_M/Q4_K_M": {
                "page_s": [20.0, 21.0, 30.0],
                "warmup": 1,
                "repeats": 3,
                "peak_rss_mb": 3 * 1024,
                "load_s": 10.0,
                "load_peak_rss_mb": 3 * 1024,
                "before": _state(4.0),
                "after": _state(5.0),
            },
            "hf-bf16": {
                "skipped": "7.0 GB available, 9.0 GB needed",
                "before": _state(1.0),
                "after": _state(1.0),
            },
        },
    }


def test_section_table() -> None:
    text = report_section(_results())
    assert "3.75 B parameters" in text and "loaded, shared machine" in text
    row = "| hf-f32 | 1 + 2 | 62.0 (60.0–64.0) | 1.00 | 15.0 | 90, 20.0 | 3.0 → 4.0 | 20.0 |"
    assert row in text
    assert "| vlembed-Q4_K_M/Q4_K_M | 1 + 3 | 21.0 (20.0–30.0) | 2.95 | 3.0 |" in text
    assert "| hf-bf16 | – | not run (7.0 GB available, 9.0 GB needed) |" in text


def test_section_replaces_itself_and_keeps_the_rest(tmp_path: Path) -> None:
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\ntables\n")
    insert_section(md, report_section(_results()))
    first = md.read_text()
    insert_section(md, report_section(_results()).replace("62.0", "99.0"))
    again = md.read_text()
    assert again.count(MARK_START) == 1 and again.count(MARK_END) == 1
    assert "99.0 (60.0" in again and "62.0 (60.0" not in again
    assert again.startswith("# Benchmarks\n\ntables\n") and len(again) == len(first)


def test_bench_report_keeps_the_full_section(tmp_path: Path) -> None:
    (tmp_path / "BENCHMARKS.full.md").write_text(report_section(_results()))
    out = tmp_path / "BENCHMARKS.md"
    write_report(
        {
            "machine": {"processor": "cpu", "cpu_count": 2, "threads": 2},
            "preset": "bench",
            "image": "448x448",
            "date": "2026-12-01",
        },
        out,
    )
    assert MARK_START in out.read_text() and "| hf-f32 | 1 + 2 | 62.0" in out.read_text()
