"""ferry's errors: one exception class per ferry status code, all under :class:`ferry.Error`.

Each carries ferry's own message (``str(e)``), the numeric ``code`` and its ``code_name``. Where a
Python built-in exception means the same thing, the class derives from it too, so ``except
TimeoutError`` or ``except ConnectionError`` work as one would expect.
"""

from __future__ import annotations


class Error(Exception):
    """A ferry call failed; ``str(e)`` is ferry's message."""

    code: int
    code_name: str

    def __init__(self, message: str, code: int = 10, code_name: str = "Internal") -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.code_name = code_name


class InvalidArgument(Error, ValueError):
    """The caller passed something ferry cannot use (a tensor it cannot reach, a bad index)."""


class NotFound(Error, LookupError):
    """No such buffer, region, event or file."""


class PermissionDenied(Error, PermissionError):
    """Peer credentials or file modes refused it."""


class ResourceExhausted(Error):
    """The pool, a ring or the client's quota is full: free something or retry later."""


class Unavailable(Error, ConnectionError):
    """ferryd is not there or went away."""


class Timeout(Error, TimeoutError):
    """A wait ran out."""


class ProtocolError(Error):
    """A peer broke ferry's wire protocol."""


class DeviceError(Error):
    """The GPU or its driver failed."""


class NotSupported(Error):
    """Not built in, not on this backend, or memory ferryd cannot reach (see the message)."""


class InternalError(Error):
    """A bug in ferry."""


class Aborted(Error):
    """The operation was cancelled: the client was closed or its session ended."""


_BY_CODE: dict[int, type[Error]] = {
    1: InvalidArgument,
    2: NotFound,
    3: PermissionDenied,
    4: ResourceExhausted,
    5: Unavailable,
    6: Timeout,
    7: ProtocolError,
    8: DeviceError,
    9: NotSupported,
    10: InternalError,
    11: Aborted,
}


def error_class(code: int) -> type[Error]:
    """The exception class for a ferry status code (the extension raises through this)."""
    return _BY_CODE.get(code, Error)
