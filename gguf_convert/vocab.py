"""The GGUF token table from a checkpoint's tokenizer.json (byte-level BPE, Qwen2 style)."""

from __future__ import annotations

import json
from pathlib import Path

# gguf token types (llama.cpp LLAMA_TOKEN_TYPE_*)
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


def gguf_vocab(tokenizer_json: Path, vocab_size: int) -> tuple[list[tuple[str, int]], list[str]]:
    """(token, type) for ids 0..vocab_size-1 and the merges, as the pinned converter lays them.

    Ids without a token (the padding up to the embedding matrix's row count) become
    ``[PAD<id>]`` of type UNUSED, as upstream writes them.
    """
    data = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
    model = data["model"]
    if model.get("type") != "BPE":
        raise ValueError(
            f"{str(tokenizer_json)!r}: expected a BPE tokenizer, got {model.get('type')!r}"
        )
    by_id: dict[int, tuple[str, int]] = {i: (tok, NORMAL) for tok, i in model["vocab"].items()}
    for added in data.get("added_tokens", []):
        by_id[int(added["id"])] = (added["content"], CONTROL if added["special"] else USER_DEFINED)
    if max(by_id) >= vocab_size:
        raise ValueError(
            f"tokenizer has id {max(by_id)} but the model's vocab_size is {vocab_size}"
        )
    tokens = [by_id.get(i, (f"[PAD{i}]", UNUSED)) for i in range(vocab_size)]
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    return tokens, merges
