"""Wire types of the embeddings API (OpenAI-compatible, plus Jina's fields). Pydantic only.

``to_jobs``/``to_options`` turn a request into the pipeline's internal types; image strings are
resolved separately (``inputs.py``) because that can mean I/O.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


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

Task = Literal[
    "retrieval.query", "retrieval.passage", "text-matching", "code.query", "code.passage"
]


class EmbeddingRequest(BaseModel):
    """POST /v1/embeddings. Unknown top-level fields are ignored, as OpenAI clients send extras."""

    input: str | list[InputItem] = Field(
        description="A string, a list of strings, or a list of items (text, image, content)."
    )
    model: str | None = Field(None, description="Ignored beyond a check that it is a string.")
    encoding_format: Literal["float", "base64"] | None = Field(
        None, description="OpenAI: float list or base64 of little-endian float32."
    )
    embedding_type: Literal["float", "base64", "binary", "ubinary"] | None = Field(
        None, description="Jina: float, base64, or sign bits packed MSB-first (int8/uint8)."
    )
    dimensions: int | None = Field(None, description="Matryoshka truncation (manifest dims).")
    user: str | None = None
    task: Task = Field("retrieval.query", description="Adapter and prompt role.")
    return_multivector: bool = Field(False, description="One projected row per token.")
    normalized: bool = Field(True, description="L2-normalise the output vectors.")
    truncate: bool = Field(False, description="Cut over-long texts instead of answering 413.")

    def resolved_embedding_type(self) -> str:
        if (
            self.embedding_type
            and self.encoding_format
            and self.embedding_type != self.encoding_format
        ):
            from preprocess_service.errors import InvalidInputError

            raise InvalidInputError(
                f"encoding_format {self.encoding_format!r} contradicts embedding_type "
                f"{self.embedding_type!r}",
                param="embedding_type",
            )
        return self.embedding_type or self.encoding_format or "float"


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str | list[int] | list[list[float]] | list[str] | list[list[int]]


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
    owned_by: str = "vlembed"
    tasks: list[str]
    dimensions: list[int]
    multi_vector_dim: int | None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
