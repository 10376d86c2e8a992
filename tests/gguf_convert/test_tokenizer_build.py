from pathlib import Path

from gguf_convert.tokenizer_build import (
    FIRST_SPECIAL_ID,
    SPECIAL_TOKENS,
    build_tokenizer,
    read_test_vectors,
)


def test_reproduces_upstream_test_vectors(vocab_gguf: Path) -> None:
    tok = build_tokenizer(vocab_gguf)
    vectors = read_test_vectors(vocab_gguf)
    assert len(vectors) == 47
    mismatches = [
        (text, tok.encode(text, add_special_tokens=False).ids, ids)
        for text, ids in vectors
        if tok.encode(text, add_special_tokens=False).ids != ids
    ]
    assert mismatches == []


def test_special_tokens_have_qwen25vl_ids(vocab_gguf: Path) -> None:
    tok = build_tokenizer(vocab_gguf)
    assert tok.token_to_id("<|image_pad|>") == 151655
    for offset, name in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(name) == FIRST_SPECIAL_ID + offset
    ids = tok.encode("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>").ids
    assert ids == [151644, 872, 198, 151652, 151655, 151653]
