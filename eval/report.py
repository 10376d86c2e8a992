"""Markdown tables and JSON files for evaluation reports.

The score tables have the shape of the ViDoRe comparison this project reproduces: one row per
task, one column per model (reference first), scores x100 with two decimals, and a final row
with the mean over the task rows.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["json_safe", "markdown_table", "score_table", "slug", "write_json"]


def _cell(value: float | str | None, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if math.isnan(value):
        return "nan"
    return format(value, fmt)


def markdown_table(
    header: Sequence[str], rows: Sequence[Sequence[float | str | None]], fmt: str = ".2f"
) -> str:
    """A GitHub-style Markdown table; numbers are formatted with ``fmt``, None as ``-``."""
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" for _ in header) + "|",
    ]
    for row in rows:
        lines.append("| " + " | ".join(_cell(v, fmt) for v in row) + " |")
    return "\n".join(lines) + "\n"


def score_table(
    columns: Mapping[str, Mapping[str, float]],
    tasks: Sequence[str],
    *,
    scale: float = 100.0,
    first_header: str = "Task",
) -> str:
    """Rows = tasks, columns = models, plus a "Mean" row over the tasks every model has.

    Args:
        columns: ``{model label: {task name: score in 0..1}}``; a missing score prints ``-``.
        tasks: Row order.
        scale: Multiplier for the printed numbers (100: percentages, like MTEB leaderboards).
        first_header: Header of the first column.
    """
    labels = list(columns)
    rows: list[list[float | str | None]] = []
    for task in tasks:
        row: list[float | str | None] = [task]
        for label in labels:
            value = columns[label].get(task)
            row.append(None if value is None else value * scale)
        rows.append(row)
    complete = [t for t in tasks if all(t in columns[label] for label in labels)]
    if len(complete) > 1:
        mean_row: list[float | str | None] = ["Mean"]
        for label in labels:
            mean_row.append(sum(columns[label][t] for t in complete) / len(complete) * scale)
        rows.append(mean_row)
    return markdown_table([first_header, *labels], rows)


def json_safe(value: Any) -> Any:
    """Replace NaN/inf by None (strict JSON) and numpy scalars/arrays by Python values."""
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if hasattr(value, "tolist"):
        return json_safe(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: Path, data: Any) -> None:
    """Write strict JSON (no NaN), indented, keys in insertion order."""
    path.write_text(json.dumps(json_safe(data), indent=2, allow_nan=False) + "\n", "utf-8")


def slug(label: str) -> str:
    """A label as a safe file or MTEB model name part (letters, digits, ``._-``)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_") or "model"
