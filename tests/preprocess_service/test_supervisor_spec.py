"""ServerSpec's llama-server command line: the image token bounds."""

from __future__ import annotations

from pathlib import Path

import pytest

from preprocess_service.supervisor import ServerSpec


def _spec(**kw) -> ServerSpec:
    return ServerSpec(
        binary=Path("llama-server"), model=Path("m.gguf"), mmproj=Path("mm.gguf"), port=1, **kw
    )


def _flag(argv: list[str], name: str) -> str | None:
    if name not in argv:
        return None
    assert argv.count(name) == 1, argv
    return argv[argv.index(name) + 1]


def test_image_token_bounds_unset_by_default() -> None:
    argv = _spec().argv()
    assert "--image-max-tokens" not in argv and "--image-min-tokens" not in argv


def test_image_max_tokens_is_passed() -> None:
    # jina-v4's default max_pixels 602112 -> 768 merged tokens (28 x 28 pixels each)
    argv = _spec(image_max_tokens=602112 // (28 * 28)).argv()
    assert _flag(argv, "--image-max-tokens") == "768"
    assert "--image-min-tokens" not in argv


def test_image_min_and_max_tokens_are_passed() -> None:
    argv = _spec(image_max_tokens=1280, image_min_tokens=4, extra_args=("--verbose",)).argv()
    assert _flag(argv, "--image-max-tokens") == "1280"
    assert _flag(argv, "--image-min-tokens") == "4"
    assert argv[-1] == "--verbose"  # extra arguments still come last


@pytest.mark.parametrize("field", ["image_max_tokens", "image_min_tokens"])
@pytest.mark.parametrize("value", [0, -5])
def test_non_positive_bounds_are_refused(field: str, value: int) -> None:
    with pytest.raises(ValueError, match=field):
        _spec(**{field: value})
