"""Prompts: which string the backend tokenizes for a text, an image or interleaved content.

The templates are the contract's (``vlembed.tasks``); ``eval/reference.py`` spells them again
independently and is the check. A prompt is kept as segments, text and image slots, until the
backend is chosen: the slot becomes that llama-server's media marker (randomised per start), and
no text a client sends can become a slot, whatever characters it holds. mtmd wraps each image
in ``<|vision_start|>`` … ``<|vision_end|>`` itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from vlembed.errors import InvalidInputError
from vlembed.tasks import CONTENT_TEMPLATE, IMAGE_TEMPLATE, VISION_WRAP, Role, text_prefix

IMAGE = None
"""An image slot among a prompt's segments."""

Segment = str | None


@dataclass(frozen=True)
class Prompt:
    """Text segments and image slots (``None``) in prompt order, and how to pool the rows."""

    segments: tuple[Segment, ...]
    pool: Literal["all", "vision"]  # mean over every row, or over the vision span

    @property
    def n_images(self) -> int:
        return sum(s is IMAGE for s in self.segments)

    def counted_text(self) -> str:
        """The prompt as the backend tokenizes it, minus the image tokens themselves."""
        return "".join(VISION_WRAP if s is IMAGE else s for s in self.segments)

    def for_backend(self, marker: str, param: str = "input") -> str:
        """The prompt string with ``marker`` in every image slot.

        Raises:
            InvalidInputError: a text segment contains the marker, which would make the backend
                see an image the client never sent.
        """
        if any(s is not IMAGE and marker in s for s in self.segments):
            raise InvalidInputError(f"text must not contain {marker!r}", param=param)
        return "".join(marker if s is IMAGE else s for s in self.segments)


def _template(template: str, body: tuple[Segment, ...]) -> tuple[Segment, ...]:
    """``template`` with ``{}`` replaced by the segments of ``body``."""
    head, tail = template.split("{}")
    return (head, *body, tail)


def text_prompt(text: str, adapter_task: str, role: Role) -> Prompt:
    """``Query: …``/``Passage: …`` (no chat template, no BOS), pooled over every row."""
    return Prompt((text_prefix(adapter_task, role) + text,), "all")


def image_prompt() -> Prompt:
    """One image alone: the chat template with the fixed instruction, pooled over the image."""
    return Prompt(_template(IMAGE_TEMPLATE.format(image="{}"), (IMAGE,)), "vision")


def content_prompt(parts: list[Segment]) -> Prompt:
    """Interleaved content: ``None`` marks an image. One image alone is the image prompt."""
    if parts == [IMAGE]:
        return image_prompt()
    has_text = any(p is not IMAGE for p in parts)
    body = _template(CONTENT_TEMPLATE.format(parts="{}"), tuple(parts))
    return Prompt(body, "all" if has_text else "vision")
