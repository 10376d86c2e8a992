"""Quantisation parity on the bench preset: each GGUF variant vs the PyTorch reference (f32).

Random weights quantise worse than trained ones, so these are pessimistic: published
measurements put trained jina-v4 ViDoRe scores within 0.2 points across F16 / Q4_K_M / IQ4_XS
GGUFs.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np

from bench.serving import ServeProcess, page_image
from vlembed.client import image_data_uri as data_uri

TEXTS = [
    "What was the operating margin in the third quarter?",
    "A chart comparing energy use across five regions from 2019 to 2023.",
    "Invoice number 4411, total due 1,284.50 EUR, payable within 30 days.",
    "The committee recommends that the policy be reviewed annually by an independent body.",
]


def measure(hf: Path, dirs: dict[str, Path], threads: int) -> dict:
    from eval.reference import ReferenceEmbedder

    ref = ReferenceEmbedder(hf)
    images = [page_image(448, 448, seed=s) for s in (3, 4)]
    want_text = [ref.encode_text(t, "query") for t in TEXTS]
    want_img = [ref.encode_image(im) for im in images]
    out: dict[str, dict] = {}
    for variant, model_dir in dirs.items():
        svc = ServeProcess(model_dir, variant, threads, parallel=1)
        try:
            body = {"input": TEXTS, "task": "retrieval.query"}
            single_t = _post(svc.url, body)
            multi_t = _post(svc.url, {**body, "return_multivector": True})
            body = {"input": [{"image": data_uri(im)} for im in images]}
            single_i = _post(svc.url, body)
            multi_i = _post(svc.url, {**body, "return_multivector": True})
        finally:
            svc.stop()
        singles = [
            float(np.dot(g, w.single))
            for g, w in zip(single_t + single_i, want_text + want_img, strict=True)
        ]
        rows = [
            float((np.asarray(g) * w.multi).sum(1).min())
            for g, w in zip(multi_t + multi_i, want_text + want_img, strict=True)
        ]
        out[variant] = {
            "single_min": min(singles),
            "single_mean": float(np.mean(singles)),
            "text_single_min": min(singles[: len(TEXTS)]),
            "image_single_min": min(singles[len(TEXTS) :]),
            "multi_row_min": min(rows),
        }
        print(variant, json.dumps(out[variant]))
    return out


def _post(url: str, body: dict) -> list:
    r = httpx.post(url + "/v1/embeddings", json=body, timeout=600)
    r.raise_for_status()
    return [np.asarray(d["embedding"], dtype=np.float32) for d in r.json()["data"]]
