"""Errors are ferry's exceptions, of the right class, with ferry's message."""

from __future__ import annotations

from typing import Any

import numpy
import pytest
import torch

import ferry
from bytecheck import POISON, assert_bytes, fill_random, poison
from ferryd_process import Ferryd


def assert_error(e: pytest.ExceptionInfo[ferry.Error], cls: type[ferry.Error], text: str) -> None:
    """The exception is exactly ``cls`` (a ferry.Error), carries its code, and says ``text``."""
    assert type(e.value) is cls, f"{type(e.value).__name__}: {e.value}"
    assert isinstance(e.value, ferry.Error)
    assert e.value.code_name == cls.code_name and e.value.code == cls.code
    assert text in str(e.value), f"{text!r} not in {str(e.value)!r}"
    assert e.value.message == str(e.value)


@pytest.fixture
def tensors(client: ferry.Client, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A random pool tensor of 64 x 64 float32 and a poisoned device tensor of the same shape."""
    host = client.empty((64, 64), torch.float32)
    device = client.empty_device((64, 64), torch.float32)
    fill_random(host, gen)
    poison(device)
    return host, device


def assert_poisoned(device: torch.Tensor) -> None:
    assert_bytes(device, torch.full((device.numel() * 4,), POISON, dtype=torch.uint8), "destination of a refused copy")


def test_non_contiguous_tensor(client: ferry.Client, tensors: tuple[torch.Tensor, torch.Tensor]) -> None:
    host, device = tensors
    for dst, src, which in ((device, host.t(), "src"), (device[:, ::2], host[:, :32], "dst")):
        with pytest.raises(ferry.InvalidArgument) as e:
            client.copy_(dst, src)
        assert_error(e, ferry.InvalidArgument, f"{which} is not contiguous")
        with pytest.raises(ferry.InvalidArgument) as e:
            client.copy_staged_(dst, src)
        assert_error(e, ferry.InvalidArgument, f"{which} is not contiguous")
    assert_poisoned(device)


def test_non_contiguous_array(client: ferry.Client) -> None:
    a = client.empty_array((16, 16), "float32")
    device = client.empty_device((16, 16), torch.float32)
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_(device[:, :8].contiguous(), a[:, ::2])
    assert_error(e, ferry.InvalidArgument, "src is not C-contiguous")


def test_cpu_tensor_outside_the_pool(client: ferry.Client, tensors: tuple[torch.Tensor, torch.Tensor]) -> None:
    host, device = tensors
    pageable = torch.zeros((64, 64), dtype=torch.float32)
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_(device, pageable)
    assert_error(e, ferry.InvalidArgument, "src is host memory outside ferry's pool")
    assert "copy_staged_" in str(e.value)  # it says what to do instead
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_(pageable.numpy(), device)
    assert_error(e, ferry.InvalidArgument, "dst is host memory outside ferry's pool")
    assert_poisoned(device)


def test_both_sides_alike(client: ferry.Client, tensors: tuple[torch.Tensor, torch.Tensor]) -> None:
    host, device = tensors
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_(client.empty_like(host), host)
    assert_error(e, ferry.InvalidArgument, "both tensors are in ferry's pool")
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_(device, client.empty_device((64, 64), torch.float32))
    assert_error(e, ferry.InvalidArgument, "both tensors are device memory")
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_staged_(torch.empty(64 * 64), torch.empty(64 * 64))
    assert_error(e, ferry.InvalidArgument, "neither tensor is device memory")
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_staged_(device, client.empty_device((64, 64), torch.float32))
    assert_error(e, ferry.InvalidArgument, "both tensors are device memory")


def test_size_mismatch(client: ferry.Client, tensors: tuple[torch.Tensor, torch.Tensor]) -> None:
    host, device = tensors
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_(device[:10], host[:11])
    assert_error(e, ferry.InvalidArgument, "dst has 2560 bytes and src 2816")
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_staged_(device, torch.empty(64 * 64 + 1))
    assert_error(e, ferry.InvalidArgument, "dst has 16384 bytes and src 16388")
    assert_poisoned(device)


@pytest.mark.parametrize("priority", ["fast", "Bulk", None, 1])
def test_bad_priority(client: ferry.Client, tensors: tuple[torch.Tensor, torch.Tensor], priority: Any) -> None:
    host, device = tensors
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_(device, host, priority=priority)
    assert_error(e, ferry.InvalidArgument, f"priority must be one of ('auto', 'bulk', 'latency'), not {priority!r}")
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_blocks_(device, host, [0], [0], 64, priority=priority)
    assert_error(e, ferry.InvalidArgument, "priority must be one of")
    assert_poisoned(device)


def test_not_a_tensor(client: ferry.Client, tensors: tuple[torch.Tensor, torch.Tensor]) -> None:
    host, device = tensors
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_(device, [1.0] * 4096)  # type: ignore[arg-type]
    assert_error(e, ferry.InvalidArgument, "src must be a torch.Tensor or a numpy.ndarray, not list")


def test_bad_ordering_options(client: ferry.Client, tensors: tuple[torch.Tensor, torch.Tensor]) -> None:
    host, device = tensors
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_(device, host, after=object())
    assert_error(e, ferry.InvalidArgument, "after must be a ferry.Event or a torch.cuda.Event, not object")
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_(device, host, after=client.event(), stream=7)
    assert_error(e, ferry.InvalidArgument, "pass stream= or a ferry Event as after=, not both")
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_(device, host, stream="default")  # type: ignore[arg-type]
    assert_error(e, ferry.InvalidArgument, "stream must be a torch.cuda.Stream, a cudaStream_t as int, or None")
    assert_poisoned(device)


def test_closed_client_aborts(ferryd: Ferryd, gen: torch.Generator) -> None:
    c = ferryd.client()
    host = c.empty(4096, torch.uint8)
    device = c.empty_device(4096, torch.uint8)
    c.close()
    c.close()  # closing twice is fine
    assert c.closed
    calls = {
        "copy_": lambda: c.copy_(device, host),
        "copy_blocks_": lambda: c.copy_blocks_(device, host, [0], [0], 4096),
        "copy_staged_": lambda: c.copy_staged_(device, torch.empty(4096, dtype=torch.uint8)),
        "empty": lambda: c.empty(16),
        "empty_array": lambda: c.empty_array(16),
        "empty_device": lambda: c.empty_device(16),
        "event": lambda: c.event(),
        "status": lambda: c.status(),
        "backend": lambda: c.backend,
    }
    for name, call in calls.items():
        with pytest.raises(ferry.Aborted) as e:
            call()
        assert_error(e, ferry.Aborted, "this ferry.Client is closed")


def test_no_ferryd_at_the_socket(tmp_path: Any) -> None:
    path = str(tmp_path / "nobody-here.sock")
    with pytest.raises(ferry.Unavailable) as e:
        ferry.Client(path, timeout=2.0)
    assert_error(e, ferry.Unavailable, f"ferryd is not running at {path}")
    assert isinstance(e.value, ConnectionError)
    with pytest.raises(ConnectionError):  # what code that knows no ferry catches
        ferry.Client(path, timeout=2.0)


def test_socket_that_is_not_ferryd(tmp_path: Any) -> None:
    """A path that exists but where nothing listens."""
    path = tmp_path / "stale.sock"
    import socket

    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
        s.bind(str(path))  # bound, never listening: connect() is refused
        with pytest.raises(ferry.Unavailable) as e:
            ferry.Client(str(path), timeout=2.0)
    assert_error(e, ferry.Unavailable, str(path))


def test_errors_raised_in_python_carry_their_code() -> None:
    """Errors the Python side raises have their class's code, like the extension's."""
    for cls in (ferry.InvalidArgument, ferry.NotFound, ferry.PermissionDenied, ferry.ResourceExhausted,
                ferry.Unavailable, ferry.Timeout, ferry.ProtocolError, ferry.DeviceError, ferry.NotSupported,
                ferry.InternalError, ferry.Aborted):
        e = cls("why")
        assert str(e) == "why" and e.message == "why"
        assert ferry._errors.error_class(e.code) is cls
    assert issubclass(ferry.Timeout, TimeoutError) and issubclass(ferry.InvalidArgument, ValueError)
    assert issubclass(ferry.PermissionDenied, PermissionError) and issubclass(ferry.NotFound, LookupError)


def test_pool_exhausted(make_ferryd: Any) -> None:
    d = make_ferryd(pool_size="8MiB", slab_size="1MiB")
    with d.client() as c:
        with pytest.raises(ferry.ResourceExhausted) as e:
            c.empty(9 << 20, torch.uint8)
        assert_error(e, ferry.ResourceExhausted, "buffer of 9437184 bytes is larger than the pool (8388608)")
        keep = c.empty(4 << 20, torch.uint8)  # what fits still works
        with pytest.raises(ferry.ResourceExhausted) as e:
            c.empty(5 << 20, torch.uint8)
        assert_error(e, ferry.ResourceExhausted, "(4194304 held, 5242880 more asked)")
        assert keep.numel() == 4 << 20


def test_size_mismatch_of_arrays(client: ferry.Client) -> None:
    a = client.empty_array(4096, "uint8")
    device = client.empty_device(4096, torch.uint8)
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_(device, numpy.ascontiguousarray(a[:100]).astype(numpy.int8))
    assert_error(e, ferry.InvalidArgument, "dst has 4096 bytes and src 100")
