"""Parity report: how far each model variant is from the reference, and whether it matters.

For every variant (a served F16/Q4_K_M/IQ4_XS model, or anything else a spec names) against the
baseline (the first model, normally the PyTorch reference), on a local document set:

- **vectors**: cosine of the single vectors, per page and per query (min, mean), and of the
  multi-vector rows (the service returns pooled vectors or projected rows, never raw hidden
  states, so per-token agreement is measured on the 128-d projected rows);
- **scores**: query x page score differences, single-vector (cosine) and multi-vector (MaxSim);
- **rankings**: per query, Spearman's rho and Kendall's tau between the baseline's and the
  variant's score lists over all pages, and how often the top page is the same;
- **retrieval**: nDCG@5 and recall@5 of every model, per page kind and their mean, shaped like
  the ViDoRe table this project reproduces (rows = tasks, columns = models);
- **heatmaps**: for some pages, the cosine distance between the variant's and the baseline's
  image-token rows, laid out on the merged patch grid over the page image. The API does not
  report the grid; it is recomputed with ``smart_resize`` from the page size. In the image
  template the prompt ``<|im_start|>user\\n<|vision_start|>`` puts 4 tokens before the first
  image token, then come the (h/2)*(w/2) merged image tokens in raster order, then
  ``<|vision_end|>Describe the image.<|im_end|>\\n`` (7 tokens).

Outputs in OUT: ``parity.md`` (tables), ``parity.json`` (every number, per page and per query),
``heatmaps/<variant>/<page>.png``.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from eval import scoring
from eval.backends import Backend, ModelSpec, ReferenceBackend, column_labels
from eval.docset import DocSet
from eval.report import markdown_table, score_table, slug, write_json
from vlembed.constants import MAX_PIXELS, MIN_PIXELS, RESIZE_FACTOR
from vlembed.geometry import smart_resize

__all__ = [
    "IMAGE_PREFIX_TOKENS",
    "IMAGE_SUFFIX_TOKENS",
    "Embeddings",
    "compare",
    "embed_docset",
    "image_token_grid",
    "retrieval_metrics",
    "run_parity",
]

IMAGE_PREFIX_TOKENS = 4  # <|im_start|> "user" "\n" <|vision_start|>
IMAGE_SUFFIX_TOKENS = 7  # <|vision_end|> "Describe" " the" " image" "." <|im_end|> "\n"
K = 5


@dataclass
class Embeddings:
    """Everything one model produced for a document set."""

    label: str
    doc_single: np.ndarray  # [n_pages, dim]
    query_single: np.ndarray  # [n_queries, dim]
    doc_multi: list[np.ndarray] | None  # per page [n_tokens, dim]
    query_multi: list[np.ndarray] | None
    seconds: float


def embed_docset(
    backend: Backend, docs: DocSet, label: str, *, multivector: bool = True, chunk: int = 8
) -> Embeddings:
    """Embed every page (passage role) and query (query role) of ``docs``, single and multi.

    Pages are handled in chunks, single then multi-vector per chunk, so a reference backend
    answers the second request from its cache and never holds more than a chunk of images.
    """
    start = time.perf_counter()
    doc_single: list[np.ndarray] = []
    doc_multi: list[np.ndarray] = []
    for i in range(0, len(docs.corpus), chunk):
        images = [docs.load_image(d) for d in docs.corpus[i : i + chunk]]
        doc_single += backend.embed(images, task="retrieval.passage", multivector=False)
        if multivector:
            doc_multi += backend.embed(images, task="retrieval.passage", multivector=True)
    texts = [q.text for q in docs.queries]
    query_single = backend.embed(texts, task="retrieval.query", multivector=False)
    query_multi = (
        backend.embed(texts, task="retrieval.query", multivector=True) if multivector else None
    )
    return Embeddings(
        label=label,
        doc_single=np.stack(doc_single),
        query_single=np.stack(query_single),
        doc_multi=doc_multi if multivector else None,
        query_multi=query_multi,
        seconds=time.perf_counter() - start,
    )


def retrieval_metrics(scores: np.ndarray, docs: DocSet) -> dict[str, Any]:
    """nDCG@5 / recall@5 per query, their mean per kind of the answering page, and overall."""
    doc_ids = [d.id for d in docs.corpus]
    kind_of = {d.id: d.kind for d in docs.corpus}
    per_query: dict[str, dict[str, float]] = {}
    by_kind: dict[str, list[str]] = {}
    for qi, query in enumerate(docs.queries):
        ranked = scoring.rank_documents(scores[qi], doc_ids)
        qrels = docs.qrels.get(query.id, {})
        per_query[query.id] = {
            f"ndcg_at_{K}": scoring.ndcg_at_k(ranked, qrels, K),
            f"recall_at_{K}": scoring.recall_at_k(ranked, qrels, K),
            "top1": ranked[0],
        }
        by_kind.setdefault(kind_of[query.page], []).append(query.id)
    kinds = {
        kind: {
            metric: float(np.mean([per_query[q][metric] for q in qids]))
            for metric in (f"ndcg_at_{K}", f"recall_at_{K}")
        }
        for kind, qids in sorted(by_kind.items())
    }
    overall = {
        metric: float(np.mean([v[metric] for v in per_query.values()]))
        for metric in (f"ndcg_at_{K}", f"recall_at_{K}")
    }
    return {"per_query": per_query, "by_kind": kinds, "all_queries": overall}


def _min_mean(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    arr = np.asarray(values, dtype=np.float64)
    if arr.size == 0:
        return {"min": float("nan"), "mean": float("nan")}
    return {"min": float(np.nanmin(arr)), "mean": float(np.nanmean(arr))}


def _row_agreement(
    base: list[np.ndarray], other: list[np.ndarray], ids: list[str]
) -> dict[str, Any]:
    per_item: dict[str, Any] = {}
    mins, means = [], []
    for item_id, a, b in zip(ids, base, other, strict=True):
        if a.shape != b.shape:
            per_item[item_id] = {"error": f"row shapes differ: {a.shape} vs {b.shape}"}
            continue
        cos = scoring.row_cosines(a, b)
        per_item[item_id] = {"min": float(cos.min()), "mean": float(cos.mean())}
        mins.append(float(cos.min()))
        means.append(float(cos.mean()))
    mismatched = sum(1 for v in per_item.values() if "error" in v)
    return {
        "min": min(mins) if mins else float("nan"),
        "mean": float(np.mean(means)) if means else float("nan"),
        "mismatched": mismatched,
        "per_item": per_item,
    }


def _ranking_agreement(base: np.ndarray, other: np.ndarray) -> dict[str, Any]:
    rho = [scoring.spearman(base[q], other[q]) for q in range(base.shape[0])]
    tau = [scoring.kendall_tau(base[q], other[q]) for q in range(base.shape[0])]
    diff = np.abs(base - other)
    rel = diff / np.maximum(np.abs(base), 1e-12)
    return {
        "abs_diff": {"max": float(diff.max()), "mean": float(diff.mean())},
        "rel_diff_mean": float(rel.mean()),
        "spearman": {**_min_mean(rho), "per_query": rho},
        "kendall": {**_min_mean(tau), "per_query": tau},
        "top1_agreement": float(np.mean(base.argmax(axis=1) == other.argmax(axis=1))),
    }


def compare(base: Embeddings, other: Embeddings, docs: DocSet) -> dict[str, Any]:
    """Every agreement number of ``other`` against ``base`` (see the module docstring)."""
    if base.doc_single.shape != other.doc_single.shape:
        raise ValueError(
            f"{other.label}: single vectors are {other.doc_single.shape[1:]}-d, the baseline's "
            f"{base.doc_single.shape[1:]}-d; compare models with the same output width"
        )
    doc_ids = [d.id for d in docs.corpus]
    query_ids = [q.id for q in docs.queries]
    doc_cos = scoring.row_cosines(base.doc_single, other.doc_single)
    query_cos = scoring.row_cosines(base.query_single, other.query_single)
    out: dict[str, Any] = {
        "single_cosine_pages": {
            **_min_mean(doc_cos),
            "per_item": dict(zip(doc_ids, doc_cos, strict=True)),
        },
        "single_cosine_queries": {
            **_min_mean(query_cos),
            "per_item": dict(zip(query_ids, query_cos, strict=True)),
        },
        "single_scores": _ranking_agreement(
            scoring.cosine_matrix(base.query_single, base.doc_single),
            scoring.cosine_matrix(other.query_single, other.doc_single),
        ),
    }
    if base.doc_multi is not None and other.doc_multi is not None:
        out["row_cosine_pages"] = _row_agreement(base.doc_multi, other.doc_multi, doc_ids)
        out["row_cosine_queries"] = _row_agreement(
            base.query_multi or [], other.query_multi or [], query_ids
        )
        out["maxsim_scores"] = _ranking_agreement(
            scoring.maxsim_matrix(base.query_multi or [], base.doc_multi),
            scoring.maxsim_matrix(other.query_multi or [], other.doc_multi),
        )
    return out


# --- heatmaps ---------------------------------------------------------------------------------


def image_token_grid(
    width: int, height: int, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> tuple[int, int]:
    """(rows, cols) of merged image tokens for a page: the resized size over 28."""
    h, w = smart_resize(height, width, RESIZE_FACTOR, min_pixels, max_pixels)
    return h // RESIZE_FACTOR, w // RESIZE_FACTOR


def image_token_rows(rows: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """The image-token rows of an image prompt as ``[grid_h, grid_w, dim]``.

    Raises:
        ValueError: The row count is not 4 + grid_h*grid_w + 7 (another template, or a grid
            the service computed differently).
    """
    n_image = grid[0] * grid[1]
    expected = IMAGE_PREFIX_TOKENS + n_image + IMAGE_SUFFIX_TOKENS
    if rows.shape[0] != expected:
        raise ValueError(
            f"{rows.shape[0]} rows, expected {expected} = {IMAGE_PREFIX_TOKENS} + "
            f"{grid[0]}x{grid[1]} image tokens + {IMAGE_SUFFIX_TOKENS}"
        )
    image_rows = rows[IMAGE_PREFIX_TOKENS : IMAGE_PREFIX_TOKENS + n_image]
    return image_rows.reshape(grid[0], grid[1], -1)


def _heatmap(page: Image.Image, distance: np.ndarray, vmax: float, path: Path, title: str) -> None:
    """The page with its per-token distance grid laid over it (redder = further apart)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    aspect = page.height / page.width
    fig = Figure(figsize=(6.5, max(3.2, 6.0 * aspect + 0.8)), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.imshow(page, extent=(0, page.width, page.height, 0))
    overlay = ax.imshow(
        distance,
        cmap="Reds",
        alpha=0.55,
        vmin=0.0,
        vmax=vmax,
        interpolation="nearest",
        extent=(0, page.width, page.height, 0),
    )
    fig.colorbar(overlay, ax=ax, fraction=0.046, pad=0.02, label="cosine distance per token")
    fig.suptitle(title, fontsize=8)
    ax.set_axis_off()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", metadata={"Software": None})


def _pick_pages(docs: DocSet, n: int) -> list[int]:
    """Up to n pages, one of each kind first (different sizes and layouts), then more."""
    by_kind: dict[str, list[int]] = {}
    for i, d in enumerate(docs.corpus):
        by_kind.setdefault(d.kind, []).append(i)
    picked: list[int] = []
    depth = 0
    while len(picked) < min(n, len(docs.corpus)):
        for indices in by_kind.values():
            if depth < len(indices) and len(picked) < n:
                picked.append(indices[depth])
        depth += 1
    return picked


def heatmaps(
    base: Embeddings,
    other: Embeddings,
    docs: DocSet,
    out_dir: Path,
    *,
    n_pages: int,
    min_pixels: int = MIN_PIXELS,
    max_pixels: int = MAX_PIXELS,
) -> list[dict[str, Any]]:
    """Write per-token distance heatmaps for ``n_pages`` pages; return what was drawn.

    All pages of one variant share one colour scale (0 to the largest distance among them),
    so a redder page is a page that moved more.
    """
    if base.doc_multi is None or other.doc_multi is None:
        return []
    entries: list[dict[str, Any]] = []
    grids: dict[int, np.ndarray] = {}
    for i in _pick_pages(docs, n_pages):
        doc = docs.corpus[i]
        grid = image_token_grid(doc.width, doc.height, min_pixels, max_pixels)
        entry: dict[str, Any] = {"page": doc.id, "kind": doc.kind, "grid": list(grid)}
        entries.append(entry)
        try:
            a = image_token_rows(base.doc_multi[i], grid)
            b = image_token_rows(other.doc_multi[i], grid)
        except ValueError as exc:
            entry["error"] = str(exc)
            continue
        cos = scoring.row_cosines(a.reshape(-1, a.shape[-1]), b.reshape(-1, b.shape[-1]))
        grids[i] = (1.0 - cos).reshape(grid)
        entry["index"] = i
    vmax = max([1e-6, *(float(d.max()) for d in grids.values())])
    for entry in entries:
        i = entry.pop("index", None)
        if i is None:
            continue
        doc, distance = docs.corpus[i], grids[i]
        path = out_dir / slug(other.label) / f"{doc.id}.png"
        title = (
            f"{other.label} vs {base.label}: {doc.id} ({doc.kind}, {doc.width}x{doc.height} px, "
            f"{distance.shape[0]}x{distance.shape[1]} tokens)\n"
            f"cosine distance per image token: max {distance.max():.2e}, "
            f"mean {distance.mean():.2e}"
        )
        _heatmap(docs.load_image(doc), distance, vmax, path, title)
        entry.update(
            path=str(path.relative_to(out_dir.parent)),
            max_distance=float(distance.max()),
            mean_distance=float(distance.mean()),
        )
    return entries


# --- the report -------------------------------------------------------------------------------


def _retrieval_columns(
    results: dict[str, dict[str, Any]], mode: str, metric: str
) -> dict[str, dict[str, float]]:
    return {
        label: {kind: v[metric] for kind, v in r[mode]["by_kind"].items()}
        for label, r in results.items()
        if mode in r
    }


def _agreement_rows(agreement: dict[str, dict[str, Any]]) -> list[list[float | str | None]]:
    def pair(label: str, key: str, a: str = "min", b: str = "mean") -> str:
        v = agreement[label].get(key)
        if v is None:
            return "-"
        return f"{v[a]:.6f} / {v[b]:.6f}"

    def diff(label: str, key: str) -> str:
        v = agreement[label].get(key)
        if v is None:
            return "-"
        return f"{v['abs_diff']['max']:.2e} / {v['abs_diff']['mean']:.2e}"

    def ranks(label: str, key: str, which: str) -> str:
        v = agreement[label].get(key)
        if v is None:
            return "-"
        return f"{v[which]['min']:.4f} / {v[which]['mean']:.4f}"

    def top1(label: str, key: str) -> str:
        v = agreement[label].get(key)
        return "-" if v is None else f"{v['top1_agreement']:.3f}"

    labels = list(agreement)
    spec = [
        ("single-vector cosine, pages (min / mean)", lambda lb: pair(lb, "single_cosine_pages")),
        (
            "single-vector cosine, queries (min / mean)",
            lambda lb: pair(lb, "single_cosine_queries"),
        ),
        ("multi-vector row cosine, pages (min / mean)", lambda lb: pair(lb, "row_cosine_pages")),
        (
            "multi-vector row cosine, queries (min / mean)",
            lambda lb: pair(lb, "row_cosine_queries"),
        ),
        ("cosine score abs diff (max / mean)", lambda lb: diff(lb, "single_scores")),
        ("MaxSim score abs diff (max / mean)", lambda lb: diff(lb, "maxsim_scores")),
        (
            "Spearman per query, cosine (min / mean)",
            lambda lb: ranks(lb, "single_scores", "spearman"),
        ),
        (
            "Kendall per query, cosine (min / mean)",
            lambda lb: ranks(lb, "single_scores", "kendall"),
        ),
        (
            "Spearman per query, MaxSim (min / mean)",
            lambda lb: ranks(lb, "maxsim_scores", "spearman"),
        ),
        (
            "Kendall per query, MaxSim (min / mean)",
            lambda lb: ranks(lb, "maxsim_scores", "kendall"),
        ),
        ("top-1 page agreement, cosine", lambda lb: top1(lb, "single_scores")),
        ("top-1 page agreement, MaxSim", lambda lb: top1(lb, "maxsim_scores")),
    ]
    return [[name, *(fn(lb) for lb in labels)] for name, fn in spec]


def render_markdown(data: dict[str, Any]) -> str:
    """parity.md from the parity.json structure."""
    docs = data["docs"]
    base = data["baseline"]
    parts = [
        "# Parity report\n",
        f"Document set `{docs['path']}`: {docs['n_pages']} pages, {docs['n_queries']} queries "
        f"(revision {docs['revision']}). Baseline: **{base}**. Scores x100; rows are page "
        "kinds (each query is counted under the kind of the page that answers it), Mean is "
        "the mean over the kinds.\n",
    ]
    retrieval = data["retrieval"]
    kinds = sorted({k for r in retrieval.values() for m in r.values() for k in m["by_kind"]})
    for mode, mode_name in (("single", "single vector, cosine"), ("multi", "multi-vector, MaxSim")):
        for metric, metric_name in (
            (f"ndcg_at_{K}", f"nDCG@{K}"),
            (f"recall_at_{K}", f"recall@{K}"),
        ):
            columns = _retrieval_columns(retrieval, mode, metric)
            if columns:
                parts.append(f"## {metric_name}, {mode_name}\n")
                parts.append(score_table(columns, kinds, first_header="Page kind"))
    agreement = data["agreement"]
    if agreement:
        parts.append(f"## Agreement with {base}\n")
        parts.append(markdown_table(["Metric", *agreement], _agreement_rows(agreement)))
    times = {m["label"]: m["seconds"] for m in data["models"]}
    parts.append("## Embedding time (s, pages + queries, single + multi-vector)\n")
    parts.append(markdown_table(["Model", "seconds"], [[k, v] for k, v in times.items()], ".1f"))
    drawn = [h for hs in data["heatmaps"].values() for h in hs if "path" in h]
    if drawn:
        parts.append("## Heatmaps\n")
        for h in drawn:
            parts.append(f"- [{h['path']}]({h['path']}): max distance {h['max_distance']:.2e}")
        parts.append("")
    return "\n".join(parts) + "\n"


def run_parity(
    specs: Sequence[ModelSpec],
    backends: Sequence[Backend],
    docs: DocSet,
    out: Path,
    *,
    multivector: bool = True,
    n_heatmaps: int = 4,
) -> dict[str, Any]:
    """Embed with every backend, compare each with the first, write parity.md/.json/heatmaps."""
    if len(specs) != len(backends) or not specs:
        raise ValueError("need one backend per spec and at least one model")
    out.mkdir(parents=True, exist_ok=True)
    labels = column_labels(specs, backends)
    embeddings = []
    for label, backend in zip(labels, backends, strict=True):
        print(
            f"embedding {len(docs.corpus)} pages, {len(docs.queries)} queries: {label}",
            file=sys.stderr,
        )
        emb = embed_docset(backend, docs, label, multivector=multivector)
        print(f"  {emb.seconds:.1f} s", file=sys.stderr)
        embeddings.append(emb)
    base = embeddings[0]
    pixels = {"min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}
    if isinstance(backends[0], ReferenceBackend):
        pixels = {
            "min_pixels": backends[0].embedder.min_pixels,
            "max_pixels": backends[0].embedder.max_pixels,
        }
    retrieval: dict[str, dict[str, Any]] = {}
    for emb in embeddings:
        retrieval[emb.label] = {
            "single": retrieval_metrics(
                scoring.cosine_matrix(emb.query_single, emb.doc_single), docs
            )
        }
        if emb.doc_multi is not None and emb.query_multi is not None:
            retrieval[emb.label]["multi"] = retrieval_metrics(
                scoring.maxsim_matrix(emb.query_multi, emb.doc_multi), docs
            )
    agreement = {emb.label: compare(base, emb, docs) for emb in embeddings[1:]}
    drawn = {
        emb.label: heatmaps(base, emb, docs, out / "heatmaps", n_pages=n_heatmaps, **pixels)
        for emb in embeddings[1:]
    }
    data = {
        "docs": {
            "path": str(docs.root),
            "revision": docs.revision(),
            "n_pages": len(docs.corpus),
            "n_queries": len(docs.queries),
        },
        "baseline": base.label,
        "models": [
            {
                "label": emb.label,
                "spec": spec.describe(),
                "name": backend.name,
                "revision": backend.revision,
                "seconds": emb.seconds,
            }
            for emb, spec, backend in zip(embeddings, specs, backends, strict=True)
        ],
        "grid_pixels": pixels,
        "retrieval": retrieval,
        "agreement": agreement,
        "heatmaps": drawn,
    }
    write_json(out / "parity.json", data)
    (out / "parity.md").write_text(render_markdown(data), encoding="utf-8")
    return data
