"""Run MTEB tasks with a :class:`~eval.mteb_encoder.VlembedEncoder` and read the scores back.

A thin layer over ``mteb.evaluate`` so that ``vlembed eval vidore`` and ``vlembed eval local``
save results the same way: MTEB's own result files under ``OUT/results/<model>/<revision>/``
(``experiments/vector_type_multi_vector/`` for MaxSim runs), which MTEB's tooling can load.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mteb.abstasks import AbsTask
    from mteb.results import TaskResult

    from eval.mteb_encoder import VlembedEncoder

__all__ = ["evaluate", "split_scores"]


def evaluate(
    encoder: VlembedEncoder,
    tasks: Sequence[AbsTask],
    out: Path | None,
    *,
    resume: bool = False,
    batch_size: int = 8,
    show_progress: bool = True,
    prediction_folder: Path | None = None,
) -> list[TaskResult]:
    """Evaluate ``encoder`` on ``tasks``; results go to ``out`` (MTEB's default cache if None).

    Args:
        encoder: The model.
        tasks: MTEB tasks (ViDoRe, or the local document task).
        out: Results folder (an ``mteb.ResultCache`` root).
        resume: Keep results already in ``out`` and run only missing tasks. Off by default,
            because a re-served variant can keep its name while its weights changed.
        batch_size: DataLoader batch size; also how many inputs one encode call handles.
        show_progress: MTEB's progress bars.
        prediction_folder: If set, MTEB also writes every query's retrieved pages and scores
            there (``<task>_predictions.json``).
    """
    import mteb

    cache = mteb.ResultCache(out) if out is not None else mteb.ResultCache()
    result = mteb.evaluate(
        encoder,
        list(tasks),
        cache=cache,
        overwrite_strategy="only-missing" if resume else "always",
        encode_kwargs={"batch_size": batch_size, "show_progress_bar": show_progress},
        show_progress_bar=show_progress,
        raise_error=True,
        prediction_folder=prediction_folder,
    )
    return list(result.task_results)


def split_scores(task_result: TaskResult, split: str = "test") -> dict[str, Any]:
    """The scores of one split, averaged over its subsets (ViDoRe v1 tasks have one)."""
    entries = task_result.scores.get(split) or []
    if not entries:
        raise KeyError(f"{task_result.task_name}: no scores for split {split!r}")
    keys = [k for k, v in entries[0].items() if isinstance(v, int | float)]
    return {k: sum(float(e[k]) for e in entries) / len(entries) for k in keys}
