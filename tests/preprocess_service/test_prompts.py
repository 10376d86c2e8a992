"""The service's prompts must be the reference's, character for character."""

from eval import reference
from preprocess_service.prompts import (
    TASKS,
    content_prompt,
    image_prompt,
    text_prompt,
)


def test_text_prompts_match_reference() -> None:
    for name, (task, role) in TASKS.items():
        want = reference.text_prefix(task, role) + "x"
        assert text_prompt("x", task, role).text == want, name
    assert text_prompt("x", "text-matching", "passage").text == "Query: x"


def test_image_prompt_matches_reference_with_vision_block() -> None:
    block = reference.VISION_START + reference.IMAGE_PAD + reference.VISION_END
    marker = "<M>"
    ours = image_prompt(marker).text.replace(marker, "<|vision_start|><|image_pad|><|vision_end|>")
    assert ours == reference.IMAGE_PROMPT.format(vision=block)
    assert image_prompt(marker).pool == "vision"


def test_content_prompts() -> None:
    p = content_prompt(["a ", None, " b"], "<M>")
    assert p.text == reference.CONTENT_PROMPT.format(parts="a <M> b") and p.pool == "all"
    assert content_prompt([None, None], "<M>").pool == "vision"
    assert content_prompt([None], "<M>") == image_prompt("<M>")
