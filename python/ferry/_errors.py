"""ferry's errors: one exception class per ferry status code, all under :class:`ferry.Error`.

Each carries ferry's own message (``str(e)``), the numeric ``code`` and its ``code_name``. Where a
Python built-in exception means the same thing, the class derives from it too, so ``except
TimeoutError`` or ``except ConnectionError`` work as one would expect.
"""

from __future__ import annotations

from typing import Optional


class Error(Exception):
    """A ferry call failed; ``str(e)`` is ferry's message.

    ``code`` and ``code_name`` default to the class's own (what the Python side raises), and are
    ferry's status code where the extension raises.
    """

    code: int = 10
    code_name: str = "Internal"

    def __init__(self, message: str, code: Optional[int] = None, code_name: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = type(self).code if code is None else code
        self.code_name = type(self).code_name if code_name is None else code_name


class InvalidArgument(Error, ValueError):
    """The caller passed something ferry cannot use (a tensor it cannot reach, a bad index)."""

    code = 1
    code_name = "InvalidArgument"


class NotFound(Error, LookupError):
    """No such buffer, region, event or file."""

    code = 2
    code_name = "NotFound"


class PermissionDenied(Error, PermissionError):
    """Peer credentials or file modes refused it."""

    code = 3
    code_name = "PermissionDenied"


class ResourceExhausted(Error):
    """The pool, a ring or the client's quota is full: free something or retry later."""

    code = 4
    code_name = "ResourceExhausted"


class Unavailable(Error, ConnectionError):
    """ferryd is not there or went away."""

    code = 5
    code_name = "Unavailable"


class Timeout(Error, TimeoutError):
    """A wait ran out."""

    code = 6
    code_name = "Timeout"


class ProtocolError(Error):
    """A peer broke ferry's wire protocol."""

    code = 7
    code_name = "Protocol"


class DeviceError(Error):
    """The GPU or its driver failed."""

    code = 8
    code_name = "Device"


class NotSupported(Error):
    """Not built in, not on this backend, or memory ferryd cannot reach (see the message)."""

    code = 9
    code_name = "NotSupported"


class InternalError(Error):
    """A bug in ferry."""

    code = 10
    code_name = "Internal"


class Aborted(Error):
    """The operation was cancelled: the client was closed or its session ended."""

    code = 11
    code_name = "Aborted"


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
