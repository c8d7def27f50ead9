"""ferry against a real GPU: ordering after torch's kernels (after=, stream=, stream_wait), CUDA IPC of
caching-allocator tensors, expandable_segments, block lists and staged copies with CUDA tensors.

Every test is marked ``gpu`` and skipped unless torch sees a CUDA device; run_gpu_tests.py runs
them with FERRY_TEST_BACKEND=cuda. They start a ferryd on the cuda backend of their own when the
session's ferryd runs another backend.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Callable, Iterator

import pytest
import torch

import ferry
from bytecheck import POISON, assert_bytes, byte_view, fill_random, poison, random_bytes
from copy_cases import copy_slices, ferry_device, run_blocks, settle, staged_slices
from ferryd_process import Ferryd

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
]

MiB = 1 << 20
SLEEP_S = 0.5  # how long the slow kernel keeps its stream busy before it writes


@pytest.fixture(scope="module")
def gpu_ferryd(backend: str, ferryd_binary: str, request: pytest.FixtureRequest) -> Iterator[Ferryd]:
    """A ferryd on the cuda backend: the session's when FERRY_TEST_BACKEND=cuda, else its own."""
    if backend == "cuda":
        yield request.getfixturevalue("ferryd")
        return
    d = Ferryd(ferryd_binary, "cuda")
    try:
        d.start()
        yield d
    finally:
        d.close()


@pytest.fixture
def gpu(gpu_ferryd: Ferryd, request: pytest.FixtureRequest) -> Iterator[ferry.Client]:
    """A client of the cuda-backend ferryd, on torch's device of the same ordinal."""
    c = gpu_ferryd.client(name=request.node.name[:60])
    try:
        assert c.backend == "cuda", f"ferryd runs the {c.backend} backend"
        torch.cuda.set_device(c.device)
        yield c
    finally:
        c.close()
        torch.cuda.synchronize()


def caching_allocator(n: int) -> torch.Tensor:
    """``n`` bytes of CUDA memory from PyTorch's caching allocator."""
    return torch.empty(n, dtype=torch.uint8, device="cuda")


@pytest.fixture(scope="module")
def sleep_cycles() -> int:
    """GPU clock cycles that torch.cuda._sleep spins for SLEEP_S seconds on this GPU (measured)."""
    probe = 20_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(probe)  # warm the kernel up
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()
    ms = start.elapsed_time(end)
    return max(probe, int(probe * SLEEP_S * 1000 / max(ms, 1e-3)))


def record(kind: str, client: ferry.Client, stream: torch.cuda.Stream) -> Any:
    """An event recorded on ``stream``: a ferry Event or a torch.cuda.Event."""
    if kind == "ferry":
        e = client.event()
        e.record(stream)
        return e
    e = torch.cuda.Event()
    e.record(stream)
    return e


def assert_ordered(transfer: ferry.Transfer, stream: torch.cuda.Stream) -> bool:
    """Whether the copy was submitted while the slow kernel still ran (else this attempt shows
    nothing and the caller tries again with a longer kernel); if it was, asserts that the copy had
    not completed while the kernel's stream was still busy after it."""
    copied = transfer.done()
    busy = not stream.query()
    if busy:
        assert not copied, "the copy completed while the kernel it was ordered after still ran"
    return busy


def with_slow_kernels(attempt: Callable[[int], bool], sleep_cycles: int, tries: int = 3) -> None:
    """Runs ``attempt(cycles)`` until the slow kernel outlasted the submission (it returns True),
    doubling the kernel each time: a loaded host may take longer than SLEEP_S to submit."""
    for k in range(tries):
        if attempt(sleep_cycles << k):
            return
    pytest.fail(f"the slow kernel finished before the copy was submitted, {tries} times (last "
                f"{SLEEP_S * 2 ** (tries - 1):.1f} s): the host took that long to submit one copy")


@pytest.mark.parametrize("event_kind", ["ferry", "torch"])
def test_d2h_after_a_kernel(gpu: ferry.Client, gen: torch.Generator, sleep_cycles: int, event_kind: str) -> None:
    """A kernel writes the source after a long sleep; the copy after= its event sees the final bytes,
    not the ones before."""
    n = 16 * MiB + 3

    def attempt(cycles: int) -> bool:
        src = caching_allocator(n)
        old = fill_random(src, gen)
        final = random_bytes(n, gen).cuda()
        assert not torch.equal(old, final.cpu())
        host = gpu.empty(n, torch.uint8)
        poison(host)
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(cycles)
            src.copy_(final)
        event = record(event_kind, gpu, stream)
        transfer = gpu.copy_(host, src, after=event)
        ordered = assert_ordered(transfer, stream)
        transfer.wait(timeout=60)
        assert_bytes(host, final.cpu(), "pool tensor copied after the kernel's write")
        return ordered

    with_slow_kernels(attempt, sleep_cycles)


@pytest.mark.parametrize("event_kind", ["ferry", "torch"])
def test_h2d_after_a_kernel(gpu: ferry.Client, gen: torch.Generator, sleep_cycles: int, event_kind: str) -> None:
    """A kernel poisons the destination after a long sleep; the copy after= its event lands after
    that write, so the destination ends with the copied bytes."""
    n = 16 * MiB + 3

    def attempt(cycles: int) -> bool:
        host = gpu.empty(n, torch.uint8)
        data = fill_random(host, gen)
        dst = caching_allocator(n)
        torch.cuda.synchronize()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(cycles)
            byte_view(dst).fill_(POISON)
        event = record(event_kind, gpu, stream)
        transfer = gpu.copy_(dst, host, after=event)
        ordered = assert_ordered(transfer, stream)
        transfer.wait(timeout=60)
        torch.cuda.synchronize()
        assert_bytes(dst, data, "device tensor written by a kernel, then by the copy")
        return ordered

    with_slow_kernels(attempt, sleep_cycles)


def test_stream_orders_both_ways(gpu: ferry.Client, gen: torch.Generator, sleep_cycles: int) -> None:
    """stream=: the copy starts after the stream's work so far (a slow kernel's write), and work
    queued on the stream afterwards (a consumer kernel) sees the copied bytes."""
    n = 32 * MiB + 5
    stream = torch.cuda.Stream()
    host = gpu.empty(n, torch.uint8)
    data = fill_random(host, gen)
    dst = caching_allocator(n)
    out = caching_allocator(n)
    poison(out)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(sleep_cycles)
        byte_view(dst).fill_(POISON)
    transfer = gpu.copy_(dst, host, stream=stream)
    assert assert_ordered(transfer, stream), "the slow kernel finished before the copy was submitted"
    with torch.cuda.stream(stream):
        out.copy_(dst)  # the consumer: must run after the copy
    stream.synchronize()
    assert_bytes(out, data, "consumer's output on the copy's stream")
    transfer.wait(timeout=60)
    assert_bytes(dst, data, "device tensor")

    # The other way: the copy reads what the stream's kernel wrote last.
    final = random_bytes(n, gen).cuda()
    back = gpu.empty(n, torch.uint8)
    poison(back)
    torch.cuda.synchronize()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(sleep_cycles)
        dst.copy_(final)
    gpu.copy_(back, dst, stream=stream).wait(timeout=60)
    assert_bytes(back, final.cpu(), "pool tensor copied after the stream's write")


@pytest.mark.parametrize("batch", [False, True], ids=["transfer", "client"])
def test_stream_wait_before_a_consumer(gpu: ferry.Client, gen: torch.Generator, sleep_cycles: int,
                                       batch: bool) -> None:
    """Transfer.stream_wait and Client.stream_wait: a consumer kernel queued after the wait sees the
    copied bytes. The copies start only after a slow kernel on another stream, so a consumer that
    did not wait would read the poison."""
    n = 8 * MiB + 1
    host = gpu.empty(2 * n, torch.uint8)
    data = fill_random(host, gen)
    dst = caching_allocator(2 * n)
    out = caching_allocator(2 * n)
    poison(dst)
    poison(out)
    torch.cuda.synchronize()
    slow = torch.cuda.Stream()
    with torch.cuda.stream(slow):
        torch.cuda._sleep(sleep_cycles)
    gate = gpu.event()
    gate.record(slow)
    transfers = [gpu.copy_(dst[:n], host[:n], after=gate, priority="bulk"),
                 gpu.copy_(dst[n:], host[n:], after=gate, priority="bulk")]
    consumer = torch.cuda.Stream()
    if batch:
        gpu.stream_wait(transfers, consumer)
    else:
        for t in transfers:
            t.stream_wait(consumer)
    with torch.cuda.stream(consumer):
        out.copy_(dst)
    assert not slow.query(), "the slow kernel finished before the consumer was queued: raise SLEEP_S"
    consumer.synchronize()
    assert_bytes(out, data, "consumer's output after stream_wait")


OFFSETS = [(0, 0), (1, 3), (4093, 1), (MiB - 1, 2 * MiB + 7)]


@pytest.mark.parametrize("to_device", [True, False], ids=["h2d", "d2h"])
@pytest.mark.parametrize("offsets", OFFSETS, ids=lambda o: f"at{o[0]}+{o[1]}")
@pytest.mark.parametrize("size", [1, 3, 4097, 65537, MiB + 7, 9 * MiB + 3])
def test_caching_allocator_slices_every_byte(gpu: ferry.Client, gen: torch.Generator, size: int,
                                             offsets: tuple[int, int], to_device: bool) -> None:
    """Slices at offsets inside one caching-allocator block, reached through CUDA IPC."""
    copy_slices(gpu, gen, caching_allocator, size, offsets[0], offsets[1], to_device)


@pytest.mark.parametrize("to_device", [True, False], ids=["h2d", "d2h"])
@pytest.mark.parametrize("size", [1, 4097, MiB + 7])
def test_empty_device_every_byte(gpu: ferry.Client, gen: torch.Generator, size: int, to_device: bool) -> None:
    """client.empty_device is a CUDA tensor on the cuda backend (ferry's own cudaMalloc)."""
    t = gpu.empty_device(size, torch.uint8)
    assert t.is_cuda and t.device.index == gpu.device
    copy_slices(gpu, gen, ferry_device(gpu), size, 5, 7, to_device)


def test_many_tensors_in_shared_segments(gpu: ferry.Client, gen: torch.Generator) -> None:
    """Three hundred small tensors, which the caching allocator packs into shared segments: each
    one's copy lands in it alone."""
    sizes = [int(s) for s in torch.randint(1, 200_000, (300,), generator=gen)]
    tensors = [caching_allocator(s) for s in sizes]
    host = gpu.empty(sum(sizes), torch.uint8)
    data = fill_random(host, gen)
    for t in tensors:
        poison(t)
    torch.cuda.synchronize()
    transfers, at = [], 0
    for t, s in zip(tensors, sizes):
        transfers.append(gpu.copy_(t, host[at:at + s]))
        at += s
    for tr in transfers:
        tr.wait(timeout=60)
    at = 0
    for i, (t, s) in enumerate(zip(tensors, sizes)):
        assert_bytes(t, data[at:at + s], f"tensor {i} of {s} bytes")
        at += s
    back = gpu.empty(sum(sizes), torch.uint8)
    poison(back)
    at = 0
    for t, s in zip(tensors, sizes):
        gpu.copy_(back[at:at + s], t).wait(timeout=60)
        at += s
    assert_bytes(back, data, "all tensors copied back")


@pytest.mark.parametrize("how", ["reused", "empty_cache", "empty_cache_and_forget"])
def test_freed_and_reallocated_tensor(gpu: ferry.Client, gen: torch.Generator, how: str) -> None:
    """A tensor freed after ferry copied into it and a new one at (likely) the same address: the
    copies into the new one are right, whether the caching allocator reuses its block or
    cudaFrees it (empty_cache) and cudaMallocs anew."""
    n = 22 * MiB + 5  # above 20 MiB: a segment of its own, cudaFreed by empty_cache
    host = gpu.empty(n, torch.uint8)
    for round_ in range(3):
        t = caching_allocator(n)
        data = fill_random(host, gen)
        poison(t)
        torch.cuda.synchronize()
        gpu.copy_(t, host).wait(timeout=60)
        assert_bytes(t, data, f"round {round_}: device tensor")
        data = fill_random(t, gen)
        poison(host)
        torch.cuda.synchronize()
        gpu.copy_(host, t).wait(timeout=60)
        assert_bytes(host, data, f"round {round_}: pool tensor")
        del t
        if how != "reused":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        if how == "empty_cache_and_forget":
            gpu.forget_device_memory()


@pytest.mark.parametrize("to_device", [True, False], ids=["h2d", "d2h"])
@pytest.mark.parametrize("block_bytes", [3, 4096, 65537])
def test_copy_blocks_with_cuda_tensors(gpu: ferry.Client, gen: torch.Generator, block_bytes: int,
                                       to_device: bool) -> None:
    run_blocks(gpu, gen, caching_allocator, to_device, block_bytes=block_bytes, src_count=61, dst_count=53, n=47,
               kind="torch_int64", host_offset=5, device_offset=4099)


@pytest.mark.parametrize("to_device", [True, False], ids=["h2d", "d2h"])
def test_copy_blocks_many_small_blocks(gpu: ferry.Client, gen: torch.Generator, to_device: bool) -> None:
    run_blocks(gpu, gen, caching_allocator, to_device, block_bytes=64, src_count=30011, dst_count=25013, n=20000,
               kind="numpy_int64")


def test_copy_blocks_with_cuda_index_tensors(gpu: ferry.Client, gen: torch.Generator) -> None:
    """Index lists that are CUDA tensors themselves."""
    host = gpu.empty(16 * 4096, torch.uint8)
    dst = caching_allocator(16 * 4096)
    data = fill_random(host, gen)
    poison(dst)
    settle(dst)
    src_blocks = torch.tensor([3, 0, 15, 7], device="cuda")
    dst_blocks = torch.tensor([1, 14, 2, 9], device="cuda", dtype=torch.int32)
    gpu.copy_blocks_(dst, host, src_blocks, dst_blocks, 4096).wait(timeout=60)
    expected = torch.full((16 * 4096,), POISON, dtype=torch.uint8)
    for s, d in zip(src_blocks.tolist(), dst_blocks.tolist()):
        expected[d * 4096:(d + 1) * 4096] = data[s * 4096:(s + 1) * 4096]
    assert_bytes(dst, expected, "device tensor after four blocks")


@pytest.mark.parametrize("to_device", [True, False], ids=["h2d", "d2h"])
@pytest.mark.parametrize("size", [1, 4097, (512 << 10) + 1, 9 * MiB + 3, 65 * MiB + 1])
def test_copy_staged_with_cuda_tensors(gpu: ferry.Client, gen: torch.Generator, size: int, to_device: bool) -> None:
    staged_slices(gpu, gen, caching_allocator, size, to_device)


def test_errors_with_cuda_tensors(gpu: ferry.Client) -> None:
    host = gpu.empty(4096, torch.uint8)
    dst = caching_allocator(4096)
    with pytest.raises(ferry.InvalidArgument, match="this torch.cuda.Event was never recorded"):
        gpu.copy_(dst, host, after=torch.cuda.Event())
    with pytest.raises(ferry.InvalidArgument, match="both tensors are device memory"):
        gpu.copy_(dst, caching_allocator(4096))
    with pytest.raises(ferry.InvalidArgument, match="src is host memory outside ferry's pool"):
        gpu.copy_(dst, torch.empty(4096, dtype=torch.uint8))
    with pytest.raises(ferry.InvalidArgument, match="dst is not contiguous"):
        gpu.copy_(caching_allocator(8192)[::2], host)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_tensor_on_another_gpu(gpu: ferry.Client) -> None:
    other = (gpu.device + 1) % torch.cuda.device_count()
    dst = torch.empty(4096, dtype=torch.uint8, device=f"cuda:{other}")
    with pytest.raises(ferry.InvalidArgument, match=f"dst is on cuda:{other}, but this client copies to "
                                                    f"cuda:{gpu.device}"):
        gpu.copy_(dst, gpu.empty(4096, torch.uint8))


def test_the_client_names_its_gpu(gpu: ferry.Client) -> None:
    """ferryd knows the client's GPU by its UUID, the one torch reports for the same device."""
    props = torch.cuda.get_device_properties(gpu.device)
    uuid = getattr(props, "uuid", None)
    assert gpu.gpu_uuid.startswith("GPU-")
    if uuid is not None:
        assert gpu.gpu_uuid.lower() == f"GPU-{str(uuid).removeprefix('GPU-')}".lower(), (gpu.gpu_uuid, str(uuid))
    assert gpu.status()["gpu_uuid"] == gpu.gpu_uuid


EXPANDABLE_PROBE = textwrap.dedent("""
    import json, sys
    import torch, ferry
    out = {}
    c = ferry.Client(sys.argv[1])
    torch.cuda.set_device(c.device)
    n = (4 << 20) + 3
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    p = x.data_ptr()
    segments = [s for s in torch.cuda.memory_snapshot() if s["address"] <= p < s["address"] + s["total_size"]]
    out["is_expandable"] = segments[0].get("is_expandable") if segments else None
    host = c.empty(n, torch.uint8)
    data = torch.randint(0, 256, (n,), dtype=torch.uint8)
    host.copy_(data)
    for name, call in (("copy_", lambda: c.copy_(x, host).wait(60)),
                       ("copy_staged_", lambda: c.copy_staged_(x, data))):
        try:
            call()
            out[name] = ["ok", ""]
        except ferry.Error as e:
            out[name] = [type(e).__name__, str(e)]
    d = c.empty_device(n, torch.uint8)
    d.fill_(0xA5)
    torch.cuda.synchronize()
    c.copy_(d, host).wait(60)
    out["empty_device_h2d"] = bool(torch.equal(d.cpu(), data))
    back = c.empty(n, torch.uint8)
    back.fill_(0xA5)
    c.copy_(back, d).wait(60)
    out["empty_device_d2h"] = bool(torch.equal(back, data))
    print(json.dumps(out))
""")


def test_expandable_segments(gpu_ferryd: Ferryd) -> None:
    """PyTorch's expandable_segments maps memory that has no CUDA IPC handle: copies to it raise
    ferry.NotSupported naming the setting, and client.empty_device works instead."""
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    run = subprocess.run([sys.executable, "-c", EXPANDABLE_PROBE, gpu_ferryd.socket], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, f"the probe failed:\n{run.stdout}\n{run.stderr}"
    out = json.loads(run.stdout.strip().splitlines()[-1])
    if out["is_expandable"] is not None:
        assert out["is_expandable"] is True, f"torch did not use expandable segments: {out}"
    for call in ("copy_", "copy_staged_"):
        kind, message = out[call]
        assert kind == "NotSupported", f"{call}: {kind}: {message}"
        assert "expandable_segments" in message and "client.empty_device()" in message, message
    assert out["empty_device_h2d"] and out["empty_device_d2h"], out
