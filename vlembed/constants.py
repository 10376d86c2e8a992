"""Geometry, special tokens and GGUF variants shared by every stage; no other module spells them.

Values of jina-embeddings-v4 / Qwen2.5-VL that a converted model does not carry per model. The
per-model values a converted model does carry (pixel limits, dims, prompts) are read from its
manifest at run time; the defaults here are what the converter writes into it.
"""

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

# --- Qwen2.5-VL special tokens: ids follow the 151643 BPE tokens, in this order ---
FIRST_SPECIAL_ID = 151643
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
SPECIAL_TOKEN_IDS: dict[str, int] = {t: FIRST_SPECIAL_ID + i for i, t in enumerate(SPECIAL_TOKENS)}
ENDOFTEXT_ID = SPECIAL_TOKEN_IDS["<|endoftext|>"]  # 151643: bos and pad
IM_END_ID = SPECIAL_TOKEN_IDS["<|im_end|>"]  # 151645: eos
VISION_START_ID = SPECIAL_TOKEN_IDS["<|vision_start|>"]
VISION_END_ID = SPECIAL_TOKEN_IDS["<|vision_end|>"]
VISION_PAD_ID = SPECIAL_TOKEN_IDS["<|vision_pad|>"]
IMAGE_PAD_ID = SPECIAL_TOKEN_IDS["<|image_pad|>"]  # 151655
VIDEO_PAD_ID = SPECIAL_TOKEN_IDS["<|video_pad|>"]
VOCAB_SIZE = 151936  # embedding rows of Qwen2.5-VL (the vocabulary padded to a multiple of 128)

# --- GGUF variants: what the converter writes and ``serve --variant`` picks from ---
DTYPES: tuple[str, ...] = ("f32", "f16", "bf16")
QUANT_TYPES: tuple[str, ...] = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0", "IQ4_XS", "IQ4_NL")
# llama-quantize aborts on a vision tower at the IQ types: their per-tensor rules ask the text
# model's hyper-parameters (heads per layer), which a clip file does not have.
MMPROJ_QUANT_TYPES: tuple[str, ...] = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0")
VARIANTS: tuple[str, ...] = DTYPES + QUANT_TYPES
