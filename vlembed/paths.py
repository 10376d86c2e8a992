"""Where vlembed keeps what it builds and downloads: one cache root, outside any repository.

``$VLEMBED_CACHE`` (default ``~/.cache/vlembed``) holds the llama.cpp sources and builds
(hundreds of MB), converted models and llama-server logs.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_root", "logs_dir", "models_dir"]


def cache_root() -> Path:
    """``$VLEMBED_CACHE``, else ``~/.cache/vlembed``."""
    env = os.environ.get("VLEMBED_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "vlembed"


def models_dir() -> Path:
    """Converted models (and the checkpoints they were made from, when vlembed made them)."""
    return cache_root() / "models"


def logs_dir() -> Path:
    """Logs of the llama-servers ``vlembed serve`` starts."""
    return cache_root() / "logs"
