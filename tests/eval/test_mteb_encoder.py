"""The MTEB encoder: protocol, metadata, and scores that equal a brute-force computation.

The end-to-end tests run MTEB's real retrieval path (DataLoaders of PIL page images, the
model's own similarity, pytrec_eval) on a small generated document set with the tiny reference,
then recompute every query-page score and nDCG@5/recall@5 with ``eval.scoring``.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

pytest.importorskip("mteb", reason="needs the eval extra (mteb)")
pytest.importorskip("matplotlib", reason="needs the eval extra (matplotlib)")

from mteb.models import EncoderProtocol  # noqa: E402
from mteb.models.model_meta import ScoringFunction  # noqa: E402
from mteb.types import PromptType  # noqa: E402

from eval import scoring  # noqa: E402
from eval.backends import RememberingBackend  # noqa: E402
from eval.local_task import LOCAL_TASK_NAME, local_task  # noqa: E402
from eval.mteb_encoder import VlembedEncoder, _batch_items, api_task  # noqa: E402
from eval.mteb_run import evaluate, split_scores  # noqa: E402
from vlembed.client import Client as HttpBackend  # noqa: E402
from vlembed.index.codec import StorageOptions, stored_rows  # noqa: E402
from vlembed.index.maxsim import maxsim  # noqa: E402


def test_protocol_and_honest_meta(tiny_backend) -> None:
    enc = VlembedEncoder(backend=tiny_backend)
    assert isinstance(enc, EncoderProtocol)
    meta = enc.mteb_model_meta
    assert meta.name == "vlembed/reference"
    assert meta.revision == tiny_backend.revision
    assert meta.similarity_fn_name is ScoringFunction.COSINE
    assert meta.model_type == ["dense"]
    assert meta.n_parameters == tiny_backend.n_parameters > 0
    assert meta.embed_dim == tiny_backend.embedder.hidden_size
    assert meta.modalities == ["image", "text"]
    assert meta.framework == ["PyTorch", "Transformers", "safetensors"]
    # nothing is claimed that a local checkpoint cannot tell
    assert meta.license is None and meta.open_weights is None and meta.languages is None
    assert meta.training_datasets is None and meta.release_date is None

    multi = VlembedEncoder("org/custom", backend=tiny_backend, multivector=True).mteb_model_meta
    assert multi.name == "org/custom"
    assert multi.similarity_fn_name is ScoringFunction.MAX_SIM
    assert multi.model_type == ["late-interaction"]
    assert multi.embed_dim == 32  # the tiny preset's projector
    assert multi.experiment_kwargs == {"vector_type": "multi_vector"}
    with pytest.raises(ValueError, match="single vectors"):
        VlembedEncoder(backend=tiny_backend, multivector=True, dimensions=64)


def test_api_task_mapping(small_docs) -> None:
    meta = local_task(small_docs.root).metadata
    assert api_task(meta, PromptType.query) == "retrieval.query"
    assert api_task(meta, PromptType.document) == "retrieval.passage"
    assert api_task(meta, None) == "text-matching"
    code = meta.model_copy(update={"domains": ["Programming"]})
    assert api_task(code, PromptType.query) == "code.query"
    assert api_task(code, PromptType.document) == "code.passage"


def test_batches_hold_text_or_images_not_both() -> None:
    image = Image.new("RGB", (4, 4))
    assert _batch_items({"id": ["a"], "text": ["hello"]}, "T") == ["hello"]
    assert _batch_items({"id": ["a"], "image": [image]}, "T") == [image]
    with pytest.raises(ValueError, match="both text and an image"):
        _batch_items({"text": ["caption"], "image": [image]}, "T")
    with pytest.raises(TypeError, match="expected PIL images"):
        _batch_items({"image": [np.zeros((4, 4))]}, "T")


def _brute_force(backend, docs, multivector: bool) -> np.ndarray:
    images = [docs.load_image(d) for d in docs.corpus]
    pages = backend.embed(images, task="retrieval.passage", multivector=multivector)
    queries = backend.embed(
        [q.text for q in docs.queries], task="retrieval.query", multivector=multivector
    )
    if multivector:
        return scoring.maxsim_matrix(queries, pages)
    return scoring.cosine_matrix(np.stack(queries), np.stack(pages))


@pytest.mark.parametrize("multivector", [False, True], ids=["cosine", "maxsim"])
def test_mteb_scores_equal_brute_force(
    tiny_backend, small_docs, tmp_path: Path, multivector: bool
) -> None:
    enc = VlembedEncoder(backend=tiny_backend, multivector=multivector)
    results = evaluate(
        enc,
        [local_task(small_docs.root)],
        tmp_path / "results",
        prediction_folder=tmp_path / "pred",
        show_progress=False,
    )
    assert [r.task_name for r in results] == [LOCAL_TASK_NAME]
    got = split_scores(results[0])

    expected = _brute_force(tiny_backend, small_docs, multivector)
    doc_ids = [d.id for d in small_docs.corpus]
    predictions = json.loads(
        (tmp_path / "pred" / f"{LOCAL_TASK_NAME}_predictions.json").read_text()
    )
    per_query = predictions["default"]["test"]
    ndcg, recall = [], []
    for qi, query in enumerate(small_docs.queries):
        for doc_id, score in per_query[query.id].items():
            assert score == pytest.approx(expected[qi, doc_ids.index(doc_id)], rel=1e-5, abs=1e-5)
        ranked = scoring.rank_documents(expected[qi], doc_ids)
        ndcg.append(scoring.ndcg_at_k(ranked, small_docs.qrels[query.id], 5))
        recall.append(scoring.recall_at_k(ranked, small_docs.qrels[query.id], 5))
    assert got["ndcg_at_5"] == pytest.approx(np.mean(ndcg), abs=1e-5)
    assert got["recall_at_5"] == pytest.approx(np.mean(recall), abs=1e-5)
    assert got["main_score"] == got["ndcg_at_5"]

    folder = tmp_path / "results" / "results" / "vlembed__reference" / tiny_backend.revision
    if multivector:
        folder = folder / "experiments" / "vector_type_multi_vector"
    assert (folder / f"{LOCAL_TASK_NAME}.json").is_file()


def _service_from(backend):
    """A MockTransport handler that answers the vlembed API from an in-process backend."""

    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "mock-served"}]})
        body = json.loads(request.content)
        items = []
        for item in body["input"]:
            if "text" in item:
                items.append(item["text"])
            else:
                png = base64.b64decode(item["image"].split(",", 1)[1])
                items.append(Image.open(io.BytesIO(png)).convert("RGB"))
        vectors = backend.embed(
            items,
            task=body["task"],
            multivector=body["return_multivector"],
            dimensions=body["dimensions"],
        )
        data = [{"index": i, "embedding": v.tolist()} for i, v in enumerate(vectors)]
        return httpx.Response(200, json={"data": data, "usage": {}})

    return handle


# a served model has no revision to report; MTEB warns about that when it writes results
@pytest.mark.filterwarnings("ignore:`model_revision` is not specified:UserWarning")
def test_mteb_over_http_equals_in_process(tiny_backend, small_docs, tmp_path: Path) -> None:
    """Same scores through the HTTP client (JSON floats, PNG images) as in-process."""
    http = HttpBackend("http://mock", transport=httpx.MockTransport(_service_from(tiny_backend)))
    task_dir = small_docs.root
    for multivector in (False, True):
        direct = evaluate(
            VlembedEncoder(backend=tiny_backend, multivector=multivector),
            [local_task(task_dir)],
            tmp_path / "direct",
            show_progress=False,
        )
        served = evaluate(
            VlembedEncoder(backend=http, multivector=multivector),
            [local_task(task_dir)],
            tmp_path / "served",
            show_progress=False,
        )
        a, b = split_scores(served[0]), split_scores(direct[0])
        finite = [k for k in b if np.isfinite(b[k])]  # nAUC metrics are NaN on tiny sets
        assert "ndcg_at_5" in finite and "recall_at_5" in finite
        assert {k: a[k] for k in finite} == pytest.approx({k: b[k] for k in finite}, abs=1e-9)
    assert (tmp_path / "served" / "results" / "vlembed__mock-served").is_dir()


class _Counting:
    """A backend that counts the inputs it is asked to embed, per task."""

    def __init__(self, backend) -> None:
        self.backend = backend
        self.name, self.revision = backend.name, backend.revision
        self.n_parameters, self.dim, self.multi_dim = (
            backend.n_parameters,
            backend.dim,
            backend.multi_dim,
        )
        self.calls: dict[str, int] = {}

    def embed(self, items, *, task, multivector, dimensions=None):
        self.calls[task] = self.calls.get(task, 0) + len(items)
        return self.backend.embed(items, task=task, multivector=multivector, dimensions=dimensions)

    def close(self) -> None:
        pass


@pytest.mark.parametrize("spec", ["pool2", "binary", "pool3-average+binary"])
def test_storage_options_score_pages_as_the_index_stores_them(
    tiny_backend, small_docs, tmp_path: Path, spec: str
) -> None:
    options = StorageOptions.parse(spec)
    enc = VlembedEncoder(backend=tiny_backend, multivector=True, storage=options)
    assert enc.mteb_model_meta.experiment_kwargs == {
        "vector_type": "multi_vector",
        "storage": options.spec,
    }
    results = evaluate(
        enc,
        [local_task(small_docs.root)],
        tmp_path / "results",
        prediction_folder=tmp_path / "pred",
        show_progress=False,
    )
    pages = tiny_backend.embed(
        [small_docs.load_image(d) for d in small_docs.corpus],
        task="retrieval.passage",
        multivector=True,
    )
    queries = tiny_backend.embed(
        [q.text for q in small_docs.queries], task="retrieval.query", multivector=True
    )
    stored = [stored_rows(p, options) for p in pages]
    expected = np.array([[maxsim(q, d) for d in stored] for q in queries])
    unpooled = scoring.maxsim_matrix(queries, pages)
    assert not np.allclose(expected, unpooled, atol=1e-4)  # the option changed the scores
    doc_ids = [d.id for d in small_docs.corpus]
    per_query = json.loads((tmp_path / "pred" / f"{LOCAL_TASK_NAME}_predictions.json").read_text())
    for qi, query in enumerate(small_docs.queries):
        for doc_id, score in per_query["default"]["test"][query.id].items():
            assert score == pytest.approx(expected[qi, doc_ids.index(doc_id)], rel=1e-5, abs=1e-5)
    assert np.isfinite(split_scores(results[0])["ndcg_at_5"])
    with pytest.raises(ValueError, match="multivector=True"):
        VlembedEncoder(backend=tiny_backend, storage=options)


def test_remembering_backend_embeds_each_input_once(tiny_backend, small_docs) -> None:
    counting = _Counting(tiny_backend)
    remembering = RememberingBackend(counting)
    images = [small_docs.load_image(d) for d in small_docs.corpus[:3]]
    first = remembering.embed(images, task="retrieval.passage", multivector=True)
    again = remembering.embed(images[::-1], task="retrieval.passage", multivector=True)
    assert counting.calls == {"retrieval.passage": 3}
    assert all(np.array_equal(a, b) for a, b in zip(first, again[::-1], strict=True))
    remembering.embed(images[:1], task="retrieval.query", multivector=True)  # another question
    remembering.embed(images[:1], task="retrieval.passage", multivector=False)
    assert counting.calls == {"retrieval.passage": 4, "retrieval.query": 1}
    remembering.forget()
    remembering.embed(images[:1], task="retrieval.passage", multivector=True)
    assert counting.calls["retrieval.passage"] == 5
