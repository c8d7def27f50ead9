"""Copy cases shared by the host-backend and the GPU tests: a copy between slices, a shuffled
block list, a staged copy; each with random data and a poisoned destination, every byte of the
whole destination tensor checked.

``make_device(n)`` makes the device side: n bytes as a flat uint8 tensor (``client.empty_device``,
or a CUDA tensor of PyTorch's caching allocator).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy
import torch

import ferry
from bytecheck import POISON, assert_bytes, fill_random, poison, poisoned_with

DeviceFactory = Callable[[int], torch.Tensor]
PAD = 4099  # poisoned bytes past each slice's end


def ferry_device(client: ferry.Client) -> DeviceFactory:
    """Device memory from ferry (``client.empty_device``): a stand-in on the host backend."""
    return lambda n: client.empty_device(n, torch.uint8)


def settle(*tensors: torch.Tensor) -> None:
    """Waits for torch's queued GPU work on any of ``tensors`` (a poison fill, random data) before
    ferry, which torch's streams do not order, touches them."""
    if any(t.is_cuda for t in tensors):
        torch.cuda.synchronize()


def copy_slices(client: ferry.Client, gen: torch.Generator, make_device: DeviceFactory, size: int, host_offset: int,
                device_offset: int, to_device: bool, **options: object) -> None:
    """Copies ``size`` random bytes between a slice of a pool tensor and a slice of a device
    tensor, and checks every byte of the whole destination tensor (poison around the slice)."""
    host = client.empty(host_offset + size + PAD, torch.uint8)
    device = make_device(device_offset + size + PAD)
    host_slice = host[host_offset:host_offset + size]
    device_slice = device[device_offset:device_offset + size]
    if to_device:
        data = fill_random(host_slice, gen)
        poison(device)
        settle(device)
        t = client.copy_(device_slice, host_slice, **options)
        t.wait(timeout=60)
        assert t.done() and t.nbytes == size
        assert_bytes(device, poisoned_with(device.numel(), device_offset, data), "device tensor")
        assert_bytes(host_slice, data, "source slice, after the copy")
    else:
        data = fill_random(device_slice, gen)
        poison(host)
        settle(device)
        t = client.copy_(host_slice, device_slice, **options)
        t.wait(timeout=60)
        assert t.done() and t.nbytes == size
        assert_bytes(host, poisoned_with(host.numel(), host_offset, data), "pool tensor")
        assert_bytes(device_slice, data, "source slice, after the copy")


INDEX_KINDS: dict[str, Callable[[list[int]], Any]] = {
    "torch_int32": lambda xs: torch.tensor(xs, dtype=torch.int32),
    "torch_int64": lambda xs: torch.tensor(xs, dtype=torch.int64),
    "numpy_int64": lambda xs: numpy.array(xs, dtype=numpy.int64),
    "numpy_uint32": lambda xs: numpy.array(xs, dtype=numpy.uint32),
    "numpy_int16": lambda xs: numpy.array(xs, dtype=numpy.int16),
    "list": lambda xs: list(xs),
    "tuple": lambda xs: tuple(xs),
}


def shuffled(n: int, count: int, gen: torch.Generator) -> list[int]:
    """``count`` distinct block indexes out of ``n``, in random order."""
    return [int(i) for i in torch.randperm(n, generator=gen)[:count]]


def expected_after_blocks(src: torch.Tensor, dst_bytes: int, src_blocks: list[int], dst_blocks: list[int],
                          block_bytes: int) -> torch.Tensor:
    """What a poisoned destination of ``dst_bytes`` holds after the block copy: the source's
    blocks where the list puts them, the poison in every other byte."""
    expected = torch.full((dst_bytes,), POISON, dtype=torch.uint8)
    for s, d in zip(src_blocks, dst_blocks):
        expected[d * block_bytes:(d + 1) * block_bytes] = src[s * block_bytes:(s + 1) * block_bytes]
    return expected


def run_blocks(client: ferry.Client, gen: torch.Generator, make_device: DeviceFactory, to_device: bool,
               block_bytes: int, src_count: int, dst_count: int, n: int, kind: str = "list", host_offset: int = 0,
               device_offset: int = 0, priority: str = "bulk") -> None:
    """Copies ``n`` shuffled blocks between (slices of) a pool tensor and a device tensor; checks
    every byte of the whole destination tensor, slack and unused blocks included."""
    src_n, dst_n = (src_count, dst_count)
    host_blocks, device_blocks = (src_n, dst_n) if to_device else (dst_n, src_n)
    host_all = client.empty(host_offset + host_blocks * block_bytes + 13, torch.uint8)
    device_all = make_device(device_offset + device_blocks * block_bytes + 17)
    host = host_all[host_offset:host_offset + host_blocks * block_bytes]
    device = device_all[device_offset:device_offset + device_blocks * block_bytes]
    src, dst, dst_all, dst_offset = ((host, device, device_all, device_offset) if to_device
                                     else (device, host, host_all, host_offset))
    src_blocks = shuffled(src_n, n, gen)
    dst_blocks = shuffled(dst_n, n, gen)
    data = fill_random(src, gen)
    poison(dst_all)
    settle(device_all)
    t = client.copy_blocks_(dst, src, INDEX_KINDS[kind](src_blocks), INDEX_KINDS[kind](dst_blocks), block_bytes,
                            priority=priority)
    t.wait(timeout=60)
    assert t.nbytes == n * block_bytes
    inner = expected_after_blocks(data, dst.numel(), src_blocks, dst_blocks, block_bytes)
    whole = torch.full((dst_all.numel(),), POISON, dtype=torch.uint8)
    whole[dst_offset:dst_offset + dst.numel()] = inner
    assert_bytes(dst_all, whole, f"destination after {n} blocks of {block_bytes} bytes")
    assert_bytes(src, data, "source after the block copy")


def staged_slices(client: ferry.Client, gen: torch.Generator, make_device: DeviceFactory, size: int,
                  to_device: bool) -> None:
    """Pageable memory (a plain torch tensor, sliced at an odd offset) to or from a slice of a
    device tensor with copy_staged_; every byte of both whole tensors checked."""
    pageable = torch.empty(size + 3 + PAD, dtype=torch.uint8)
    device = make_device(size + 11 + PAD)
    pageable_slice = pageable[3:3 + size]
    device_slice = device[11:11 + size]
    if to_device:
        data = fill_random(pageable_slice, gen)
        poison(device)
        settle(device)
        client.copy_staged_(device_slice, pageable_slice)
        assert_bytes(device, poisoned_with(device.numel(), 11, data), "device tensor")
        assert_bytes(pageable_slice, data, "source slice, after the copy")
    else:
        data = fill_random(device_slice, gen)
        poison(pageable)
        settle(device)
        client.copy_staged_(pageable_slice, device_slice)
        assert_bytes(pageable, poisoned_with(pageable.numel(), 3, data), "pageable tensor")
        assert_bytes(device_slice, data, "source slice, after the copy")
