"""One ferryd, several GPUs: a client per GPU, named by ``device=``; on the host backend the GPUs
(and their NUMA nodes) are simulated, so this runs everywhere."""

from __future__ import annotations

import threading

import pytest
import torch

import ferry
from bytecheck import assert_bytes, fill_random, poison
from ferryd_process import FerrydFactory

MiB = 1 << 20
TWO_GPUS = "host:\n  gpus: 2\n  numa_nodes: 2\n"


def round_trip(c: ferry.Client, nbytes: int, gen: torch.Generator) -> None:
    """Pool tensor -> the client's (simulated) GPU -> another pool tensor, random data, poisoned
    destinations, every byte checked."""
    src = c.empty(nbytes, dtype=torch.uint8)
    back = c.empty(nbytes, dtype=torch.uint8)
    dev = c.empty_device(nbytes, dtype=torch.uint8)
    fill_random(src, gen)
    poison(dev)
    poison(back)
    c.copy_(dev, src).wait(30)
    assert_bytes(dev, src)
    c.copy_(back, dev).wait(30)
    assert_bytes(back, src)


def test_a_client_per_gpu_copies_on_its_gpu(make_ferryd: FerrydFactory, gen: torch.Generator) -> None:
    d = make_ferryd("host", config=TWO_GPUS)
    with d.client(device=0) as c0, d.client(device="cuda:1") as c1:
        assert (c0.device, c0.gpu_uuid, c0.numa_node) == (0, "host-gpu-0", 0)
        assert (c1.device, c1.gpu_uuid, c1.numa_node) == (1, "host-gpu-1", 1)
        assert c1.status()["gpu_uuid"] == "host-gpu-1"
        errors: list[BaseException] = []

        def run(c: ferry.Client, n: int, seed: int) -> None:
            g = torch.Generator().manual_seed(seed)
            try:
                for _ in range(5):
                    round_trip(c, n, g)
            except BaseException as e:  # reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=run, args=(c0, 3 * MiB + 5, 1)),
                   threading.Thread(target=run, args=(c1, 2 * MiB + 7, 2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors


@pytest.mark.parametrize("device", [torch.device("cuda", 1), "cuda:1", 1])
def test_device_spellings(make_ferryd: FerrydFactory, device: object) -> None:
    d = make_ferryd("host", config=TWO_GPUS)
    with d.client(device=device) as c:
        assert c.gpu_uuid == "host-gpu-1"


@pytest.mark.parametrize("device", ["cpu", "cuda:x", -1, True, torch.device("cpu")])
def test_a_bad_device_is_refused_before_connecting(make_ferryd: FerrydFactory, device: object) -> None:
    d = make_ferryd("host", config=TWO_GPUS)
    with pytest.raises(ferry.InvalidArgument):
        d.client(device=device)


def test_a_gpu_ferryd_does_not_serve_is_refused_by_name(make_ferryd: FerrydFactory) -> None:
    d = make_ferryd("host", config=TWO_GPUS)
    with pytest.raises(ferry.NotFound, match="host-gpu-5 is not one this ferryd serves"):
        d.client(device=5)
