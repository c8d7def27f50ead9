"""Pool tensors and arrays: zero-copy over ferryd's pool, valid after close, returned when freed."""

from __future__ import annotations

import gc
import time
from typing import Any, Callable

import numpy
import pytest
import torch

import ferry
from bytecheck import assert_bytes, byte_view, fill_random, poison
from ferryd_process import FerrydFactory

SHAPES = [(1,), (3,), (4097,), (3, 5, 7), (2, 1, 3, 1, 5), (1023, 3), (257, 1031)]
TORCH_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int64, torch.uint8]
NUMPY_DTYPES = ["float16", "float32", "int64", "uint8"]


def pool_ranges() -> list[tuple[int, int]]:
    """[start, end) of this process's mappings of ferryd's pool slabs, adjacent ones merged."""
    ranges: list[tuple[int, int]] = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            if "ferry-pool-slab" not in line:
                continue
            start, end = (int(x, 16) for x in line.split()[0].split("-"))
            if ranges and ranges[-1][1] == start:
                ranges[-1] = (ranges[-1][0], end)
            else:
                ranges.append((start, end))
    return sorted(ranges)


def assert_in_pool(ptr: int, nbytes: int) -> None:
    """[ptr, ptr + nbytes) lies inside one mapping of ferryd's pool."""
    ranges = pool_ranges()
    assert any(start <= ptr and ptr + nbytes <= end for start, end in ranges), (
        f"[{ptr:#x}, {ptr + nbytes:#x}) is not inside ferryd's pool; its slabs are mapped at "
        + ", ".join(f"[{s:#x}, {e:#x})" for s, e in ranges))


def round_trip(client: ferry.Client, pool: Any, gen: torch.Generator) -> None:
    """Checks that copies move exactly what is in ``pool``'s memory, both ways: random bytes
    written into it after it was made go to a poisoned device tensor, and the device tensor's new
    random bytes land in it, seen through the very object the test holds."""
    nbytes = byte_view(pool).numel()
    device = client.empty_device(nbytes, torch.uint8)
    data = fill_random(pool, gen)
    poison(device)
    client.copy_(device, pool).wait(timeout=30)
    assert_bytes(device, data, "device after copy from the pool tensor")
    back = fill_random(device, gen)
    poison(pool)
    client.copy_(pool, device).wait(timeout=30)
    assert_bytes(pool, back, "pool tensor after copy from device")


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_pool_tensor_is_zero_copy(client: ferry.Client, gen: torch.Generator, shape: tuple[int, ...],
                                  dtype: torch.dtype) -> None:
    t = client.empty(shape, dtype)
    assert t.shape == shape and t.dtype == dtype and t.device.type == "cpu" and t.is_contiguous()
    assert_in_pool(t.data_ptr(), t.numel() * t.element_size())
    round_trip(client, t, gen)


def test_pool_tensor_of_int_shape_and_default_dtype(client: ferry.Client, gen: torch.Generator) -> None:
    t = client.empty(4099)
    assert t.shape == (4099,) and t.dtype == torch.float32
    like = client.empty_like(torch.empty((5, 9), dtype=torch.bfloat16))
    assert like.shape == (5, 9) and like.dtype == torch.bfloat16
    for x in (t, like):
        assert_in_pool(x.data_ptr(), x.numel() * x.element_size())
        round_trip(client, x, gen)


def test_pool_tensors_do_not_overlap(client: ferry.Client, gen: torch.Generator) -> None:
    tensors = [client.empty(n, torch.uint8) for n in (1, 7, 4096, 4097, 65536, (1 << 20) + 3, 5)]
    spans = sorted((t.data_ptr(), t.data_ptr() + t.numel()) for t in tensors)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert end <= start, "two pool tensors share memory"
    data = [fill_random(t, gen) for t in tensors]
    for t, d in zip(tensors, data):
        assert_bytes(t, d, "a pool tensor after writing all the others")


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_pool_array_is_zero_copy(client: ferry.Client, gen: torch.Generator, shape: tuple[int, ...],
                                 dtype: str) -> None:
    a = client.empty_array(shape, dtype)
    assert a.shape == shape and a.dtype == numpy.dtype(dtype) and a.flags.c_contiguous and a.flags.writeable
    assert_in_pool(a.ctypes.data, a.nbytes)
    round_trip(client, a, gen)


def _status_held(observer: ferry.Client) -> int:
    s = observer.status()
    return s["pool_bytes"] - s["pool_free_bytes"]


def _wait_held(observer: ferry.Client, want: Callable[[int], bool], what: str, timeout: float = 30.0) -> int:
    """Polls ferryd's pool counters until ``want(held bytes)``; ferryd reclaims a slab of an ended
    session once no process maps it, probing every 250 ms, and then renews its pages."""
    deadline = time.monotonic() + timeout
    held = _status_held(observer)
    while not want(held):
        assert time.monotonic() < deadline, f"{what}: ferryd still counts {held} pool bytes held after {timeout} s"
        time.sleep(0.02)
        held = _status_held(observer)
    return held


def test_pool_memory_outlives_client_and_returns_when_last_tensor_goes(make_ferryd: FerrydFactory,
                                                                      gen: torch.Generator) -> None:
    d = make_ferryd(pool_size="32MiB", slab_size="1MiB")
    owner = d.client(name="owner")
    big = owner.empty((3 << 20) + 5, torch.uint8)  # four slabs, mapped side by side
    array = owner.empty_array((1000, 3), "int64")
    last = owner.empty((333,), torch.bfloat16)
    owner.close()
    assert owner.closed

    # Every byte of each stays readable and writable after the session ended.
    for x in (big, array, last):
        data = fill_random(x, gen)
        assert_bytes(x, data, "pool memory after client.close()")

    observer = d.client(name="observer")
    slab = d.slab_bytes
    held = _status_held(observer)
    assert held >= 4 * slab, f"ferryd counts {held} bytes held; the closed client's tensors map more"
    time.sleep(0.8)  # three of ferryd's reclaim probes: mapped slabs must stay out of the pool
    assert _status_held(observer) == held, "ferryd reclaimed pool memory that a live tensor maps"

    del big, array, x, data
    gc.collect()
    held = _wait_held(observer, lambda h: h <= slab, "after freeing all but one small tensor")
    assert held == slab, f"{held} bytes held while one 666-byte tensor lives: it maps one slab"
    time.sleep(0.8)
    assert _status_held(observer) == slab, "ferryd reclaimed the slab of a live tensor"
    data = fill_random(last, gen)
    assert_bytes(last, data, "the last tensor, alone in its slab")

    del last
    gc.collect()
    _wait_held(observer, lambda h: h == 0, "after freeing the last tensor")
    assert observer.status()["pool_free_bytes"] == d.pool_bytes
    observer.close()
