"""The task vocabulary and prompt templates every stage agrees on (jina-embeddings-v4).

An API task (``retrieval.query`` …) names an adapter task (the LoRA merged into one GGUF) and a
text role (which prefix a text gets). The service builds prompts from these templates, the
converter records them in the manifest, eval and bench send these names. Only the PyTorch
reference (``eval/reference.py``) spells the prompts again, on purpose: it is the independent
check that these strings are the model's.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "ADAPTER_TASKS",
    "API_TASKS",
    "CONTENT_TEMPLATE",
    "IMAGE_TEMPLATE",
    "TASKS",
    "TEXT_PREFIX",
    "VISION_WRAP",
    "ordered_adapter_tasks",
    "ApiTask",
    "Role",
    "text_prefix",
]

Role = Literal["query", "passage"]
ApiTask = Literal[
    "retrieval.query", "retrieval.passage", "text-matching", "code.query", "code.passage"
]

# API task name -> (adapter task, text role)
TASKS: dict[str, tuple[str, Role]] = {
    "retrieval.query": ("retrieval", "query"),
    "retrieval.passage": ("retrieval", "passage"),
    "text-matching": ("text-matching", "query"),
    "code.query": ("code", "query"),
    "code.passage": ("code", "passage"),
}
API_TASKS: tuple[str, ...] = tuple(TASKS)
# the LoRA adapters of jina-embeddings-v4, in the checkpoint's order
ADAPTER_TASKS: tuple[str, ...] = tuple(dict.fromkeys(task for task, _ in TASKS.values()))

TEXT_PREFIX: dict[Role, str] = {"query": "Query: ", "passage": "Passage: "}
# ``{image}`` is where the image goes: the backend's media marker, around which mtmd puts
# <|vision_start|> … <|vision_end|> itself
IMAGE_TEMPLATE = "<|im_start|>user\n{image}Describe the image.<|im_end|>\n"
CONTENT_TEMPLATE = "<|im_start|>user\n{parts}<|im_end|>\n"
# what mtmd puts around each image; counted as text tokens of the prompt
VISION_WRAP = "<|vision_start|><|vision_end|>"


def text_prefix(adapter_task: str, role: Role) -> str:
    """``Query: `` or ``Passage: ``; text-matching is symmetric and always reads as a query."""
    return TEXT_PREFIX["query"] if adapter_task == "text-matching" else TEXT_PREFIX[role]


def ordered_adapter_tasks(found: set[str]) -> tuple[str, ...]:
    """Adapter tasks in jina-v4's order, then any others a checkpoint carries, sorted."""
    known = tuple(t for t in ADAPTER_TASKS if t in found)
    return known + tuple(sorted(found - set(ADAPTER_TASKS)))
