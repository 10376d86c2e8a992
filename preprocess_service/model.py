"""What the service serves, read once at start-up from a converted model's manifest.

Tokenizer, projectors and dimensions are loaded here once so that no request pays for them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from tokenizers import Tokenizer

from gguf_convert.manifest import Manifest, load_manifest
from preprocess_service.pooling import Projector


@dataclass
class ServedModel:
    root: Path
    manifest: Manifest
    tokenizer: Tokenizer
    projectors: dict[str, Projector] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.manifest.model_name

    @property
    def tasks(self) -> list[str]:
        return list(self.manifest.tasks)

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def truncate_text(self, text: str, max_tokens: int) -> str:
        """Keep the first ``max_tokens`` tokens of ``text`` (decoded back to a string)."""
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids[: max(0, max_tokens)]
        return self.tokenizer.decode(ids, skip_special_tokens=False)


def load_served_model(root: Path) -> ServedModel:
    root = Path(root)
    manifest = load_manifest(root)
    tokenizer = Tokenizer.from_file(str(root / manifest.tokenizer))
    projectors = {
        task: Projector.load(root / files.projector)
        for task, files in manifest.tasks.items()
        if files.projector
    }
    return ServedModel(root=root, manifest=manifest, tokenizer=tokenizer, projectors=projectors)
