"""Where embeddings come from: a running vlembed service or the PyTorch reference in-process.

Both sit behind one small interface, :class:`Backend`, so that the MTEB encoder and the parity
report treat "the model" the same whichever way it runs. The currency is the service's own
request vocabulary (an API task string such as ``"retrieval.query"``, multi-vector or not, an
optional Matryoshka dimension), so the reference backend answers exactly the question an HTTP
request would ask.

A model is named on the command line by a *spec*:

- ``http://host:port`` or ``https://…``: a running ``vlembed serve``;
- ``reference:DIR``: :class:`eval.reference.ReferenceEmbedder` on a checkpoint directory;
- ``reference``: the reference on a tiny random checkpoint (seed 0) built on the fly, the same
  one ``vlembed serve`` falls back to without ``--model``; a smoke test, its scores mean nothing.

Any spec may be prefixed with ``LABEL=`` to name its column in reports (``F16=http://…``).
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

import numpy as np
from PIL import Image

from vlembed.tasks import API_TASKS, TASKS, Role

if TYPE_CHECKING:
    from eval.reference import ReferenceEmbedder

__all__ = [
    "API_TASKS",
    "Backend",
    "Item",
    "ModelSpec",
    "ReferenceBackend",
    "RememberingBackend",
    "column_labels",
    "open_backend",
    "parse_spec",
    "split_task",
]

logger = logging.getLogger(__name__)

Item = str | Image.Image
"""One input: a text, or an RGB page image."""


@runtime_checkable
class Backend(Protocol):
    """Anything that turns inputs into vlembed embeddings.

    Attributes:
        name: The model's id (served id, or ``"reference"``); used in MTEB model names.
        revision: A content revision when one is known, else ``None``.
        n_parameters: Parameter count when known (the reference counts them), else ``None``.
        dim: Full single-vector width when known, else ``None``.
        multi_dim: Multi-vector row width when known (``None``: unknown or no projector).
    """

    name: str
    revision: str | None
    n_parameters: int | None
    dim: int | None
    multi_dim: int | None

    def embed(
        self,
        items: Sequence[Item],
        *,
        task: str,
        multivector: bool,
        dimensions: int | None = None,
    ) -> list[np.ndarray]:
        """One array per item: ``[dim]`` (single vector) or ``[n_tokens, dim]`` (multi-vector)."""
        ...

    def close(self) -> None:
        """Release connections or memory; the backend is not used afterwards."""
        ...


def split_task(task: str) -> tuple[str, Role]:
    """``"retrieval.query"`` -> (adapter ``"retrieval"``, role ``"query"``)."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; valid tasks: {', '.join(API_TASKS)}")
    return TASKS[task]


def _item_key(item: Item) -> tuple:
    if isinstance(item, str):
        return ("text", item)
    digest = hashlib.blake2b(item.tobytes(), digest_size=16).hexdigest()
    return ("image", item.mode, item.size, digest)


@dataclass(frozen=True)
class _Cached:
    single: np.ndarray
    pooled: np.ndarray  # mean of the pooled rows before normalisation (for Matryoshka)
    multi: np.ndarray | None


class ReferenceBackend:
    """The PyTorch reference as a :class:`Backend`.

    One forward pass yields the single vector, the Matryoshka source and the multi-vector rows
    of an input; they are kept in a small LRU cache keyed by (adapter, role, content), so asking
    for the single and then the multi-vector form of the same inputs (as the parity report
    does) costs one forward pass, not two.
    """

    def __init__(
        self, embedder: ReferenceEmbedder, *, name: str = "reference", cache_size: int = 256
    ) -> None:
        self.embedder = embedder
        self.name = name
        self.revision = checkpoint_revision(embedder.model_dir)
        self.n_parameters = _count_parameters(embedder)
        self.dim: int | None = int(embedder.hidden_size)
        projector = embedder.projector
        self.multi_dim: int | None = (
            None if projector is None else int(projector.base.out_features)  # type: ignore[union-attr]
        )
        self._cache: OrderedDict[tuple, _Cached] = OrderedDict()
        self._cache_size = cache_size

    def embed(
        self,
        items: Sequence[Item],
        *,
        task: str,
        multivector: bool,
        dimensions: int | None = None,
    ) -> list[np.ndarray]:
        adapter, role = split_task(task)
        if self.embedder.tasks and adapter not in self.embedder.tasks:
            raise ValueError(f"checkpoint has no {adapter!r} adapter: {list(self.embedder.tasks)}")
        out = []
        for item in items:
            cached = self._encode(item, adapter, role)
            if multivector:
                if cached.multi is None:
                    raise ValueError("this checkpoint has no multi-vector projector")
                out.append(cached.multi)
            elif dimensions is not None:
                head = cached.pooled[:dimensions]
                out.append((head / np.linalg.norm(head)).astype(np.float32))
            else:
                out.append(cached.single)
        return out

    def _encode(self, item: Item, adapter: str, role: str) -> _Cached:
        key = (adapter, role if isinstance(item, str) else "", *_item_key(item))
        hit = self._cache.get(key)
        if hit is not None:
            self._cache.move_to_end(key)
            return hit
        if self.embedder.tasks:
            self.embedder.set_task(adapter)
        if isinstance(item, str):
            enc = self.embedder.encode_text(item, role)  # type: ignore[arg-type]
        elif isinstance(item, Image.Image):
            enc = self.embedder.encode_image(item.convert("RGB"))
        else:
            raise TypeError(f"cannot embed a {type(item).__name__}; expected str or PIL image")
        pooled = enc.rows[enc.pool_start : enc.pool_end].mean(axis=0).astype(np.float32)
        entry = _Cached(single=enc.single, pooled=pooled, multi=enc.multi)
        self._cache[key] = entry
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return entry

    def close(self) -> None:
        self._cache.clear()


class RememberingBackend:
    """A backend that embeds each (task, input, form) once until :meth:`forget`.

    Scoring one task under several storage options changes only how page rows are stored, not
    the rows themselves, so every option after the first is answered from memory instead of
    embedding the corpus again (a ViDoRe task is ~500 pages: ~180 MB of rows on the real model,
    which is why the caller forgets after each task).
    """

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.name = backend.name
        self.revision = backend.revision
        self.n_parameters = backend.n_parameters
        self.dim = backend.dim
        self.multi_dim = backend.multi_dim
        self._memory: dict[tuple, np.ndarray] = {}

    def embed(
        self,
        items: Sequence[Item],
        *,
        task: str,
        multivector: bool,
        dimensions: int | None = None,
    ) -> list[np.ndarray]:
        keys = [(task, multivector, dimensions, *_item_key(item)) for item in items]
        todo = [i for i, key in enumerate(keys) if key not in self._memory]
        if todo:
            fresh = self.backend.embed(
                [items[i] for i in todo], task=task, multivector=multivector, dimensions=dimensions
            )
            for i, vector in zip(todo, fresh, strict=True):
                self._memory[keys[i]] = vector
        return [self._memory[key] for key in keys]

    def forget(self) -> None:
        """Drop everything remembered (between tasks)."""
        self._memory.clear()

    def close(self) -> None:
        self.forget()
        self.backend.close()


def checkpoint_revision(model_dir: Path) -> str:
    """A short content revision of a checkpoint: hash of its config and file names and sizes.

    Cheap (no weight bytes are read) and enough to tell checkpoints apart in MTEB's result
    folders; it is not a security hash.
    """
    h = hashlib.sha256((Path(model_dir) / "config.json").read_bytes())
    for f in sorted(p for p in Path(model_dir).rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(model_dir)}:{f.stat().st_size}\n".encode())
    return h.hexdigest()[:12]


def _count_parameters(embedder: ReferenceEmbedder) -> int:
    n = sum(p.numel() for p in embedder.model.parameters())
    if embedder.projector is not None:
        n += sum(p.numel() for p in embedder.projector.parameters())
    return int(n)


@dataclass(frozen=True)
class ModelSpec:
    """A parsed ``[LABEL=]SPEC``: kind ``"http"`` or ``"reference"``, target, optional label."""

    kind: Literal["http", "reference"]
    target: str | None  # URL or checkpoint directory; None = tiny random reference
    label: str | None = None  # LABEL= given by the user

    def describe(self) -> str:
        """The spec as the user would write it (without the label)."""
        if self.kind == "http":
            return self.target or ""
        return "reference" if self.target is None else f"reference:{self.target}"


def parse_spec(spec: str) -> ModelSpec:
    """Parse a model spec (see the module docstring) without touching the network or disk."""
    label = None
    body = spec.strip()
    head, sep, tail = body.partition("=")
    if sep and head and ":" not in head and "/" not in head:
        label, body = head, tail
    if body.startswith(("http://", "https://")):
        return ModelSpec("http", body.rstrip("/"), label)
    if body == "reference":
        return ModelSpec("reference", None, label)
    if body.startswith("reference:") and len(body) > len("reference:"):
        return ModelSpec("reference", body[len("reference:") :], label)
    raise ValueError(
        f"unknown model spec {spec!r}; use http://HOST:PORT, reference:DIR or reference "
        "(optionally prefixed with LABEL=)"
    )


def open_backend(spec: ModelSpec | str, **http_options: object) -> Backend:
    """Build the backend a spec names; HTTP options go to :class:`vlembed.Client`."""
    if isinstance(spec, str):
        spec = parse_spec(spec)
    if spec.kind == "http":
        from vlembed.client import Client

        return Client(spec.target or "", **http_options)  # type: ignore[arg-type]
    from eval.reference import ReferenceEmbedder

    if spec.target is not None:
        return ReferenceBackend(ReferenceEmbedder(Path(spec.target)))
    return _tiny_random_reference()


def column_labels(specs: Sequence[ModelSpec], backends: Sequence[Backend]) -> list[str]:
    """Report column names: the user's LABEL, else the model's name, else the spec.

    Two variants served under the same model id would share a column name, so duplicates fall
    back to the spec (URL or directory), and any remaining clash gets a ``#n`` suffix.
    """
    labels = [s.label or b.name for s, b in zip(specs, backends, strict=True)]
    labels = [
        lb if s.label or labels.count(lb) == 1 else s.describe()
        for lb, s in zip(labels, specs, strict=True)
    ]
    seen: dict[str, int] = {}
    out = []
    for lb in labels:
        seen[lb] = seen.get(lb, 0) + 1
        out.append(lb if seen[lb] == 1 else f"{lb} #{seen[lb]}")
    return out


def _tiny_random_reference() -> ReferenceBackend:
    """The reference on a tiny random checkpoint; the files are only needed while loading."""
    import tempfile

    from eval.reference import ReferenceEmbedder
    from gguf_convert.synthetic import make_checkpoint

    logger.warning("model 'reference' is a tiny RANDOM checkpoint: a smoke test, not a score")
    with tempfile.TemporaryDirectory(prefix="vlembed-tiny-") as tmp:
        path = make_checkpoint(Path(tmp) / "tiny", "tiny", 0)
        return ReferenceBackend(ReferenceEmbedder(path), name="reference-tiny-random")
