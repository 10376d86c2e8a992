"""Typed exceptions of vlembed: the server side raises the tree below (only the API maps it to
HTTP, in ``preprocess_service/api/errors.py``); the client raises ``ServiceError``.

Hierarchy (HTTP status in brackets, mapped once in ``api/errors.py``)::

    VlembedError                      base of everything vlembed raises on purpose
     ├── InvalidInputError [400]      the request is at fault
     │    ├── ImageError [400]        image bytes or geometry we cannot or will not process
     │    └── InputTooLargeError [413] over the context / size budget
     ├── AuthenticationError [401]    missing or wrong API key
     ├── OverloadedError [429]        the bounded queue is full; retry later
     └── BackendError [502]           llama-server answered something we cannot use
          ├── BackendUnavailableError [503]  no healthy backend (crashed, restarting, down)
          └── BackendTimeoutError [504]      the backend did not answer within the deadline

Programming errors (bad arguments from our own code) stay plain ``ValueError``/``TypeError``
so that they surface as 500s instead of being blamed on the client.
"""

from __future__ import annotations

__all__ = [
    "AuthenticationError",
    "BackendError",
    "BackendTimeoutError",
    "BackendUnavailableError",
    "ImageError",
    "InputTooLargeError",
    "InvalidInputError",
    "OverloadedError",
    "ServiceError",
    "VlembedError",
]


class VlembedError(Exception):
    """Base class of all deliberate vlembed errors."""

    #: the request field at fault, when known (OpenAI error ``param``)
    param: str | None = None

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class InvalidInputError(VlembedError):
    """The client sent something we refuse to process; answered with a 4xx status."""


class ImageError(InvalidInputError):
    """An image cannot be decoded, is too large, or has an unsupported mode or geometry."""


class InputTooLargeError(InvalidInputError):
    """An input needs more tokens (or bytes) than the service accepts."""


class AuthenticationError(VlembedError):
    """Missing or wrong bearer token."""


class OverloadedError(VlembedError):
    """Too many items in flight; the client should retry after ``retry_after`` seconds."""

    def __init__(self, message: str, *, retry_after: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BackendError(VlembedError):
    """llama-server failed in a way that is not the client's fault."""


class BackendUnavailableError(BackendError):
    """No backend can take the request now (crashed and restarting, or unreachable)."""

    def __init__(self, message: str, *, retry_after: float = 2.0) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class BackendTimeoutError(BackendError):
    """The backend did not answer within the request deadline."""


class ServiceError(RuntimeError):
    """Client side: the service could not be reached or answered with an error.

    Raised by :class:`vlembed.Client` (and what uses it: eval, bench, the index); not part of
    the server's tree above, because it describes a failed call, not a refused input.

    Attributes:
        status: HTTP status, or ``None`` when no response arrived.
        error_type: ``error.type`` of an OpenAI-shaped error body, if any.
        code: ``error.code`` of an OpenAI-shaped error body, if any.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        error_type: str | None = None,
        code: str | int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.error_type = error_type
        self.code = code
