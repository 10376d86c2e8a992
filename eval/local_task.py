"""A document set from ``vlembed eval make-docs`` as an MTEB 2.x retrieval task.

It is shaped like MTEB's ViDoRe tasks (``AbsTaskRetrieval``, type ``DocumentUnderstanding``,
category ``t2i``: text queries, page-image corpus, ``ndcg_at_5`` main score), so the very code
path ViDoRe takes through MTEB (DataLoaders of PIL images, the model's own similarity, the
pytrec_eval metrics) runs offline on it. Two differences from a registered MTEB task:

- the metadata is built per document set (a small subclass each): it names the directory and
  its content hash (``dataset.revision``), so results of two different sets never mix;
- the task is not in MTEB's registry, so read scores from ``TaskResult.scores`` directly
  (``TaskResult.task`` and the properties built on it look tasks up by name).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mteb.abstasks.retrieval import AbsTaskRetrieval
from mteb.abstasks.task_metadata import TaskMetadata

from eval.docset import DocSet, read_docset

__all__ = ["LOCAL_TASK_NAME", "LocalDocsRetrieval", "local_task"]

LOCAL_TASK_NAME = "VlembedLocalDocsRetrieval"
SPLIT = "test"


def _metadata(docs: DocSet) -> TaskMetadata:
    kinds = ", ".join(f"{n} {k}" for k, n in docs.manifest.get("kinds", {}).items() if n)
    return TaskMetadata(
        name=LOCAL_TASK_NAME,
        description=(
            f"Offline page retrieval on {len(docs.corpus)} generated pages ({kinds}); "
            f"each of the {len(docs.queries)} queries is answered by exactly one page."
        ),
        dataset={"path": str(docs.root.resolve()), "revision": docs.revision()},
        type="DocumentUnderstanding",
        category="t2i",
        modalities=["text", "image"],
        eval_splits=[SPLIT],
        eval_langs=["eng-Latn"],
        main_score="ndcg_at_5",
        domains=["Financial", "Written"],
        task_subtypes=["Image Text Retrieval"],
        license="mit",
        annotations_creators="derived",
        dialect=[],
        sample_creation="created",
        bibtex_citation="",
    )


class LocalDocsRetrieval(AbsTaskRetrieval):
    """Text-to-page retrieval over a local document set; make instances with :func:`local_task`.

    MTEB keeps a task's metadata on its class (``unload_data`` drops instance-level metadata to
    restore the published one), so each set gets its own small subclass carrying its metadata
    and its :class:`~eval.docset.DocSet`. This base class has no metadata of its own, which
    keeps it out of MTEB's task listings.
    """

    docs: DocSet

    def load_data(self, num_proc: int | None = None, **kwargs: Any) -> None:
        """Build the corpus (lazily decoded images), queries and qrels as MTEB datasets."""
        if self.data_loaded:
            return
        from datasets import Dataset
        from datasets import Image as ImageFeature

        corpus = Dataset.from_dict(
            {
                "id": [d.id for d in self.docs.corpus],
                "image": [str(self.docs.image_path(d)) for d in self.docs.corpus],
            }
        ).cast_column("image", ImageFeature())
        queries = Dataset.from_dict(
            {"id": [q.id for q in self.docs.queries], "text": [q.text for q in self.docs.queries]}
        )
        relevant = {qid: dict(rels) for qid, rels in self.docs.qrels.items()}
        self.dataset = {
            "default": {
                SPLIT: {
                    "corpus": corpus,
                    "queries": queries,
                    "relevant_docs": relevant,
                    "top_ranked": None,
                }
            }
        }
        self.data_loaded = True


def local_task(docs_dir: Path | str) -> LocalDocsRetrieval:
    """The MTEB task for the document set in ``docs_dir`` (read and checked here)."""
    docs = read_docset(docs_dir)
    cls = type(
        LOCAL_TASK_NAME,
        (LocalDocsRetrieval,),
        {"metadata": _metadata(docs), "docs": docs, "__module__": __name__},
    )
    return cls()
