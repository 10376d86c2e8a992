"""Rebuild the Qwen2.5-VL tokenizer from the vocabulary shipped in the pinned llama.cpp tree.

No tokenizer can be downloaded here, but ``models/ggml-vocab-qwen2.gguf`` in the pinned llama.cpp
source carries the real Qwen2 byte-level BPE vocabulary (151643 tokens) and its merges. A
``tokenizers`` BPE with NFC normalisation, the Qwen2 split regex (isolated) and a regex-free
ByteLevel step reproduces upstream's 47 tokenizer test vectors, so the synthetic checkpoints get
the same token ids as the real model.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

from vlembed.constants import FIRST_SPECIAL_ID, SPECIAL_TOKENS

# The split regex of Qwen2's tokenizer.json (GPT-4 style, digits one at a time).
QWEN2_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Qwen2.5-VL special tokens, in id order starting right after the BPE vocabulary.


def read_vocab_gguf(path: Path) -> tuple[list[str], list[str]]:
    """Return (BPE tokens, merges) from a llama.cpp vocab-only GGUF, without special tokens."""
    import gguf  # conversion extra; imported here so the module imports without it

    reader = gguf.GGUFReader(str(path))
    tokens_field = reader.fields["tokenizer.ggml.tokens"]
    types_field = reader.fields["tokenizer.ggml.token_type"]
    merges_field = reader.fields["tokenizer.ggml.merges"]
    tokens = [bytes(tokens_field.parts[i]).decode("utf-8") for i in tokens_field.data]
    types = [int(types_field.parts[i][0]) for i in types_field.data]
    merges = [bytes(merges_field.parts[i]).decode("utf-8") for i in merges_field.data]
    normal = 1  # llama.cpp token type NORMAL; specials (3) and padding (4) are re-added by name
    bpe_tokens = [tok for tok, typ in zip(tokens, types, strict=True) if typ == normal]
    if len(bpe_tokens) != FIRST_SPECIAL_ID:
        raise ValueError(
            f"expected {FIRST_SPECIAL_ID} BPE tokens in {str(path)!r}, found {len(bpe_tokens)}"
        )
    return bpe_tokens, merges


def build_tokenizer(vocab_gguf: Path) -> Tokenizer:
    """Build the Qwen2.5-VL tokenizer (BPE + special tokens) from ``ggml-vocab-qwen2.gguf``."""
    bpe_tokens, merges = read_vocab_gguf(vocab_gguf)
    vocab = {tok: i for i, tok in enumerate(bpe_tokens)}
    merge_pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merge_pairs, byte_fallback=False, ignore_merges=False)
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    for offset, name in enumerate(SPECIAL_TOKENS):
        got = tok.token_to_id(name)
        if got != FIRST_SPECIAL_ID + offset:
            raise ValueError(
                f"special token {name!r} got id {got}, want {FIRST_SPECIAL_ID + offset}"
            )
    return tok


def read_test_vectors(vocab_gguf: Path) -> list[tuple[str, list[int]]]:
    """Upstream's tokenizer test vectors that sit beside the vocab file (``.inp`` / ``.out``)."""
    inp = Path(str(vocab_gguf) + ".inp").read_text(encoding="utf-8")
    out = Path(str(vocab_gguf) + ".out").read_text(encoding="utf-8")
    texts = inp.split("\n__ggml_vocab_test__\n")
    if texts and texts[-1].endswith("\n__ggml_vocab_test__"):
        texts[-1] = texts[-1][: -len("\n__ggml_vocab_test__")]
    ids = [[int(x) for x in line.split()] for line in out.split("\n")]
    return list(zip(texts, ids[: len(texts)], strict=True))
