"""What the service serves, read once at start-up from a converted model's manifest.

The manifest is the only runtime source of per-model values (pixel limits, dimensions, tasks,
files). Values the service cannot vary are checked against it here, so that a model converted
for another geometry or with other prompts is refused at start instead of embedding silently
wrong vectors. Tokenizer and projectors are loaded once so that no request pays for them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from preprocess_service.pooling import Projector
from vlembed import constants
from vlembed.manifest import Manifest, load_manifest
from vlembed.tasks import IMAGE_TEMPLATE, TEXT_PREFIX

log = logging.getLogger("vlembed.model")


@dataclass
class ServedModel:
    manifest: Manifest
    tokenizer: Tokenizer
    projectors: dict[str, Projector] = field(default_factory=dict)
    # longest vocabulary entry in characters: a text prefix of n_tokens * this many characters
    # holds at least the text's first n_tokens tokens
    max_token_chars: int = 256

    @property
    def name(self) -> str:
        return self.manifest.model_name

    @property
    def merged_patch_area(self) -> int:
        """Patches per merged image token (4 for a 2x2 merge)."""
        return self.manifest.merge_size**2

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def truncate_text(self, text: str, max_tokens: int) -> str:
        """The first ``max_tokens`` tokens of ``text``, decoded back to a string.

        Only a prefix that surely holds them is tokenized, so a 20 MB text costs no more
        than one that just fits.
        """
        head = text[: max(0, max_tokens) * self.max_token_chars]
        ids = self.tokenizer.encode(head, add_special_tokens=False).ids[: max(0, max_tokens)]
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def check_manifest(m: Manifest) -> None:
    """Refuse what this service cannot serve exactly (the patched server hard-codes the rest)."""
    geometry = (m.patch_size, m.merge_size, m.temporal_patch_size)
    supported = (constants.PATCH_SIZE, constants.MERGE_SIZE, constants.TEMPORAL_PATCH_SIZE)
    if geometry != supported:
        raise ValueError(
            f"model {m.model_name!r} has patch/merge/temporal sizes {geometry}; this service "
            f"serves {supported} (Qwen2.5-VL)"
        )
    if m.prompts != TEXT_PREFIX or m.image_prompt != IMAGE_TEMPLATE:
        raise ValueError(
            f"model {m.model_name!r} was converted with prompts {m.prompts!r} / "
            f"{m.image_prompt!r}; this service builds {TEXT_PREFIX!r} / {IMAGE_TEMPLATE!r}"
        )
    if not 0 < m.min_pixels <= m.max_pixels:
        raise ValueError(f"pixel limits {m.min_pixels}..{m.max_pixels} are not a valid range")


def load_served_model(root: Path) -> ServedModel:
    root = Path(root)
    manifest = load_manifest(root)
    check_manifest(manifest)
    for note in manifest.notes:
        log.info("model note: %s", note)
    tokenizer = Tokenizer.from_file(str(root / manifest.tokenizer))
    projectors = {
        task: Projector.load(root / files.projector)
        for task, files in manifest.tasks.items()
        if files.projector
    }
    longest = max((len(t) for t in tokenizer.get_vocab(with_added_tokens=True)), default=1)
    return ServedModel(
        manifest=manifest, tokenizer=tokenizer, projectors=projectors, max_token_chars=longest
    )
