"""Edges a second reader found: addresses reused after a free, close() racing another thread's
copies, timeouts of every size, shapes that are not shapes."""

from __future__ import annotations

import gc
import math
import threading

import pytest
import torch

import ferry
from bytecheck import assert_bytes, fill_random, poison
from ferryd_process import FerrydFactory


def test_a_buffer_at_a_freed_buffers_address_is_found_at_every_offset(client: ferry.Client,
                                                                       gen: torch.Generator) -> None:
    """Small pool buffers and device stand-ins freed, a big one made (the kernel often maps it over
    their addresses): a slice anywhere in the big one copies, whatever entries the freed ones left."""
    small_pool = [client.empty(4096, torch.uint8) for _ in range(4)]
    small_dev = [client.empty_device(4096, torch.uint8) for _ in range(4)]
    del small_pool, small_dev
    gc.collect()
    big = client.empty(1 << 20, torch.uint8)
    dev = client.empty_device(1 << 20, torch.uint8)
    for offset in (0, 4096 + 16, 3 * 4096 + 5, (1 << 20) - 1024):
        data = fill_random(big[offset:offset + 1024], gen)
        poison(dev)
        client.copy_(dev[offset:offset + 1024], big[offset:offset + 1024]).wait(timeout=30)
        assert_bytes(dev[offset:offset + 1024], data, f"slice at {offset}")


def test_close_while_another_thread_copies_ends_its_calls_cleanly(client: ferry.Client,
                                                                  gen: torch.Generator) -> None:
    """close() on one thread while another submits copies: each of that thread's calls either
    completes with every byte or raises ferry.Aborted; nothing else, and no crash."""
    n = 8 << 20
    dev = client.empty_device(n, torch.uint8)
    src = torch.empty(n, dtype=torch.uint8)
    data = fill_random(src, gen)
    outcomes: list[str] = []
    started = threading.Event()

    def copier() -> None:
        try:
            while True:
                client.copy_staged_(dev, src)
                outcomes.append("ok")
                started.set()
        except ferry.Aborted:
            outcomes.append("aborted")
        except BaseException as e:  # noqa: BLE001 - reported below
            outcomes.append(f"{type(e).__name__}: {e}")
        finally:
            started.set()

    worker = threading.Thread(target=copier)
    worker.start()
    assert started.wait(timeout=60)
    client.close()
    worker.join(timeout=60)
    assert not worker.is_alive()
    assert outcomes[-1] == "aborted", outcomes[-3:]
    assert all(o == "ok" for o in outcomes[:-1]), outcomes
    assert_bytes(dev, data, "the last staged copy that completed")


def test_timeouts_of_every_size(client: ferry.Client, gen: torch.Generator) -> None:
    """wait(): None, inf and a huge number mean no limit; NaN and negatives are refused; the
    Client's connect timeout likewise."""
    host = client.empty(1 << 20, torch.uint8)
    dev = client.empty_device(1 << 20, torch.uint8)
    data = fill_random(host, gen)
    for timeout in (None, math.inf, 1e300, 1e10, 30.0):
        poison(dev)
        client.copy_(dev, host).wait(timeout=timeout)
        assert_bytes(dev, data, f"wait({timeout})")
    t = client.copy_(dev, host)
    for bad in (math.nan, -1.0):
        with pytest.raises(ferry.InvalidArgument, match="timeout must be a number of seconds"):
            t.wait(timeout=bad)
    t.wait()
    with pytest.raises(ferry.InvalidArgument, match="timeout must be a number of seconds"):
        ferry.Client(client.status()["socket"], timeout=math.nan)
    with ferry.Client(client.status()["socket"], timeout=math.inf) as other:
        assert other.status()["backend"] == client.backend


@pytest.mark.parametrize("shape", [-4, (2, -3), (2.5,), (True,)], ids=str)
def test_shapes_that_are_not_shapes_are_refused(client: ferry.Client, shape: object) -> None:
    with pytest.raises(ferry.InvalidArgument, match="every size must be an int >= 0"):
        client.empty(shape, torch.uint8)  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgument, match="every size must be an int >= 0"):
        client.empty_array(shape, "uint8")  # type: ignore[arg-type]
    with pytest.raises(ferry.InvalidArgument, match="every size must be an int >= 0"):
        client.empty_device(shape, torch.uint8)  # type: ignore[arg-type]


def test_empty_tensors_are_nothing_to_copy(client: ferry.Client) -> None:
    host = client.empty(0, torch.uint8)
    dev = client.empty_device(0, torch.uint8)
    with pytest.raises(ferry.InvalidArgument, match="nothing to copy"):
        client.copy_(dev, host)
    with pytest.raises(ferry.InvalidArgument, match="nothing to copy"):
        client.copy_staged_(dev, torch.empty(0, dtype=torch.uint8))


def test_a_spinning_wait_sees_every_byte_and_keeps_its_timeout(make_ferryd: FerrydFactory,
                                                              gen: torch.Generator) -> None:
    """wait(spin=True) polls instead of sleeping: the bytes are there when it returns, and a copy
    that cannot finish (ferryd stopped) still times out, with the timeout it was given."""
    d = make_ferryd()
    with d.client() as c:
        host = c.empty((3 << 20) + 5, torch.uint8)
        dev = c.empty_device((3 << 20) + 5, torch.uint8)
        for _ in range(3):
            data = fill_random(host, gen)
            poison(dev)
            c.copy_(dev, host).wait(timeout=30, spin=True)
            assert_bytes(dev, data, "after a spinning wait")
        d.pause()
        try:
            t = c.copy_(dev, host)
            with pytest.raises(ferry.Timeout, match=r"copy not done after 0\.3"):
                t.wait(timeout=0.3, spin=True)
        finally:
            d.resume()
        t.wait(timeout=30, spin=True)
