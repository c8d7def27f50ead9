"""The session: status(), the context manager, other threads while one waits, ferryd dying."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable, Iterator

import pytest
import torch

import ferry
from bytecheck import assert_bytes, fill_random, poison
from ferryd_process import Ferryd, FerrydFactory

MiB = 1 << 20


def wait_for_counters(c: ferry.Client, at_least: dict[str, int], timeout: float = 30.0) -> dict[str, Any]:
    """Polls status() until each counter reaches its value: ferryd counts a copy when its loop
    finishes it, which may come just after the client saw the copy done."""
    deadline = time.monotonic() + timeout
    while True:
        s = c.status()
        short = {k: (s[k], v) for k, v in at_least.items() if s[k] < v}
        if not short:
            return s
        assert time.monotonic() < deadline, f"after {timeout} s, (counter, expected): {short}"
        time.sleep(0.01)


def test_status_fields(ferryd: Ferryd, client: ferry.Client, backend: str, gen: torch.Generator) -> None:
    s = client.status()
    assert set(s) == {"backend", "device", "gpu_uuid", "numa_node", "session_id", "socket", "sessions", "copies_completed", "bytes_h2d",
                      "bytes_d2h", "pool_bytes", "pool_free_bytes", "evictions", "rejected"}
    assert s["backend"] == backend == client.backend
    assert s["device"] == client.device and isinstance(s["device"], int) and s["device"] >= 0
    assert s["socket"] == ferryd.socket
    assert s["pool_bytes"] == ferryd.pool_bytes
    assert 0 <= s["pool_free_bytes"] <= s["pool_bytes"]
    assert s["sessions"] >= 1 and s["session_id"] > 0
    for key in ("copies_completed", "bytes_h2d", "bytes_d2h", "evictions", "rejected"):
        assert isinstance(s[key], int) and s[key] >= 0

    # A second session: its own id, counted among the sessions.
    with ferryd.client() as other:
        assert other.status()["session_id"] != s["session_id"]
        assert other.status()["sessions"] >= 2

    # The copy counters move by exactly what this test copies (it is alone on this ferryd).
    n_up, n_down = 3 * MiB + 5, 65537
    host = client.empty(n_up, torch.uint8)
    device = client.empty_device(n_up, torch.uint8)
    fill_random(host, gen)
    before = client.status()
    client.copy_(device, host).wait(timeout=30)
    client.copy_(host[:n_down], device[:n_down]).wait(timeout=30)
    after = wait_for_counters(client, {"bytes_h2d": before["bytes_h2d"] + n_up,
                                       "bytes_d2h": before["bytes_d2h"] + n_down,
                                       "copies_completed": before["copies_completed"] + 2})
    assert after["bytes_h2d"] - before["bytes_h2d"] == n_up
    assert after["bytes_d2h"] - before["bytes_d2h"] == n_down
    assert after["copies_completed"] - before["copies_completed"] == 2
    assert after["rejected"] == before["rejected"] and after["evictions"] == before["evictions"]


def test_pool_bytes_follow_allocations(make_ferryd: FerrydFactory) -> None:
    d = make_ferryd(pool_size="16MiB")
    with d.client() as c:
        assert c.status()["pool_free_bytes"] == 16 * MiB
        t = c.empty(3 * MiB, torch.uint8)
        assert c.status()["pool_free_bytes"] == 13 * MiB  # three slabs granted to this session
        del t


def test_context_manager_closes(ferryd: Ferryd, gen: torch.Generator) -> None:
    with ferryd.client(name="with-block") as c:
        assert isinstance(c, ferry.Client) and not c.closed
        host = c.empty(4097, torch.uint8)
        device = c.empty_device(4097, torch.uint8)
        data = fill_random(host, gen)
        poison(device)
        c.copy_(device, host).wait(timeout=30)
    assert c.closed
    assert_bytes(device, data, "device tensor copied inside the with block")
    with pytest.raises(ferry.Aborted):
        c.copy_(device, host)
    with pytest.raises(ferry.Aborted):
        c.status()


def test_context_manager_closes_on_an_exception(ferryd: Ferryd) -> None:
    with pytest.raises(KeyError):
        with ferryd.client() as c:
            raise KeyError("inside")
    assert c.closed


@pytest.fixture
def no_forced_switches() -> Iterator[None]:
    """Stops the interpreter from handing the GIL to another thread on its own (every 5 ms by
    default): a second thread then runs only where the running thread releases the GIL itself,
    as ferry's blocking calls must."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)


COUNT = 200_000


def warm_up(c: ferry.Client, device: torch.Tensor, host: torch.Tensor) -> None:
    """A first bulk copy between the two tensors: it registers the device memory and sets up what
    bulk copies need, round trips to ferryd that a later copy then does not make. After it, a copy
    goes into the submission ring alone, and returns even while ferryd is stopped."""
    c.copy_(device[:4096], host[:4096], priority="bulk").wait(timeout=30)


def run_while_blocked(ferryd: Ferryd, blocking_call: Callable[[], None]) -> int:
    """Runs ``blocking_call`` with ferryd paused; a second Python thread, set going just before
    the call, counts to COUNT and only then lets ferryd go on. The call can return only after the
    counter thread ran, which it can only while the call has the GIL released. Returns the count.
    """
    count = 0
    go = threading.Event()
    failure: list[BaseException] = []

    def counter() -> None:
        nonlocal count
        try:
            go.wait()
            for _ in range(COUNT):
                count += 1
        except BaseException as e:  # pragma: no cover (reported below)
            failure.append(e)
        finally:
            ferryd.resume()

    thread = threading.Thread(target=counter, name="counter", daemon=True)
    thread.start()
    try:
        go.set()
        blocking_call()
    finally:
        go.set()
        thread.join(timeout=60)
        if ferryd.paused:
            ferryd.resume()
    assert not thread.is_alive() and not failure, failure
    return count


def test_another_thread_runs_while_a_transfer_waits(ferryd: Ferryd, client: ferry.Client, gen: torch.Generator,
                                                   no_forced_switches: None) -> None:
    host = client.empty(8 * MiB + 1, torch.uint8)
    device = client.empty_device(8 * MiB + 1, torch.uint8)
    warm_up(client, device, host)
    data = fill_random(host, gen)
    poison(device)
    ferryd.pause()
    transfer = client.copy_(device, host)  # goes into the submission ring; ferryd is stopped
    assert not transfer.done(), "a copy completed while ferryd was stopped"
    count = run_while_blocked(ferryd, lambda: transfer.wait(timeout=120))
    assert count == COUNT
    assert transfer.done()
    assert_bytes(device, data, "device tensor")


def test_another_thread_runs_during_copy_staged(ferryd: Ferryd, client: ferry.Client, gen: torch.Generator,
                                               no_forced_switches: None) -> None:
    pageable = torch.empty(8 * MiB + 3, dtype=torch.uint8)
    device = client.empty_device(8 * MiB + 3, torch.uint8)
    client.copy_staged_(device[:1], pageable[:1])  # registers the device memory, takes staging buffers
    data = fill_random(pageable, gen)
    poison(device)
    ferryd.pause()
    count = run_while_blocked(ferryd, lambda: client.copy_staged_(device, pageable))
    assert count == COUNT
    assert_bytes(device, data, "device tensor")


def test_wait_times_out_while_ferryd_is_stopped(ferryd: Ferryd, client: ferry.Client) -> None:
    host = client.empty(MiB, torch.uint8)
    device = client.empty_device(MiB, torch.uint8)
    warm_up(client, device, host)
    ferryd.pause()
    try:
        transfer = client.copy_(device, host)
        started = time.monotonic()
        with pytest.raises(ferry.Timeout) as e:
            transfer.wait(timeout=0.3)
        assert time.monotonic() - started >= 0.3
        assert isinstance(e.value, TimeoutError) and "not done" in str(e.value)
        assert not transfer.done()
    finally:
        ferryd.resume()
    transfer.wait(timeout=60)


def restarted_and_checked(d: Ferryd, gen: torch.Generator) -> None:
    """Restarts the dead ferryd; a new client of it copies every byte both ways."""
    d.start()
    with d.client() as fresh:
        host = fresh.empty(2 * MiB + 3, torch.uint8)
        device = fresh.empty_device(2 * MiB + 3, torch.uint8)
        data = fill_random(host, gen)
        poison(device)
        fresh.copy_(device, host).wait(timeout=30)
        assert_bytes(device, data, "device tensor, through the restarted ferryd")
        data = fill_random(device, gen)
        poison(host)
        fresh.copy_(host, device).wait(timeout=30)
        assert_bytes(host, data, "pool tensor, through the restarted ferryd")


def test_ferryd_killed_mid_copy(make_ferryd: FerrydFactory, gen: torch.Generator) -> None:
    """SIGKILL while a submitted copy is not done: its wait raises ferry.Unavailable (observed:
    "ferryd went away (connection closed)"), and so does the next call."""
    d = make_ferryd(pool_size="128MiB")
    c = d.client()
    host = c.empty(8 * MiB + 1, torch.uint8)
    device = c.empty_device(8 * MiB + 1, torch.uint8)
    warm_up(c, device, host)
    data = fill_random(host, gen)
    d.pause()  # the copy cannot finish before the kill
    transfer = c.copy_(device, host)
    assert not transfer.done()
    d.kill()
    with pytest.raises(ferry.Unavailable) as e:
        transfer.wait(timeout=30)
    assert isinstance(e.value, ConnectionError) and "ferryd went away" in str(e.value), str(e.value)
    with pytest.raises(ferry.Unavailable) as e:
        c.copy_(device, host).wait(timeout=30)
    assert "ferryd went away" in str(e.value)
    with pytest.raises(ferry.Unavailable):
        c.status()
    # The pool tensor is this process's mapping: still valid with ferryd gone.
    assert_bytes(host, data, "pool tensor after ferryd died")
    data = fill_random(host, gen)
    assert_bytes(host, data, "pool tensor written after ferryd died")
    c.close()
    restarted_and_checked(d, gen)


def test_ferryd_killed_during_copy_staged(make_ferryd: FerrydFactory, gen: torch.Generator,
                                          no_forced_switches: None) -> None:
    """SIGKILL while copy_staged_ blocks (ferryd stopped, so it cannot have finished): it raises
    ferry.Unavailable."""
    d = make_ferryd(pool_size="128MiB")
    c = d.client()
    pageable = torch.empty(8 * MiB + 1, dtype=torch.uint8)
    device = c.empty_device(8 * MiB + 1, torch.uint8)
    c.copy_staged_(device[:1], pageable[:1])  # registers the device memory, takes staging buffers
    fill_random(pageable, gen)
    d.pause()
    go = threading.Event()
    killer = threading.Thread(target=lambda: (go.wait(), d.kill()), name="killer", daemon=True)
    killer.start()
    go.set()  # the killer runs once copy_staged_ has released the GIL (no forced switches)
    with pytest.raises(ferry.Unavailable) as e:
        c.copy_staged_(device, pageable)
    killer.join(timeout=60)
    assert isinstance(e.value, ConnectionError) and "ferryd went away" in str(e.value), str(e.value)
    c.close()
    restarted_and_checked(d, gen)


def test_clean_restart_ends_the_session(make_ferryd: FerrydFactory, gen: torch.Generator) -> None:
    """SIGTERM (ferryd's clean stop) ends sessions: the next call raises ferry.Unavailable."""
    d = make_ferryd(pool_size="32MiB")
    c = d.client()
    host = c.empty(4096, torch.uint8)
    device = c.empty_device(4096, torch.uint8)
    assert d.stop() == 0, d.log_tail()
    with pytest.raises(ferry.Unavailable):
        c.copy_(device, host).wait(timeout=30)
    c.close()
    restarted_and_checked(d, gen)
