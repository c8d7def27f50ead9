"""ferry's Python client: torch tensors and numpy arrays in, libferry copies out.

A :class:`Client` is a session with ferryd. Host tensors it makes (:meth:`Client.empty`) live in
ferryd's pinned pool, so a copy between them and a CUDA tensor is a DMA with no copy of the data
on either side. Pageable tensors go through :meth:`Client.copy_staged_`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal, Optional, Sequence, Union

from . import _ferry
from ._errors import InvalidArgument

if TYPE_CHECKING:
    import numpy
    import torch

Priority = Literal["auto", "bulk", "latency"]
_PRIORITIES = ("auto", "bulk", "latency")
#: "auto" copies of at most this many bytes go in ferry's latency class, larger ones as bulk.
LATENCY_MAX_BYTES = 64 << 10

Stream = Union["torch.cuda.Stream", int, None]
Array = Union["torch.Tensor", "numpy.ndarray"]


def _torch() -> Any:
    import torch

    return torch


class Event:
    """An interprocess event shared with ferryd (from :meth:`Client.event`).

    Record it on the stream of the kernel that produces a tensor, then pass it as ``after=``: the
    copy starts on the GPU once the stream reaches the record, with no host round trip. A
    ``torch.cuda.Event`` works as ``after=`` too; a ferry event saves the relay that takes.

    A copy waits for the event's latest record before the copy was submitted, counted by
    number: record one event on one stream, from one thread at a time (use an event per stream).
    """

    __slots__ = ("_event", "_client")

    def __init__(self, event: _ferry.Event, client: "Client") -> None:
        self._event = event
        self._client = client

    def record(self, stream: Stream = None) -> None:
        """Records the event on ``stream`` (default: torch's current stream)."""
        self._event.record(self._client._stream_handle(stream))


class Transfer:
    """One submitted copy: wait for it on the host, poll it, or make a CUDA stream wait for it."""

    __slots__ = ("_transfer", "_client")

    def __init__(self, transfer: _ferry.Transfer, client: "Client") -> None:
        self._transfer = transfer
        self._client = client

    def wait(self, timeout: Optional[float] = None, *, spin: bool = False) -> None:
        """Blocks until the copy is done (the GIL is released meanwhile).

        By default the thread sleeps through most of a long copy and spins across the moment it
        may land. ``spin=True`` polls the whole time instead, keeping a core busy for the copy's
        length, as a spinning ``torch.cuda.synchronize()`` does: after a long copy it returns
        tens of microseconds sooner (a thread that slept starts cold). Raises
        :class:`ferry.Timeout` if ``timeout`` seconds pass first, or the copy's error.
        """
        self._transfer.wait(timeout, spin)

    def done(self) -> bool:
        """True once the copy is done; raises its error if it failed."""
        return self._transfer.done()

    def stream_wait(self, stream: Stream = None) -> None:
        """Makes ``stream`` (default: torch's current stream) wait for the copy on the GPU.

        Returns at once; work queued on the stream afterwards sees the copied bytes. Bulk copies
        can be waited for this way (ferryd signals their completion on the GPU); a latency-class
        copy cannot, unless it was made with ``stream=``. On the host backend this waits on the
        host.
        """
        self._transfer.stream_wait(self._client._stream_handle(stream))

    @property
    def nbytes(self) -> int:
        """Bytes the copy moves."""
        return self._transfer.nbytes

    @property
    def latency_ns(self) -> int:
        """Nanoseconds from submission to completion, as the host saw them (0 until done)."""
        return self._transfer.latency_ns


def _describe(x: Any, what: str) -> tuple[int, bool, int, int]:
    """(address, is_cuda, nbytes, cuda device index or -1) of a contiguous tensor or array."""
    if hasattr(x, "data_ptr"):  # a torch.Tensor, without importing torch for numpy users
        if not x.is_contiguous():
            raise InvalidArgument(
                f"{what} is not contiguous: ferry copies one contiguous range of memory; "
                "call .contiguous() first, or copy a contiguous slice"
            )
        cuda = x.is_cuda
        return x.data_ptr(), cuda, x.element_size() * x.numel(), x.get_device() if cuda else -1
    interface = getattr(x, "__array_interface__", None)
    if interface is not None:
        if not x.flags.c_contiguous:
            raise InvalidArgument(f"{what} is not C-contiguous: use numpy.ascontiguousarray() first")
        return interface["data"][0], False, x.nbytes, -1
    raise InvalidArgument(f"{what} must be a torch.Tensor or a numpy.ndarray, not {type(x).__name__}")


def _shape(shape: Union[int, Sequence[int]]) -> tuple[int, ...]:
    """A shape as a tuple of sizes >= 0 (ferry.InvalidArgument otherwise)."""
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    for d in dims:
        if not isinstance(d, int) or isinstance(d, bool) or d < 0:
            raise InvalidArgument(f"shape {shape!r}: every size must be an int >= 0")
    return dims


def _block_indices(x: Any, what: str) -> "numpy.ndarray":
    import numpy

    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    a = numpy.asarray(x)
    if a.ndim != 1:
        raise InvalidArgument(f"{what} must be one-dimensional, not of shape {tuple(a.shape)}")
    if a.size and a.dtype.kind not in "iu":
        raise InvalidArgument(f"{what} must hold integers, not {a.dtype}")
    if a.size:
        bad = numpy.flatnonzero((a < 0) | (a > 0xFFFFFFFF))
        if bad.size:
            raise InvalidArgument(f"{what}[{bad[0]}] = {a[bad[0]]} is not a block index (0 to 2**32 - 1)")
    return numpy.ascontiguousarray(a, dtype=numpy.uint32)


def _device_index(device: Union[None, int, str, "torch.device"]) -> Optional[int]:
    """The ordinal ``device`` names: an int, ``"cuda:N"``/``"cuda"`` or a ``torch.device``; None: current."""
    if device is None:
        return None
    if isinstance(device, bool):
        raise InvalidArgument(f"device must be a GPU ordinal or a CUDA device, not {device!r}")
    if isinstance(device, int):
        return device
    kind = getattr(device, "type", None)
    index = getattr(device, "index", None)
    if kind is None and isinstance(device, str):
        kind, _, rest = device.partition(":")
        index = int(rest) if rest.isdigit() else None
        if rest and index is None:
            raise InvalidArgument(f"device {device!r} is not cuda or cuda:N")
    if kind != "cuda":
        raise InvalidArgument(f"device must be a CUDA device (cuda:N), not {device!r}")
    return index


class Client:
    """A session with ferryd; also a context manager that closes it.

    ``socket``: ferryd's control socket (default ``$FERRY_SOCKET``, else /run/ferry/ferryd.sock);
    ``name``: how ferryd's logs and metrics call this client (default: the program's name);
    ``device``: the GPU this client copies to, an ordinal, ``"cuda:N"`` or a ``torch.device``
    (default: the current CUDA device). One ferryd serves every GPU of a node; a client copies to
    one, its pool tensors come from that GPU's NUMA node, and its CUDA tensors must be on it:
    open one client per GPU. On the host backend, ``device`` picks a simulated GPU.
    Raises :class:`ferry.Unavailable` when no ferryd answers there, :class:`ferry.NotFound` when
    ferryd does not serve that GPU.

    Tensors made by :meth:`empty` stay valid after the client is closed (and even if ferryd
    exits): their memory is a mapping this process holds until the last tensor over it is freed,
    when it goes back to ferryd's pool. Copies need an open client; after :meth:`close` they
    raise :class:`ferry.Aborted`.
    """

    def __init__(self, socket: Optional[str] = None, name: Optional[str] = None, *, timeout: float = 5.0,
                 device: Union[None, int, str, "torch.device"] = None) -> None:
        self._c = _ferry.Client(socket, name, timeout, _device_index(device))

    # --- the session ---------------------------------------------------------------------------

    def close(self) -> None:
        """Ends the session. Tensors already made stay valid; new copies raise."""
        self._c.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._c.closed

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def backend(self) -> str:
        """``"cuda"``, or ``"host"`` where ferryd runs without a GPU (device memory is simulated)."""
        return self._c.backend

    @property
    def device(self) -> int:
        """The CUDA device ordinal (this process's numbering) this client copies to."""
        return self._c.device

    @property
    def gpu_uuid(self) -> str:
        """The GPU's UUID as ferryd names it (``"GPU-..."``; ``"host-gpu-N"`` on the host backend)."""
        return self._c.gpu_uuid

    @property
    def numa_node(self) -> int:
        """The NUMA node of this client's pool memory, near its GPU (-1: not known)."""
        return self._c.numa_node

    def status(self) -> dict[str, Any]:
        """The session and ferryd's counters: backend, device, session id, pool bytes, copies."""
        s = {"backend": self._c.backend, "device": self._c.device, "gpu_uuid": self._c.gpu_uuid,
             "numa_node": self._c.numa_node, "session_id": self._c.session_id, "socket": self._c.socket}
        s.update(self._c.stats())
        return s

    # --- memory --------------------------------------------------------------------------------

    def empty(self, shape: Union[int, Sequence[int]], dtype: Optional["torch.dtype"] = None) -> "torch.Tensor":
        """A CPU tensor whose storage is a buffer of ferryd's pinned pool (zero-copy).

        Copies between it and a CUDA tensor with :meth:`copy_` are DMAs from or into this very
        memory. Its contents start undefined, like ``torch.empty``.
        """
        torch = _torch()
        dtype = torch.float32 if dtype is None else dtype
        shape = _shape(shape)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        raw = torch.utils.dlpack.from_dlpack(self._c.allocate_host(nbytes).dlpack())
        return raw[:nbytes].view(dtype).view(shape)

    def empty_like(self, t: "torch.Tensor") -> "torch.Tensor":
        """A pool tensor (see :meth:`empty`) of ``t``'s shape and dtype."""
        return self.empty(tuple(t.shape), t.dtype)

    def empty_array(self, shape: Union[int, Sequence[int]], dtype: Any = "float32") -> "numpy.ndarray":
        """A numpy array over a buffer of ferryd's pinned pool (zero-copy)."""
        import numpy

        shape = _shape(shape)
        dt = numpy.dtype(dtype)
        count = math.prod(shape)
        buf = self._c.allocate_host(count * dt.itemsize)
        return numpy.frombuffer(buf, dtype=dt, count=count).reshape(shape)

    def empty_device(self, shape: Union[int, Sequence[int]], dtype: Optional["torch.dtype"] = None) -> "torch.Tensor":
        """Device memory allocated by ferry, as a tensor: a CUDA tensor on the cuda backend.

        ferryd reaches any CUDA tensor of the caching allocator; this is for memory it cannot
        (PyTorch's expandable_segments). On the host backend it returns a CPU tensor standing in
        for device memory, which copies treat as the GPU side.
        """
        torch = _torch()
        dtype = torch.float32 if dtype is None else dtype
        shape = _shape(shape)
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        raw = torch.utils.dlpack.from_dlpack(self._c.allocate_device(nbytes).dlpack())
        return raw[:nbytes].view(dtype).view(shape)

    def forget_device_memory(self) -> None:
        """Drops ferry's cache of registered CUDA allocations.

        ferry registers the allocation under a CUDA tensor on first use and keeps it; call this
        after freeing device memory in bulk (``torch.cuda.empty_cache()``) so ferryd lets it go.
        """
        self._c.forget_device_memory()

    # --- ordering ------------------------------------------------------------------------------

    def event(self) -> Event:
        """A new event shared with ferryd, for ``after=`` (see :class:`Event`)."""
        return Event(self._c.create_event(), self)

    def _stream_handle(self, stream: Stream) -> int:
        if isinstance(stream, int):
            return stream
        if stream is None:
            if self._c.backend == "host":
                return 0
            return _torch().cuda.current_stream(self._c.device).cuda_stream
        handle = getattr(stream, "cuda_stream", None)
        if handle is None:
            raise InvalidArgument(
                f"stream must be a torch.cuda.Stream, a cudaStream_t as int, or None, not {type(stream).__name__}")
        return int(handle)

    def _ordering(self, stream: Stream, after: Any) -> tuple[Optional[_ferry.Event], int, int]:
        """(ferry event, foreign cudaEvent_t, cudaStream_t) for one copy's ordering options."""
        stream_handle = 0 if stream is None else self._stream_handle(stream)
        if stream is not None and self._c.backend == "host":
            stream_handle = 1  # no streams on the host backend: order the copy and wait on the host
        if after is None:
            return None, 0, stream_handle
        if isinstance(after, Event):
            if stream is not None:
                raise InvalidArgument("pass stream= or a ferry Event as after=, not both: "
                                      "record the event on that stream instead")
            return after._event, 0, 0
        handle = getattr(after, "cuda_event", None)
        if handle is None:
            raise InvalidArgument(f"after must be a ferry.Event or a torch.cuda.Event, not {type(after).__name__}")
        if self._c.backend == "host":
            return None, 0, stream_handle  # nothing runs on the GPU: every event has happened
        if not handle:
            raise InvalidArgument("after: this torch.cuda.Event was never recorded")
        if stream is not None:
            torch = _torch()
            s = stream if isinstance(stream, torch.cuda.Stream) else torch.cuda.ExternalStream(stream_handle)
            s.wait_event(after)
            return None, 0, stream_handle
        return None, int(handle), 0

    # --- copies --------------------------------------------------------------------------------

    def copy_(self, dst: Array, src: Array, *, stream: Stream = None, after: Any = None,
              priority: Priority = "auto", stream_waitable: Optional[bool] = None) -> Transfer:
        """Copies ``src`` into ``dst``: one a pool tensor (:meth:`empty`), the other a CUDA tensor.

        Both contiguous and of equal size in bytes (any dtype, any slice). Returns at once with a
        :class:`Transfer`. Ordering:

        - ``stream``: the copy starts after the work queued on this torch stream so far, and the
          stream waits for the copy (GPU-side), like a non-blocking copy issued on that stream.
        - ``after``: a :class:`ferry.Event` or ``torch.cuda.Event`` already recorded; the copy
          starts once it has happened, GPU-side (ferry's own event saves a relay).
        - ``priority``: "latency" for small copies waited for at once, "bulk" for the rest,
          "auto" (default) picks latency up to 64 KiB.
        - ``stream_waitable``: whether :meth:`Transfer.stream_wait` may be used on the copy (ferryd
          then records an event for it); default: bulk copies yes, latency copies no. A copy only
          waited for on the host may say False.

        Raises :class:`ferry.InvalidArgument` for a tensor ferry cannot reach, saying why.
        """
        if priority not in _PRIORITIES:
            raise InvalidArgument(f"priority must be one of {_PRIORITIES}, not {priority!r}")
        dst_ptr, dst_cuda, dst_nbytes, dst_dev = _describe(dst, "dst")
        src_ptr, src_cuda, src_nbytes, src_dev = _describe(src, "src")
        if dst_nbytes != src_nbytes:
            raise InvalidArgument(f"dst has {dst_nbytes} bytes and src {src_nbytes}: "
                                  "copy_ copies whole tensors of equal size; slice one of them")
        self._check_device(dst_dev, "dst")
        self._check_device(src_dev, "src")
        event, foreign, stream_handle = self._ordering(stream, after) if (stream is not None or after is not None) \
            else (None, 0, 0)
        latency = priority == "latency" or (priority == "auto" and src_nbytes <= LATENCY_MAX_BYTES)
        waitable = (not latency) if stream_waitable is None else bool(stream_waitable)
        return Transfer(self._c.copy(dst_ptr, dst_cuda, src_ptr, src_cuda, src_nbytes, latency, waitable, event,
                                     foreign, stream_handle), self)

    def copy_blocks_(self, dst: Array, src: Array, src_blocks: Any, dst_blocks: Any, block_bytes: int, *,
                     stream: Stream = None, after: Any = None, priority: Priority = "bulk") -> Transfer:
        """Copies a list of blocks as one copy: block ``src_blocks[i]`` of ``src`` to block
        ``dst_blocks[i]`` of ``dst``, each ``block_bytes`` long, block ``k`` lying ``k *
        block_bytes`` bytes into its tensor. One side is a pool tensor, the other a CUDA tensor,
        as for :meth:`copy_`; a KV-cache layer's offload or reload in one call.

        The index lists are integer tensors, arrays or sequences of equal length (1 to 262,144);
        no two entries may name the same destination block. ferryd checks every index before any
        byte moves and refuses the whole list, naming the first bad index. Ordering options as for
        :meth:`copy_`.
        """
        if priority not in _PRIORITIES:
            raise InvalidArgument(f"priority must be one of {_PRIORITIES}, not {priority!r}")
        dst_ptr, dst_cuda, dst_nbytes, dst_dev = _describe(dst, "dst")
        src_ptr, src_cuda, src_nbytes, src_dev = _describe(src, "src")
        self._check_device(dst_dev, "dst")
        self._check_device(src_dev, "src")
        src_index = _block_indices(src_blocks, "src_blocks")
        dst_index = _block_indices(dst_blocks, "dst_blocks")
        if src_index.size != dst_index.size:
            raise InvalidArgument(f"src_blocks has {src_index.size} entries and dst_blocks {dst_index.size}")
        if src_index.size == 0:
            raise InvalidArgument("an empty block list: nothing to copy")
        if block_bytes <= 0:
            raise InvalidArgument(f"block_bytes must be positive, not {block_bytes}")
        event, foreign, stream_handle = self._ordering(stream, after)
        latency = priority == "latency"
        return Transfer(self._c.copy_blocks(dst_ptr, dst_cuda, dst_nbytes, src_ptr, src_cuda, src_nbytes,
                                            src_index.ctypes.data, dst_index.ctypes.data, int(src_index.size),
                                            int(block_bytes), latency, not latency, event, foreign, stream_handle),
                        self)

    def copy_staged_(self, dst: Array, src: Array) -> None:
        """Copies between any CPU tensor (pageable memory) and a CUDA tensor, both ways.

        ferry's client threads copy chunks into pool buffers while ferryd DMAs the chunks already
        staged; no pinning of your memory. Blocks until every byte has arrived (GIL released).
        """
        dst_ptr, dst_cuda, dst_nbytes, dst_dev = _describe(dst, "dst")
        src_ptr, src_cuda, src_nbytes, src_dev = _describe(src, "src")
        if dst_nbytes != src_nbytes:
            raise InvalidArgument(f"dst has {dst_nbytes} bytes and src {src_nbytes}: "
                                  "copy_staged_ copies whole tensors of equal size; slice one of them")
        self._check_device(dst_dev, "dst")
        self._check_device(src_dev, "src")
        self._c.copy_staged(dst_ptr, dst_cuda, src_ptr, src_cuda, src_nbytes)

    def stream_wait(self, transfers: Sequence[Transfer], stream: Stream = None) -> None:
        """Makes ``stream`` wait on the GPU for every copy in ``transfers`` at once."""
        self._c.stream_wait([t._transfer for t in transfers], self._stream_handle(stream))

    def _check_device(self, device_index: int, what: str) -> None:
        if device_index >= 0 and device_index != self._c.device:
            raise InvalidArgument(f"{what} is on cuda:{device_index}, but this client copies to cuda:{self._c.device}: "
                                  f"open a ferry.Client(device={device_index}) for that GPU, or move the tensor")

    # --- measurement ---------------------------------------------------------------------------

    def time_round_trips(self, dst: Array, src: Array, iterations: int, priority: Priority = "latency") -> list[int]:
        """Nanoseconds of ``iterations`` copies src -> dst (latency class, or "bulk") submitted and
        waited for in C++ by libferry alone: the baseline the Python path is measured against."""
        dst_ptr, dst_cuda, dst_nbytes, _ = _describe(dst, "dst")
        src_ptr, src_cuda, src_nbytes, _ = _describe(src, "src")
        if dst_nbytes != src_nbytes:
            raise InvalidArgument("dst and src differ in size")
        return self._c.time_round_trips(dst_ptr, dst_cuda, src_ptr, src_cuda, src_nbytes, iterations,
                                        priority != "bulk")
