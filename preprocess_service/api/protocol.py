"""Wire types of the embeddings API (OpenAI-compatible, plus Jina's fields). Pydantic only.

``validate.py`` turns a parsed request into the pipeline's input; the response models here are
what the routes return, so the OpenAPI schema is the wire format.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from vlembed.tasks import ApiTask


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextInput(_Strict):
    text: str = Field(description="A text; embedded with the task's query/passage prefix.")


class ImageInput(_Strict):
    image: str = Field(
        description="A data URI, raw base64, an http(s) URL (when the server allows fetching) "
        "or a file:// path (inside the server's allowed directory)."
    )


class ImageURL(_Strict):
    url: str
    detail: str | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ImageURLPart(_Strict):
    type: Literal["image_url"]
    image_url: ImageURL | str


ContentPart = Annotated[TextPart | ImageURLPart, Field(discriminator="type")]


class ContentInput(_Strict):
    content: list[ContentPart] = Field(
        description="Interleaved text and images, embedded as ONE prompt."
    )


InputItem = str | TextInput | ImageInput | ContentInput | list[ContentPart]


class EmbeddingRequest(BaseModel):
    """POST /v1/embeddings. Unknown top-level fields are ignored, as OpenAI clients send extras."""

    input: str | list[InputItem] = Field(
        description="A string, a list of strings, or a list of items (text, image, content)."
    )
    model: str | None = Field(None, description="Ignored beyond a check that it is a string.")
    encoding_format: Literal["float", "base64"] | None = Field(
        None,
        description="Transport: JSON numbers, or base64 of the little-endian numbers (a "
        "multi-vector is one string of its rows, row-major).",
    )
    embedding_type: Literal["float", "base64", "binary", "ubinary"] | None = Field(
        None,
        description="Numeric type: float32, or sign bits packed MSB-first as int8 (binary) or "
        "uint8 (ubinary). Jina's older 'base64' means float32 sent as base64.",
    )
    dimensions: int | None = Field(None, description="Matryoshka truncation (manifest dims).")
    user: str | None = None
    task: ApiTask = Field("retrieval.query", description="Adapter and prompt role.")
    return_multivector: bool = Field(False, description="One projected row per token.")
    return_single_vector: bool = Field(
        False,
        description="vlembed extension, with return_multivector: also each input's single "
        "vector (full width) in single_embedding, from the same forward pass; a document "
        "index needs both and pays for one.",
    )
    normalized: bool = Field(True, description="L2-normalise the output vectors.")
    truncate: bool = Field(False, description="Cut over-long texts instead of answering 413.")
    late_chunking: bool = Field(
        False, description="Jina's late chunking; not supported here (true is refused with 400)."
    )


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str | list[int] | list[list[float]] | list[str] | list[list[int]]
    single_embedding: list[float] | str | list[int] | None = Field(
        None, description="Only with return_single_vector: the input's single vector."
    )


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "vlembed"
    revision: str | None = Field(None, description="Fingerprint of the converted checkpoint.")
    min_pixels: int | None = Field(None, description="Smallest resized image area (pixels).")
    max_pixels: int | None = Field(
        None, description="Largest resized image area: larger images are resized down to it."
    )
    tasks: list[str]
    dimensions: list[int]
    multi_vector_dim: int | None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
