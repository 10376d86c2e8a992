"""Geometry, token ids and prompts shared by every stage; no other module spells these numbers."""

from __future__ import annotations

# --- image geometry (Qwen2-VL image processor, one still image) ---
PATCH_SIZE = 14
TEMPORAL_PATCH_SIZE = 2
MERGE_SIZE = 2
RESIZE_FACTOR = PATCH_SIZE * MERGE_SIZE  # 28: both sides of a resized image are multiples
PATCH_DIM = 3 * TEMPORAL_PATCH_SIZE * PATCH_SIZE * PATCH_SIZE  # 1176
MIN_PIXELS = 3136  # 4 merged tokens
MAX_PIXELS = 602112  # 768 merged tokens (jina-embeddings-v4 default)
MAX_ASPECT_RATIO = 200
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP, as Qwen2-VL uses
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)
RESCALE_FACTOR = 1 / 255  # uint8 -> [0, 1] before mean/std, HF's `rescale_factor`
HALF_PATCH_DIM = PATCH_DIM // TEMPORAL_PATCH_SIZE  # 588: one temporal half [C, 14, 14] of a row

# --- image decoding limits (the bytes come from clients) ---
# Checked on the header, before any pixel is decoded. 2**26 (e.g. 8192 x 8192) admits a 600 dpi
# A4 scan (35 MP) and 50 MP photos, keeps the RGBA working set under ~1 GB, and stays below
# Pillow's own warning threshold (Image.MAX_IMAGE_PIXELS, ~89.5 MP).
MAX_DECODED_PIXELS = 1 << 26
# Pillow plugins the service opens; the rest (EPS runs Ghostscript, PSD, ICNS, ...) are refused.
IMAGE_FORMATS = ("AVIF", "BMP", "GIF", "JPEG", "MPO", "PNG", "TIFF", "WEBP")

# --- Qwen2.5-VL special token ids ---
ENDOFTEXT_ID = 151643
IM_START_ID = 151644
IM_END_ID = 151645
VISION_START_ID = 151652
VISION_END_ID = 151653
IMAGE_PAD_ID = 151655
