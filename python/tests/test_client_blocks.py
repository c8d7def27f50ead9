"""copy_blocks_: shuffled block lists both ways, every byte; the lists ferryd must refuse."""

from __future__ import annotations

from typing import Any

import numpy
import pytest
import torch

import ferry
from bytecheck import POISON, assert_bytes, byte_view, fill_random, poison
from copy_cases import INDEX_KINDS, ferry_device, run_blocks


@pytest.mark.parametrize("to_device", [True, False], ids=["h2d", "d2h"])
@pytest.mark.parametrize("kind", list(INDEX_KINDS))
def test_shuffled_blocks_every_byte(client: ferry.Client, gen: torch.Generator, kind: str, to_device: bool) -> None:
    run_blocks(client, gen, ferry_device(client), to_device, block_bytes=4096, src_count=53, dst_count=61, n=47,
               kind=kind)


@pytest.mark.parametrize("to_device", [True, False], ids=["h2d", "d2h"])
@pytest.mark.parametrize("block_bytes", [1, 3, 4095, 65537, (1 << 20) + 9])
def test_awkward_block_sizes(client: ferry.Client, gen: torch.Generator, block_bytes: int, to_device: bool) -> None:
    run_blocks(client, gen, ferry_device(client), to_device, block_bytes=block_bytes, src_count=7, dst_count=9, n=6)


@pytest.mark.parametrize("to_device", [True, False], ids=["h2d", "d2h"])
def test_blocks_of_slices_at_offsets(client: ferry.Client, gen: torch.Generator, to_device: bool) -> None:
    """The tensors are slices at odd offsets: block k lies k * block_bytes into the slice."""
    run_blocks(client, gen, ferry_device(client), to_device, block_bytes=1000, src_count=33, dst_count=40, n=33,
               host_offset=5, device_offset=4099)


@pytest.mark.parametrize("to_device", [True, False], ids=["h2d", "d2h"])
def test_many_small_blocks(client: ferry.Client, gen: torch.Generator, to_device: bool) -> None:
    """Twenty thousand 64-byte blocks, most of them not adjacent to their neighbours in the list."""
    run_blocks(client, gen, ferry_device(client), to_device, block_bytes=64, src_count=30011, dst_count=25013,
               n=20000, kind="numpy_int64")


def test_blocks_in_the_latency_class(client: ferry.Client, gen: torch.Generator) -> None:
    run_blocks(client, gen, ferry_device(client), True, block_bytes=256, src_count=40, dst_count=50, n=30,
               priority="latency")


@pytest.fixture
def pair(client: ferry.Client, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A random pool tensor of 8 blocks of 4096 bytes, a poisoned device tensor of as many, and
    the random bytes."""
    host = client.empty(8 * 4096, torch.uint8)
    device = client.empty_device(8 * 4096, torch.uint8)
    data = fill_random(host, gen)
    poison(device)
    return host, device, data


def assert_untouched(device: torch.Tensor) -> None:
    """A refused list moved no byte: the destination is all poison."""
    assert_bytes(device, torch.full((device.numel(),), POISON, dtype=torch.uint8), "destination of a refused list")


@pytest.mark.parametrize("which,src_blocks,dst_blocks,message", [
    ("dst", [0, 1, 2], [3, 8, 4], "dst_blocks[1] = 8: block runs past the end of dst (32768 bytes)"),
    ("src", [0, 7, 9], [3, 4, 5], "src_blocks[2] = 9: block runs past the end of src (32768 bytes)"),
    ("src", [0, -1], [1, 2], "src_blocks[1] = -1 is not a block index"),
    ("dst", [0, 1], [1, 2 ** 32], "dst_blocks[1] = 4294967296 is not a block index"),
])
def test_bad_index_is_named(client: ferry.Client, pair: tuple[torch.Tensor, ...], which: str, src_blocks: list[int],
                            dst_blocks: list[int], message: str) -> None:
    host, device, _ = pair
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_blocks_(device, host, src_blocks, dst_blocks, 4096)
    assert message in str(e.value)
    assert e.value.code_name == "InvalidArgument" and isinstance(e.value, ValueError)
    assert_untouched(device)


def test_bad_index_into_a_slice_is_checked_against_the_slice(client: ferry.Client,
                                                              pair: tuple[torch.Tensor, ...]) -> None:
    """Block 4 of a 4-block slice is past its end, though the pool buffer under it goes on."""
    host, device, _ = pair
    with pytest.raises(ferry.InvalidArgument, match=r"src_blocks\[0\] = 4: block runs past the end of src "
                                                    r"\(16384 bytes\)"):
        client.copy_blocks_(device, host[:4 * 4096], [4], [0], 4096)
    assert_untouched(device)


@pytest.mark.parametrize("dst_blocks,message", [
    ([2, 2], "block 1: destination block 2 is also block 0's: no two blocks may share a destination block"),
    ([5, 1, 6, 0, 1], "block 4: destination block 1 is also block 1's"),
])
def test_duplicate_destination_blocks_are_refused(client: ferry.Client, pair: tuple[torch.Tensor, ...],
                                                  dst_blocks: list[int], message: str) -> None:
    host, device, _ = pair
    src_blocks = list(range(len(dst_blocks)))
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_blocks_(device, host, src_blocks, dst_blocks, 4096)
    assert message in str(e.value)
    assert_untouched(device)
    # The same source block twice is fine: only destinations must differ.
    client.copy_blocks_(device, host, [3, 3], [0, 7], 4096).wait(timeout=30)
    assert_bytes(device[:4096], byte_view(host)[3 * 4096:4 * 4096], "block 0")
    assert_bytes(device[7 * 4096:], byte_view(host)[3 * 4096:4 * 4096], "block 7")


@pytest.mark.parametrize("src_blocks,dst_blocks,block_bytes,message", [
    ([0, 1], [0], 4096, "src_blocks has 2 entries and dst_blocks 1"),
    ([], [], 4096, "an empty block list: nothing to copy"),
    (torch.empty(0, dtype=torch.int64), numpy.array([], dtype=numpy.int32), 4096, "an empty block list"),
    ([0], [0], 0, "block_bytes must be positive, not 0"),
    ([0], [0], -4096, "block_bytes must be positive, not -4096"),
    ([[0, 1]], [[2, 3]], 4096, "src_blocks must be one-dimensional, not of shape (1, 2)"),
    ([0.0, 1.0], [2, 3], 4096, "src_blocks must hold integers, not float64"),
])
def test_malformed_lists_are_refused(client: ferry.Client, pair: tuple[torch.Tensor, ...], src_blocks: Any,
                                     dst_blocks: Any, block_bytes: int, message: str) -> None:
    host, device, _ = pair
    with pytest.raises(ferry.InvalidArgument) as e:
        client.copy_blocks_(device, host, src_blocks, dst_blocks, block_bytes)
    assert message in str(e.value)
    assert_untouched(device)
