"""docs/scale.md stays true: its measured table is what `python -m bench.scale` wrote, and its
cost model is the stated arithmetic on docs/BENCHMARKS.md's page times."""

from __future__ import annotations

import json
import math
import re

from tests.deploy.deploy_helpers import ROOT

DOC = (ROOT / "docs" / "scale.md").read_text()
BENCHMARKS = (ROOT / "docs" / "BENCHMARKS.md").read_text()


def _rows(text: str, cells: int) -> list[list[str]]:
    out = []
    for line in text.splitlines():
        if line.startswith("|") and not line.startswith("|---"):
            row = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(row) == cells:
                out.append(row)
    return out


def _page_seconds() -> dict[str, float]:
    """engine -> median s/page of BENCHMARKS.md's document page table."""
    section = BENCHMARKS.split("## Document page", 1)[1].split("\n## ", 1)[0]
    return {
        row[0].removeprefix("vlembed-"): float(row[1].split()[0])
        for row in _rows(section, 4)
        if row[0].startswith("vlembed-")
    }


def test_cost_table_is_the_stated_arithmetic() -> None:
    seconds = _page_seconds()
    section = DOC.split("## 2. Cost model", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in _rows(section, 6) if r[0] in seconds]
    assert len(rows) >= 3, rows
    for variant, s_page, rate, for_rate, for_day, cores in rows:
        s = seconds[variant]
        assert float(s_page) == s, variant
        assert rate == f"{1 / s:.3f}", variant
        assert int(for_rate) == math.ceil(10 / (1 / s) - 1e-9), variant
        replicas = math.ceil(1_000_000 / ((1 / s) * 3600 * 24))
        assert (int(for_day), int(cores)) == (replicas, 2 * replicas), variant


def test_measured_table_is_the_benchmark_output() -> None:
    results = json.loads((ROOT / "docs" / "scale-tiny.json").read_text())
    section = DOC.split("## 1. Replicas on one machine", 1)[1].split("\n## ", 1)[0]
    rows = {(int(r[0]), int(r[1])): r for r in _rows(section, 4) if r[0].isdigit()}
    assert len(rows) == len(results["results"])
    for res in results["results"]:
        row = rows[(res["replicas"], res["threads_per_replica"])]
        s = res["pages_per_s"]
        assert row[2] == f"{s['median']:.3f}"
        assert row[3] == f"{s['min']:.3f}–{s['max']:.3f}"
    m = re.search(r"([\d.]+) on 2 cores at the end", section)
    assert m and float(m.group(1)) == round(results["load_average_at_end"][0], 1)
