"""How a PIL image object becomes the RGB pixels the reference model sees.

Shared by the service (``patchify`` of PIL objects) and the client (which sends PIL images as
PNG): both must turn an image object into the same RGB values as the Hugging Face processor.
Image *files* are a different case, opened as the model's loader opens them
(``Image.open(...).convert("RGB")``): see ``preprocess_service/image.py``.
"""

from __future__ import annotations

from PIL import Image

from vlembed.errors import ImageError

__all__ = ["to_rgb"]


def to_rgb(image: Image.Image) -> Image.Image:
    """Convert any Pillow mode to RGB exactly as HF's ``convert_to_rgb`` does.

    HF's rule (transformers 5.x ``image_transforms.convert_to_rgb``), reproduced with the same
    Pillow calls so that the pixels are identical by construction:

    * alpha if ``"A"`` is one of ``image.getbands()`` or ``image.info["transparency"]`` is set
      (RGBA, LA, PA, P/L/RGB with a tRNS chunk or GIF transparency): convert to RGBA,
      ``alpha_composite`` onto opaque white, convert to RGB. Quirk kept on purpose: LAB's
      ``"A"`` band (the green-red axis) counts as alpha too, and Pillow's LAB -> RGBA carries
      LAB's hidden 4th byte as alpha. That byte is 255 in decoded files (no effect) but holds
      the old alpha of a LAB image converted from RGBA in memory, which then gets whitened.
    * otherwise ``image.convert("RGB")``: L, 1, P, CMYK, YCbCr, HSV, RGBX and premultiplied
      RGBa convert with Pillow's rules; I, I;16 and F are clipped to 0..255, not rescaled
      (a 16-bit grey PNG comes out mostly white -- as in HF).

    A plain RGB image without transparency is returned as is (HF copies it; same pixels).

    Raises:
        ImageError: Pillow cannot convert this mode (e.g. ``La``), which HF cannot either.
    """
    has_alpha = "A" in image.getbands() or image.info.get("transparency") is not None
    try:
        if has_alpha:
            rgba = image.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, rgba).convert("RGB")
        if image.mode == "RGB":
            return image
        return image.convert("RGB")
    except ValueError as exc:  # "conversion from La to RGB not supported"
        raise ImageError(f"unsupported image mode {image.mode!r}: {exc}") from exc
