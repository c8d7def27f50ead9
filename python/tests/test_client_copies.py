"""copy_ and copy_staged_: every byte arrives, at awkward sizes and offsets, both ways."""

from __future__ import annotations

import pytest
import torch

import ferry
from bytecheck import assert_bytes, fill_random, poison
from copy_cases import copy_slices, ferry_device, staged_slices

MiB = 1 << 20

SIZES = [1, 3, 4095, 4096, 4097, 65535, 65536, 65537, MiB + 7, 3 * MiB + 1]
# (offset into a bigger pool tensor, offset into a bigger device tensor): slices copied in place.
OFFSETS = [(0, 0), (1, 3), (4093, 1), (MiB - 1, 7)]


@pytest.mark.parametrize("to_device", [True, False], ids=["h2d", "d2h"])
@pytest.mark.parametrize("offsets", OFFSETS, ids=lambda o: f"at{o[0]}+{o[1]}")
@pytest.mark.parametrize("size", SIZES)
def test_every_byte_arrives(client: ferry.Client, gen: torch.Generator, size: int, offsets: tuple[int, int],
                            to_device: bool) -> None:
    copy_slices(client, gen, ferry_device(client), size, offsets[0], offsets[1], to_device)


@pytest.mark.parametrize("to_device", [True, False], ids=["h2d", "d2h"])
@pytest.mark.parametrize("priority", ["latency", "bulk", "auto"])
@pytest.mark.parametrize("size", [1, 4097, ferry.LATENCY_MAX_BYTES + 1, 2 * MiB + 5])
def test_every_byte_arrives_in_each_priority(client: ferry.Client, gen: torch.Generator, size: int, priority: str,
                                             to_device: bool) -> None:
    copy_slices(client, gen, ferry_device(client), size, 5, 9, to_device, priority=priority)


@pytest.mark.parametrize("to_device", [True, False], ids=["h2d", "d2h"])
def test_many_copies_in_flight(client: ferry.Client, gen: torch.Generator, to_device: bool) -> None:
    """Sixty-four copies submitted before any is waited for, into disjoint slices of one tensor."""
    sizes = [int(s) for s in torch.randint(1, 3 * 65536, (64,), generator=gen)]
    total = sum(sizes)
    host = client.empty(total, torch.uint8)
    device = client.empty_device(total, torch.uint8)
    src, dst = (host, device) if to_device else (device, host)
    data = fill_random(src, gen)
    poison(dst)
    transfers, at = [], 0
    for n in sizes:
        transfers.append(client.copy_(dst[at:at + n], src[at:at + n]))
        at += n
    for t in transfers:
        t.wait(timeout=60)
    assert_bytes(dst, data, "destination of 64 copies")


def test_copy_between_dtypes_of_equal_size(client: ferry.Client, gen: torch.Generator) -> None:
    host = client.empty((3, 1001), torch.float16)  # 6006 bytes
    device = client.empty_device((3003,), torch.int16)
    data = fill_random(host, gen)
    poison(device)
    client.copy_(device, host).wait(timeout=30)
    assert_bytes(device, data, "int16 device tensor from a float16 pool tensor")


def test_ordering_options_on_the_host_backend(client: ferry.Client, gen: torch.Generator, backend: str) -> None:
    """after= with a ferry Event and stream=: on the host backend nothing runs on a GPU, so they
    order nothing, but they are accepted and the bytes arrive."""
    if backend != "host":
        pytest.skip("the cuda backend's ordering is tested in test_gpu.py")
    host = client.empty(3 * 65536 + 1, torch.uint8)
    device = client.empty_device(3 * 65536 + 1, torch.uint8)
    event = client.event()
    event.record()
    data = fill_random(host, gen)
    poison(device)
    client.copy_(device, host, after=event).wait(timeout=30)
    assert_bytes(device, data, "device after a copy after= a ferry event")
    data = fill_random(device, gen)
    poison(host)
    t = client.copy_(host, device, stream=0x1234)  # any stream handle: the host waits for the copy
    t.stream_wait()
    client.stream_wait([t])
    assert t.done()
    assert_bytes(host, data, "pool tensor after a copy with stream=")


STAGED_SIZES = [1, 3, 4097, (512 << 10) + 1, 5 * MiB + 3, 17 * MiB + 1]


@pytest.mark.parametrize("to_device", [True, False], ids=["h2d", "d2h"])
@pytest.mark.parametrize("size", STAGED_SIZES)
def test_copy_staged_every_byte(client: ferry.Client, gen: torch.Generator, size: int, to_device: bool) -> None:
    staged_slices(client, gen, ferry_device(client), size, to_device)


def test_copy_staged_of_other_dtypes_and_numpy(client: ferry.Client, gen: torch.Generator) -> None:
    pageable = torch.empty((513, 1027), dtype=torch.float32)
    device = client.empty_device((1027, 513, 2), torch.bfloat16)
    data = fill_random(pageable, gen)
    poison(device)
    client.copy_staged_(device, pageable)
    assert_bytes(device, data, "bfloat16 device tensor from a float32 pageable tensor")
    array = pageable.numpy()  # the same memory, as numpy
    poison(array)
    client.copy_staged_(array, device)
    assert_bytes(array, data, "numpy array from device")


def test_copy_staged_to_and_from_a_pool_tensor(client: ferry.Client, gen: torch.Generator) -> None:
    """A pool tensor is host memory too: copy_staged_ takes it like any other."""
    host = client.empty(MiB + 1, torch.uint8)
    device = client.empty_device(MiB + 1, torch.uint8)
    data = fill_random(host, gen)
    poison(device)
    client.copy_staged_(device, host)
    assert_bytes(device, data, "device tensor")
    poison(host)
    client.copy_staged_(host, device)
    assert_bytes(host, data, "pool tensor")
