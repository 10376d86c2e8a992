"""Prompts: which string the backend sees for a text, an image or interleaved content.

jina-embeddings-v4 semantics (DESIGN §4); must equal ``eval/reference.py``, which is the check.
The image placeholder is the backend's media marker; mtmd wraps each image in
``<|vision_start|>`` … ``<|vision_end|>`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Role = Literal["query", "passage"]

# Jina API task names -> (adapter task, text role)
TASKS: dict[str, tuple[str, Role]] = {
    "retrieval.query": ("retrieval", "query"),
    "retrieval.passage": ("retrieval", "passage"),
    "text-matching": ("text-matching", "query"),
    "code.query": ("code", "query"),
    "code.passage": ("code", "passage"),
}
TEXT_PREFIX: dict[Role, str] = {"query": "Query: ", "passage": "Passage: "}
IMAGE_TEMPLATE = "<|im_start|>user\n{image}Describe the image.<|im_end|>\n"
CONTENT_TEMPLATE = "<|im_start|>user\n{parts}<|im_end|>\n"
# what mtmd puts around each image; counted as text tokens of the prompt
VISION_WRAP = "<|vision_start|><|vision_end|>"


@dataclass(frozen=True)
class Prompt:
    """The text the backend tokenizes (``marker`` where each image goes) and how to pool it."""

    text: str
    n_images: int
    pool: Literal["all", "vision"]  # mean over every row, or over the vision span


def text_prompt(text: str, task: str, role: Role) -> Prompt:
    """``Query: …``/``Passage: …``; text-matching is symmetric and always uses the query prefix."""
    prefix = TEXT_PREFIX["query"] if task == "text-matching" else TEXT_PREFIX[role]
    return Prompt(prefix + text, 0, "all")


def image_prompt(marker: str) -> Prompt:
    return Prompt(IMAGE_TEMPLATE.format(image=marker), 1, "vision")


def content_prompt(parts: list[str | None], marker: str) -> Prompt:
    """Interleaved content: ``None`` marks an image. One image alone is the image prompt."""
    n_images = sum(p is None for p in parts)
    if n_images == 1 and len(parts) == 1:
        return image_prompt(marker)
    body = "".join(marker if p is None else p for p in parts)
    has_text = any(p is not None for p in parts)
    return Prompt(CONTENT_TEMPLATE.format(parts=body), n_images, "all" if has_text else "vision")
