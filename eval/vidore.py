"""ViDoRe through MTEB: resolve the tasks, make sure their data is local, run, tabulate.

The tasks are MTEB's own (``mteb.get_benchmark("ViDoRe(v1)")`` or ``mteb.get_tasks``), so the
numbers are comparable with published MTEB results. Their data comes from the Hugging Face hub;
on machines without network access the datasets must already be in the local HF cache, and
``offline()`` makes sure nothing tries the network. Data is loaded for every task before any
model is built, so a missing dataset is reported at once, by name, with the command that
downloads it, instead of surfacing as a traceback an hour into a run.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mteb.abstasks import AbsTask

__all__ = [
    "DEFAULT_BENCHMARK",
    "MissingDataset",
    "load_task_data",
    "missing_message",
    "offline",
    "resolve_tasks",
]

DEFAULT_BENCHMARK = "ViDoRe(v1)"


def offline() -> None:
    """Forbid hub access: set HF_HUB_OFFLINE/HF_DATASETS_OFFLINE for this process.

    Both libraries read these variables when they are first imported, so the flags already
    captured by an imported ``huggingface_hub``/``datasets`` are switched too.
    """
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    hub_constants = sys.modules.get("huggingface_hub.constants")
    if hub_constants is not None:
        hub_constants.HF_HUB_OFFLINE = True  # type: ignore[attr-defined]
    datasets_config = sys.modules.get("datasets.config")
    if datasets_config is not None:
        datasets_config.HF_HUB_OFFLINE = True  # type: ignore[attr-defined]
        datasets_config.HF_DATASETS_OFFLINE = True  # type: ignore[attr-defined]


def resolve_tasks(benchmark: str | None, task_names: Sequence[str] | None) -> list[AbsTask]:
    """MTEB task objects for a benchmark name or explicit task names.

    Raises:
        ValueError: Unknown benchmark or task, with MTEB's suggestions.
    """
    import mteb

    if task_names:
        try:
            return list(mteb.get_tasks(tasks=list(task_names)))
        except KeyError as exc:
            raise ValueError(f"unknown MTEB task: {exc}") from exc
    name = benchmark or DEFAULT_BENCHMARK
    try:
        return list(mteb.get_benchmark(name).tasks)
    except (KeyError, ValueError) as exc:
        raise ValueError(f"unknown MTEB benchmark {name!r}: {exc}") from exc


@dataclass(frozen=True)
class MissingDataset:
    """A task whose data could not be loaded."""

    task: str
    path: str
    revision: str | None
    reason: str


def load_task_data(tasks: Sequence[AbsTask]) -> list[MissingDataset]:
    """Load every task's data now; return the ones that failed (their data stays unloaded).

    Any exception while loading is reported rather than raised: offline, a dataset not in the
    cache raises ``ConnectionError``; online, a blocked network or a moved dataset raises other
    errors, and in every case the useful answer is the same message naming the dataset.
    """
    missing = []
    for task in tasks:
        meta = task.metadata
        try:
            task.load_data()
        except Exception as exc:  # noqa: BLE001 - reported per dataset, see the docstring
            missing.append(
                MissingDataset(
                    task=meta.name,
                    path=str(meta.dataset.get("path")),
                    revision=meta.dataset.get("revision"),
                    reason=f"{type(exc).__name__}: {exc}",
                )
            )
    return missing


def missing_message(missing: Sequence[MissingDataset], *, benchmark: str | None) -> str:
    """What is missing and the two ways to fetch it (run both on a machine with network)."""
    lines = [f"{len(missing)} dataset(s) are not available locally:"]
    for m in missing:
        lines.append(f"  - {m.task}: {m.path} @ {m.revision}  ({m.reason[:160]})")
    if benchmark:
        selector = f'--benchmark "{benchmark}"'
    else:
        selector = "--tasks " + " ".join(m.task for m in missing)
    names = ", ".join(repr(m.task) for m in missing)
    lines += [
        "",
        "Download them on a machine with network access (this runs MTEB's own loader, which",
        "fills both the hub file cache and the datasets cache that offline loading reads):",
        f"  vlembed eval vidore {selector} --download",
        "or without vlembed:",
        f'  python -c "import mteb; [t.load_data() for t in mteb.get_tasks(tasks=[{names}])]"',
        "then copy the Hugging Face cache (HF_HOME, default ~/.cache/huggingface) to this",
        "machine and rerun with --offline. (`hf download` alone is not enough: offline, the",
        "datasets library only reads datasets it has prepared itself.)",
    ]
    return "\n".join(lines)
