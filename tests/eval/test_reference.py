import numpy as np
import pytest
from PIL import Image

from eval.reference import ReferenceEmbedder


def _image(w: int, h: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))


def test_tasks_give_different_vectors(tiny_reference: ReferenceEmbedder) -> None:
    vecs = {}
    for task in tiny_reference.tasks:
        tiny_reference.set_task(task)
        vecs[task] = tiny_reference.encode_text("a short query", "query").single
    assert set(vecs) == {"retrieval", "text-matching", "code"}
    for a in vecs:
        for b in vecs:
            if a < b:
                assert float(vecs[a] @ vecs[b]) < 0.99


def test_deterministic(tiny_reference: ReferenceEmbedder) -> None:
    img = _image(100, 80)
    a = tiny_reference.encode_content(["text ", img])
    b = tiny_reference.encode_content(["text ", img])
    assert np.array_equal(a.rows, b.rows)


def test_text_prompts(tiny_reference: ReferenceEmbedder) -> None:
    q = tiny_reference.encode_text("hello", "query")
    p = tiny_reference.encode_text("hello", "passage")
    assert tiny_reference.tokenizer.decode(q.token_ids) == "Query: hello"
    assert tiny_reference.tokenizer.decode(p.token_ids) == "Passage: hello"
    assert (q.pool_start, q.pool_end) == (0, len(q.token_ids))
    assert abs(float(np.linalg.norm(q.single)) - 1) < 1e-5
    tiny_reference.set_task("text-matching")
    assert tiny_reference.encode_text("hello", "passage").token_ids == q.token_ids


def test_image_pools_the_vision_span(tiny_reference: ReferenceEmbedder) -> None:
    enc = tiny_reference.encode_image(_image(56 * 3, 56 * 2))
    ids = enc.token_ids
    assert ids[enc.pool_start] == 151652 and ids[enc.pool_end - 1] == 151653
    assert int(enc.image_token_mask.sum()) == 3 * 2 * 4  # (168/28) * (112/28)
    expected = enc.rows[enc.pool_start : enc.pool_end].mean(0)
    np.testing.assert_allclose(enc.single, expected / np.linalg.norm(expected), atol=1e-6)
    assert tiny_reference.tokenizer.decode(ids[enc.pool_end :], skip_special_tokens=False) == (
        "Describe the image.<|im_end|>\n"
    )


def test_multivector_and_matryoshka(tiny_reference: ReferenceEmbedder) -> None:
    enc = tiny_reference.encode_text("multi vector rows", "passage")
    assert enc.multi is not None and enc.multi.shape == (len(enc.token_ids), 32)
    np.testing.assert_allclose(np.linalg.norm(enc.multi, axis=1), 1.0, atol=1e-5)
    t = enc.truncated(64)
    assert t.shape == (64,) and abs(float(np.linalg.norm(t)) - 1) < 1e-5
    np.testing.assert_allclose(enc.truncated(128), enc.single, atol=1e-6)


def test_interleaved_and_two_images(tiny_reference: ReferenceEmbedder) -> None:
    a, b = _image(60, 90, 1), _image(120, 40, 2)
    mixed = tiny_reference.encode_content(["before ", a, " between ", b, " after"])
    assert (mixed.pool_start, mixed.pool_end) == (0, len(mixed.token_ids))
    images_only = tiny_reference.encode_content([a, b])
    ids = images_only.token_ids
    assert ids[images_only.pool_start] == 151652 and ids[images_only.pool_end - 1] == 151653
    assert ids.count(151652) == 2
    single = tiny_reference.encode_content([a])
    assert np.array_equal(single.rows, tiny_reference.encode_image(a).rows)


def test_plain_checkpoint_equals_merged_retrieval(
    tiny_plain_checkpoint, tiny_reference: ReferenceEmbedder
) -> None:
    plain = ReferenceEmbedder(tiny_plain_checkpoint)
    assert plain.tasks == () and plain.projector is None
    a = plain.encode_text("hello world", "query")
    b = tiny_reference.encode_text("hello world", "query")
    assert a.multi is None
    # the plain layout stores the merged weights in bf16, hence not bit-equal
    assert float(a.single @ b.single) > 0.9999


def test_unknown_task(tiny_reference: ReferenceEmbedder) -> None:
    with pytest.raises(ValueError, match="unknown task"):
        tiny_reference.set_task("summarisation")
