"""``vlembed serve`` settings: one declaration gives a flag, its ``VLEMBED_*`` variable, its help.

Each field of :class:`ServeSettings` is read from ``VLEMBED_<NAME>`` (pydantic-settings) and can
be overridden on the command line as ``--<name>`` (underscores become dashes). Containers
configure the service with variables alone.
"""

from __future__ import annotations

import argparse
import typing
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from preprocess_service.supervisor import VISION_BATCH_TOKENS
from vlembed.constants import VARIANTS

AutoOnOff = Literal["auto", "on", "off"]


def _in_container() -> bool:
    return Path("/.dockerenv").exists()


class ServeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VLEMBED_", extra="ignore")

    model: str | None = Field(
        None,
        description="converted directory (manifest.json), a HF checkpoint directory or a Hugging "
        "Face repo id (converted once, cached); default: a tiny random checkpoint (smoke test)",
    )
    host: str = Field(
        default_factory=lambda: "0.0.0.0" if _in_container() else "127.0.0.1",
        description="address to listen on",
    )
    port: int = Field(8000, description="port to listen on")
    backends: typing.Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="use running llama-servers instead of starting them: [TASK=]URL, repeatable "
        "(VLEMBED_BACKENDS: comma-separated)",
    )
    api_key: str | None = Field(None, description="require Authorization: Bearer KEY")
    parallel: int = Field(2, description="slots per llama-server")
    threads: int | None = Field(None, description="threads per llama-server")
    variant: Literal[VARIANTS] | None = Field(  # type: ignore[valid-type]
        None, description=f"text GGUF variant ({', '.join(VARIANTS)}); default: the converted dtype"
    )
    tasks: str | None = Field(
        None, description="comma-separated tasks to serve (default: all in the manifest)"
    )
    ctx_size: int = Field(4096, description="context per slot (tokens); also the batch size")
    max_queue: int = Field(
        256, description="inputs in flight before a request that does not fit gets 429"
    )
    max_items: int = Field(2048, description="inputs per request")
    max_text_chars: int = Field(200_000, description="characters per text (unless truncate)")
    max_image_bytes: int = Field(32 << 20, description="encoded bytes per image")
    max_body_bytes: int = Field(256 << 20, description="bytes per request body")
    body_timeout: float = Field(30.0, description="seconds a request body may stall")
    request_timeout: float = Field(120.0, description="seconds per request, all items together")
    hang_timeout: float = Field(
        60.0,
        description="seconds a local llama-server may leave /health unanswered before it is "
        "killed and restarted (one that answers no embedding request for 90%% of the request "
        "timeout is restarted too)",
    )
    max_connections: int = Field(
        1024, description="open client connections; more are answered 503 at once"
    )
    allow_url_fetch: bool = Field(False, description="fetch http(s) image URLs")
    allow_file_dir: Path | None = Field(
        None, description="serve file:// image paths inside this directory"
    )
    flash_attn: AutoOnOff = Field(
        "auto",
        description="flash attention in the language model; auto: off for the f32 (parity) "
        "variant, on otherwise (costs ~7e-6 of row cosine). The vision tower always uses it",
    )
    mmproj_variant: str = Field(
        "auto",
        description="vision tower GGUF variant; auto: f32 for the f32 variant, else the one named "
        "like the text variant if converted (--mmproj-quant), else bf16, f16, f32",
    )
    vision_batch_tokens: int = Field(
        VISION_BATCH_TOKENS,
        description="encode the images of concurrent requests (any sizes) in one vision forward, "
        "up to this many image tokens (a 448x448 image is 256, a 1275x1650 page 744); 1 turns "
        "it off. Measured on 2 CPU cores: see docs/BENCHMARKS.md (batched vision encoding)",
    )
    patch_transport: Literal["auto", "f32"] = Field(
        "auto",
        description="how image patches go to llama-server; auto: uint8 pixels and a lookup table "
        "in a binary VLP1 body (1.75 MB per page) where the server reads it, else f32: base64 "
        "float32 rows in JSON (18.7 MB per page); both give bit-identical rows",
    )
    repack: AutoOnOff = Field(
        "auto",
        description="llama.cpp CPU weight repacking; auto: off for K-quant and IQ variants, whose "
        "tiled VNNI kernels only run on weights that are not repacked (1.55x text measured)",
    )
    index: Path | None = Field(
        None,
        description="serve POST /v1/search and the search page at / over this document index "
        "(built by vlembed index with the same model; opened read-only)",
    )
    log_level: str = Field("info", description="log level")

    @field_validator("backends", mode="before")
    @classmethod
    def _split_backends(cls, value: object) -> object:
        if isinstance(value, str):
            return [b.strip() for b in value.split(",") if b.strip()]
        return value


def build_parser(defaults: ServeSettings) -> argparse.ArgumentParser:
    """One flag per setting; its default is the variable's value (or the declared default)."""
    p = argparse.ArgumentParser(
        prog="vlembed serve", description="run the embeddings API (and its llama-servers)"
    )
    for name, field in ServeSettings.model_fields.items():
        flag = "--" + ("backend" if name == "backends" else name.replace("_", "-"))
        env = f"VLEMBED_{name.upper()}"
        help_text = f"{field.description} [{env}]"
        value = getattr(defaults, name)
        annotation = field.annotation
        if annotation is bool:
            p.add_argument(
                flag,
                dest=name,
                action=argparse.BooleanOptionalAction,
                default=value,
                help=help_text,
            )
        elif name == "backends":
            p.add_argument(
                flag, dest=name, action="append", metavar="[TASK=]URL", default=None, help=help_text
            )
        else:
            choices = _choices(annotation)
            kind = _scalar_type(annotation)
            p.add_argument(
                flag, dest=name, type=kind, default=value, choices=choices, help=help_text
            )
    return p


def _choices(annotation: object) -> tuple | None:
    """The values of a ``Literal`` (or optional ``Literal``) setting, for argparse."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    inner = args[0] if typing.get_origin(annotation) is not Literal and args else annotation
    return typing.get_args(inner) if typing.get_origin(inner) is Literal else None


def _scalar_type(annotation: object) -> type:
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    kind = args[0]
    if typing.get_origin(kind) is Literal:
        return str
    return kind if kind in (int, float, Path) else str


def parse_settings(argv: list[str] | None = None) -> ServeSettings:
    """Variables first, then flags over them; validated once, as the settings model."""
    defaults = ServeSettings()
    args = build_parser(defaults).parse_args(argv)
    values = vars(args)
    if values["backends"] is None:
        values["backends"] = defaults.backends
    return ServeSettings.model_validate(values)
