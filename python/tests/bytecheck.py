"""Random data, poisoned destinations and every-byte comparisons for copy tests.

Every copy test writes random bytes into the source, fills the whole destination buffer (not
only the part the copy writes) with POISON, and then compares every byte of that buffer with
what it must hold: the copied bytes in place, the poison everywhere else.
"""

from __future__ import annotations

from typing import Any

import numpy
import torch

#: What a destination holds before a copy; bytes a copy must not touch still hold it after.
POISON = 0xA5


def byte_view(x: Any) -> torch.Tensor:
    """The bytes of a contiguous torch tensor or numpy array, as a flat uint8 tensor over the same
    memory (on the tensor's device)."""
    if isinstance(x, numpy.ndarray):
        assert x.flags.c_contiguous, "byte_view of a non-contiguous array"
        return torch.from_numpy(x.reshape(-1).view(numpy.uint8))
    assert x.is_contiguous(), "byte_view of a non-contiguous tensor"
    return x.reshape(-1).view(torch.uint8)


def random_bytes(n: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` random bytes (CPU, uint8), never all equal to POISON, so that a copy that did not
    happen cannot pass for one."""
    data = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=gen)
    if n and bool((data == POISON).all()):
        data[0] = POISON ^ 0xFF
    return data


def fill_random(x: Any, gen: torch.Generator) -> torch.Tensor:
    """Writes random bytes into every byte of ``x`` (in place) and returns them (CPU, uint8)."""
    view = byte_view(x)
    data = random_bytes(view.numel(), gen)
    view.copy_(data)
    return data


def poison(x: Any) -> None:
    """Fills every byte of ``x`` with POISON."""
    byte_view(x).fill_(POISON)


def poisoned_with(total: int, offset: int, data: torch.Tensor) -> torch.Tensor:
    """What a poisoned buffer of ``total`` bytes holds after ``data`` was copied in at ``offset``."""
    expected = torch.full((total,), POISON, dtype=torch.uint8)
    expected[offset:offset + data.numel()] = data
    return expected


def assert_bytes(actual: Any, expected: torch.Tensor, what: str = "bytes") -> None:
    """Asserts that every byte of ``actual`` (a tensor or array, any device) equals ``expected``.

    The message says how many differ, where the first one is, and whether the rest looks like
    poison (nothing was copied) or like other data.
    """
    got = byte_view(actual).cpu()
    want = expected.reshape(-1).to(torch.uint8).cpu()
    assert got.numel() == want.numel(), f"{what}: {got.numel()} bytes, expected {want.numel()}"
    if torch.equal(got, want):
        return
    wrong = (got != want).nonzero().reshape(-1)
    first = int(wrong[0])
    poisoned = int((got[wrong] == POISON).sum())
    raise AssertionError(
        f"{what}: {wrong.numel()} of {want.numel()} bytes differ, the first at byte {first} "
        f"(got {int(got[first]):#04x}, expected {int(want[first]):#04x}); {poisoned} of the wrong bytes hold "
        f"the poison {POISON:#04x}; wrong range {first}..{int(wrong[-1])}")
