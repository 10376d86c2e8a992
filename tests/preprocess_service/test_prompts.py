"""The service's prompts must be the reference's, character for character."""

import pytest

from eval import reference
from preprocess_service.prompts import content_prompt, image_prompt, text_prompt
from vlembed.errors import InvalidInputError
from vlembed.tasks import TASKS


def test_text_prompts_match_reference() -> None:
    for name, (task, role) in TASKS.items():
        want = reference.text_prefix(task, role) + "x"
        assert text_prompt("x", task, role).for_backend("<M>") == want, name
    assert text_prompt("x", "text-matching", "passage").for_backend("<M>") == "Query: x"


def test_image_prompt_matches_reference_with_vision_block() -> None:
    block = reference.VISION_START + reference.IMAGE_PAD + reference.VISION_END
    ours = image_prompt().for_backend("<|vision_start|><|image_pad|><|vision_end|>")
    assert ours == reference.IMAGE_PROMPT.format(vision=block)
    assert image_prompt().pool == "vision" and image_prompt().n_images == 1


def test_content_prompts() -> None:
    p = content_prompt(["a ", None, " b"])
    assert p.for_backend("<M>") == reference.CONTENT_PROMPT.format(parts="a <M> b")
    assert p.pool == "all"
    assert content_prompt([None, None]).pool == "vision"
    assert content_prompt([None]) == image_prompt()


def test_counted_text_has_the_vision_wrap_per_image() -> None:
    p = content_prompt([None, "x", None])
    assert p.counted_text().count("<|vision_start|><|vision_end|>") == 2


def test_client_text_cannot_become_an_image_slot() -> None:
    p = text_prompt("a \x00image\x00 b {} <M>", "retrieval", "query")
    assert p.n_images == 0
    with pytest.raises(InvalidInputError, match="must not contain") as info:
        p.for_backend("<M>", param="input[2]")
    assert info.value.param == "input[2]"
    assert "{}" in content_prompt(["{}", None]).for_backend("<X>")
