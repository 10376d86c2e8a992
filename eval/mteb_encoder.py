"""vlembed as an MTEB 2.x model: an ``EncoderProtocol`` over either backend.

MTEB drives retrieval tasks (ViDoRe included) through ``SearchEncoderWrapper``: it calls
``encode`` on a ``DataLoader`` of queries (``prompt_type=query``, batches with a ``"text"``
list) and of corpus chunks (``prompt_type=document``, batches with an ``"image"`` list of RGB
PIL images for text-to-image tasks such as ViDoRe, or ``"text"`` for text corpora), then calls
the **model's own** ``similarity(queries, docs)`` to score the chunk. That hook is how a
late-interaction model gets MaxSim in MTEB 2.x; ``ModelMeta.similarity_fn_name`` only names it.

Two modes:

- single vector: ``encode`` returns an ``[n, dim]`` float32 array, scored by cosine (equal to
  the dot product, the vectors are L2-normalised);
- multi-vector (``multivector=True``): ``encode`` returns a ragged list of ``[n_tokens, dim]``
  arrays, scored by exact MaxSim (:func:`eval.scoring.maxsim_matrix`). MTEB's built-in
  ``max_sim`` zero-pads documents, which clamps a query row whose best real dot product is
  negative at 0; scoring here pads nothing, so the numbers equal the brute-force definition.

With ``storage`` (multi-vector only), every document's rows are scored as an index built with
those options stores them (:func:`vlembed.index.codec.stored_rows`: pooled cluster means, sign
bits read as +1/-1); queries stay float. That is ViDoRe for each ``vlembed index`` storage
option, exhaustive MaxSim over the whole corpus (no first stage).

Requests use the service's task vocabulary: queries ``retrieval.query``, documents
``retrieval.passage`` (images get the image template whatever the role), ``code.*`` for
programming tasks, ``text-matching`` when MTEB gives no prompt type (symmetric tasks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from mteb.models.abs_encoder import AbsEncoder
from mteb.models.model_meta import ModelMeta, ScoringFunction
from mteb.types import PromptType
from PIL import Image

from eval import scoring
from eval.backends import Backend, ReferenceBackend, open_backend
from vlembed.index.codec import StorageOptions, stored_rows

if TYPE_CHECKING:
    from mteb.abstasks.task_metadata import TaskMetadata
    from torch.utils.data import DataLoader

__all__ = ["VlembedEncoder", "api_task", "build_model_meta"]


def _is_code_task(task_metadata: TaskMetadata) -> bool:
    langs = task_metadata.eval_langs
    flat = [x for v in langs.values() for x in v] if isinstance(langs, dict) else list(langs)
    return "Programming" in (task_metadata.domains or []) or any(
        lang.endswith("-Code") for lang in flat
    )


def api_task(task_metadata: TaskMetadata, prompt_type: PromptType | None) -> str:
    """The service task for one ``encode`` call (see the module docstring)."""
    if prompt_type is None:
        return "text-matching"
    family = "code" if _is_code_task(task_metadata) else "retrieval"
    return f"{family}.query" if prompt_type == PromptType.query else f"{family}.passage"


def _embed_dim(backend: Backend, multivector: bool, dimensions: int | None) -> int | None:
    """The output width, as far as the backend knows it without embedding anything."""
    if multivector:
        return backend.multi_dim
    return dimensions if dimensions is not None else backend.dim


def build_model_meta(
    backend: Backend,
    *,
    name: str | None = None,
    multivector: bool = False,
    dimensions: int | None = None,
    spec: str | None = None,
    storage: StorageOptions | None = None,
) -> ModelMeta:
    """ModelMeta stating only what is known about the model behind ``backend``.

    A served model or a local checkpoint could be anything (the real jina-embeddings-v4, a
    quantised variant, a random test checkpoint), so licence, languages, training data, release
    date and memory stay ``None``; the parameter count is filled in only when the reference has
    the model in hand, the widths when the backend knows them (the reference, or the service's
    ``/v1/models``). Single- and multi-vector runs of one model differ in
    ``experiment_kwargs``, so MTEB keeps their results apart (and so do storage options).
    """
    is_reference = isinstance(backend, ReferenceBackend)
    experiment: dict[str, Any] = {}
    if multivector:
        experiment["vector_type"] = "multi_vector"
    if dimensions is not None:
        experiment["dimensions"] = dimensions
    if storage is not None:
        experiment["storage"] = storage.spec
    loader_kwargs: dict[str, Any] = {}
    if spec is not None:
        loader_kwargs = {"backend": spec, "multivector": multivector, "dimensions": dimensions}
    return ModelMeta(
        loader=VlembedEncoder,
        loader_kwargs=loader_kwargs,
        name=name or f"vlembed/{backend.name}",
        revision=backend.revision,
        release_date=None,
        languages=None,
        n_parameters=backend.n_parameters,
        memory_usage_mb=None,
        max_tokens=None,
        embed_dim=_embed_dim(backend, multivector, dimensions),
        license=None,
        open_weights=None,
        public_training_code=None,
        public_training_data=None,
        framework=["PyTorch", "Transformers", "safetensors"] if is_reference else ["API", "GGUF"],
        similarity_fn_name=ScoringFunction.MAX_SIM if multivector else ScoringFunction.COSINE,
        use_instructions=True,  # "Query: " / "Passage: " prefixes and the image template
        training_datasets=None,
        modalities=["image", "text"],
        model_type=["late-interaction"] if multivector else ["dense"],
        experiment_kwargs=experiment or None,
    )


def _batch_items(batch: dict[str, Any], task_name: str) -> list[str | Image.Image]:
    """The inputs of one DataLoader batch: its images, or its texts, never both."""
    images = batch.get("image")
    texts = batch.get("text")
    if images is not None and texts is not None and any(t for t in texts):
        raise ValueError(
            f"{task_name}: inputs with both text and an image are not supported; the "
            "embeddings API takes one text or one image per item"
        )
    if images is not None:
        bad = [type(im).__name__ for im in images if not isinstance(im, Image.Image)]
        if bad:
            raise TypeError(f"{task_name}: expected PIL images, got {bad[0]}")
        return list(images)
    if texts is not None:
        return [str(t) for t in texts]
    raise ValueError(f"{task_name}: batch has neither 'text' nor 'image': {sorted(batch)}")


def _as_rows(embeddings: Any) -> list[np.ndarray]:
    """Ragged multi-vector embeddings (list of arrays/tensors) as float32 numpy arrays."""
    return [np.asarray(e, dtype=np.float32) for e in embeddings]


class VlembedEncoder(AbsEncoder):
    """vlembed embeddings for MTEB, from a running service or the PyTorch reference.

    Args:
        model_name: MTEB model name (``org/name``); default ``vlembed/<backend name>``.
        revision: Ignored (the backend reports its own revision); kept for EncoderProtocol.
        device: Ignored (the backend decides); kept for EncoderProtocol.
        backend: A :class:`eval.backends.Backend`, or a model spec string
            (``http://…``, ``reference:DIR``, ``reference``).
        multivector: Score with MaxSim over per-token rows instead of one vector per input.
        dimensions: Matryoshka truncation of the single vector (single-vector mode only).
        storage: Score documents as an index with these storage options would (multi-vector
            mode only).
        **kwargs: HTTP options when ``backend`` is an ``http://`` spec
            (see :class:`vlembed.Client`).
    """

    def __init__(
        self,
        model_name: str | None = None,
        revision: str | None = None,
        *,
        device: str | None = None,
        backend: Backend | str,
        multivector: bool = False,
        dimensions: int | None = None,
        storage: StorageOptions | None = None,
        **kwargs: Any,
    ) -> None:
        if multivector and dimensions is not None:
            raise ValueError("dimensions (Matryoshka) applies to single vectors, not multivector")
        if storage is not None and not multivector:
            raise ValueError("storage options apply to multi-vectors; add multivector=True")
        spec = backend if isinstance(backend, str) else None
        self.backend: Backend = open_backend(backend, **kwargs) if spec else backend  # type: ignore[assignment]
        self.multivector = multivector
        self.dimensions = dimensions
        self.storage = storage
        self.mteb_model_meta = build_model_meta(
            self.backend,
            name=model_name,
            multivector=multivector,
            dimensions=dimensions,
            spec=spec,
            storage=storage,
        )

    def encode(
        self,
        inputs: DataLoader[Any],
        *,
        task_metadata: TaskMetadata,
        hf_split: str,
        hf_subset: str,
        prompt_type: PromptType | None = None,
        **kwargs: Any,
    ) -> np.ndarray | list[np.ndarray]:
        """One embedding per input, in order: ``[n, dim]`` or a list of ``[n_tokens, dim]``."""
        task = api_task(task_metadata, prompt_type)
        vectors: list[np.ndarray] = []
        for batch in inputs:
            items = _batch_items(batch, task_metadata.name)
            vectors.extend(
                self.backend.embed(
                    items, task=task, multivector=self.multivector, dimensions=self.dimensions
                )
            )
        if self.multivector:
            if self.storage is not None and prompt_type == PromptType.document:
                return [stored_rows(v, self.storage) for v in vectors]
            return vectors
        if not vectors:
            return np.zeros((0, 0), dtype=np.float32)
        return np.stack(vectors).astype(np.float32)

    def similarity(self, embeddings1: Any, embeddings2: Any) -> np.ndarray:
        """``[n1, n2]`` scores: exact MaxSim (multi-vector) or cosine (single vector)."""
        if self.multivector:
            return scoring.maxsim_matrix(
                _as_rows(embeddings1), _as_rows(embeddings2), dtype=np.float32
            )
        return scoring.cosine_matrix(np.asarray(embeddings1), np.asarray(embeddings2)).astype(
            np.float32
        )

    def similarity_pairwise(self, embeddings1: Any, embeddings2: Any) -> np.ndarray:
        """Score of ``embeddings1[i]`` against ``embeddings2[i]`` for every i."""
        if self.multivector:
            pairs = zip(_as_rows(embeddings1), _as_rows(embeddings2), strict=True)
            return np.array([scoring.maxsim(q, d) for q, d in pairs], dtype=np.float32)
        return scoring.row_cosines(np.asarray(embeddings1), np.asarray(embeddings2)).astype(
            np.float32
        )

    def close(self) -> None:
        """Release the backend (HTTP connections, reference caches)."""
        self.backend.close()
