"""ferry: host<->GPU copies through ferryd, the node's transfer daemon, from Python.

    import torch, ferry
    with ferry.Client() as client:
        x = client.empty((4096, 4096), torch.float16)   # in ferryd's pinned pool, zero-copy
        y = torch.empty_like(x, device="cuda")
        client.copy_(y, x, stream=torch.cuda.current_stream())  # a DMA, ordered on the stream

See :class:`Client` for the API; ``python -m ferry.bench --help`` for the benchmarks.
"""

from ._errors import (Aborted, DeviceError, Error, InternalError, InvalidArgument, NotFound, NotSupported,
                      PermissionDenied, ProtocolError, ResourceExhausted, Timeout, Unavailable)
from ._ferry import __version__, built_with_cuda, default_socket
from .client import LATENCY_MAX_BYTES, Client, Event, Transfer

__all__ = [
    "Aborted", "Client", "DeviceError", "Error", "Event", "InternalError", "InvalidArgument", "LATENCY_MAX_BYTES",
    "NotFound", "NotSupported", "PermissionDenied", "ProtocolError", "ResourceExhausted", "Timeout", "Transfer",
    "Unavailable", "__version__", "built_with_cuda", "default_socket",
]
