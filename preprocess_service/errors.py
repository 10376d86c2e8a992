"""Typed exceptions of vlembed; every stage raises these and only the API maps them to HTTP.

Hierarchy::

    VlembedError                 base of everything vlembed raises on purpose
     └── InvalidInputError       the request is at fault (a 4xx answer)
          └── ImageError         image bytes or geometry we cannot or will not process

Programming errors (bad arguments from our own code) stay plain ``ValueError``/``TypeError``
so that they surface as 500s instead of being blamed on the client.
"""

from __future__ import annotations

__all__ = ["ImageError", "InvalidInputError", "VlembedError"]


class VlembedError(Exception):
    """Base class of all deliberate vlembed errors."""


class InvalidInputError(VlembedError):
    """The client sent something we refuse to process; answered with a 4xx status."""


class ImageError(InvalidInputError):
    """An image cannot be decoded, is too large, or has an unsupported mode or geometry."""
