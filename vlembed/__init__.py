"""vlembed: jina-embeddings-v4 style multimodal embeddings served on a patched llama.cpp.

The package is the project's public face and its contract: the client (:class:`Client`), the
document index (:class:`Index`, needs the ``index`` extra), the ``vlembed`` command line, and the
values every stage agrees on (``vlembed.tasks``, ``vlembed.constants``, ``vlembed.manifest``,
``vlembed.wire``, ``vlembed.errors``, ``vlembed.paths``). It imports nothing else of the
project, so everything else may import it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vlembed.client import Client
from vlembed.errors import ServiceError

if TYPE_CHECKING:
    from vlembed.index import Index

__all__ = ["Client", "Index", "ServiceError", "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # the index pulls in lancedb and pypdfium2 (an extra): load it only when asked for
    if name == "Index":
        from vlembed.index import Index

        return Index
    raise AttributeError(f"module 'vlembed' has no attribute {name!r}")
