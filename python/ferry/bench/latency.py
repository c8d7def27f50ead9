"""The 4 KiB round trip from Python against the same round trip in C++.

Python: ``client.copy_(dst, src).wait()`` timed with ``time.perf_counter_ns``. C++:
``client.time_round_trips`` (libferry's Copy and Wait in a loop, steady_clock, no Python), between
the same two buffers, in the same latency class. The two run in alternating blocks so that drift
of the machine falls on both. Target: Python's p50 within 3 us of C++'s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from ._progress import Progress
from ._rig import Rig
from ._stats import Summary, summarize

NBYTES = 4096
BLOCK = 50  # round trips per alternating block
TARGET_US = 3.0


@dataclass
class LatencyRow:
    """One direction: Python's and C++'s round trips, in seconds."""

    direction: str
    python: Summary
    cpp: Summary
    checked: bool

    @property
    def delta_us(self) -> float:
        """Python's p50 minus C++'s, microseconds."""
        return (self.python.median - self.cpp.median) * 1e6

    def as_dict(self) -> dict[str, Any]:
        """For JSON."""
        return {"direction": self.direction, "bytes": NBYTES, "python_seconds": self.python.as_dict(),
                "cpp_seconds": self.cpp.as_dict(), "p50_delta_us": self.delta_us, "checked": self.checked}


def _check(rig: Rig, dst: torch.Tensor, src: torch.Tensor, rng: numpy.random.Generator) -> bool:
    """One copy of fresh random bytes into a poisoned destination, every byte compared."""
    data = torch.from_numpy(rng.integers(0, 256, NBYTES, dtype=numpy.uint8))
    src.copy_(data)
    dst.fill_(0xFF)
    rig.sync()
    rig.client.copy_(dst, src).wait()
    got = dst.cpu() if dst.is_cuda else dst
    return torch.equal(got, data)


def measure(rig: Rig, reps: int, warmup: int, progress: Progress) -> list[LatencyRow]:
    """Both directions at 4 KiB: ``reps`` round trips each from Python and from C++."""
    client = rig.client
    pool = client.empty(NBYTES, torch.uint8)
    dev = rig.device_bytes(NBYTES)
    rng = numpy.random.default_rng()
    rows = []
    for direction, dst, src in (("h2d", dev, pool), ("d2h", pool, dev)):
        checked = _check(rig, dst, src, rng)
        for _ in range(warmup):
            client.copy_(dst, src).wait()
        client.time_round_trips(dst, src, warmup)
        py_ns: list[int] = []
        cpp_ns: list[int] = []
        while len(py_ns) < reps:
            count = min(BLOCK, reps - len(py_ns))
            for _ in range(count):
                t0 = time.perf_counter_ns()
                client.copy_(dst, src).wait()
                py_ns.append(time.perf_counter_ns() - t0)
            cpp_ns.extend(client.time_round_trips(dst, src, count))
        rows.append(LatencyRow(direction, summarize([x / 1e9 for x in py_ns]), summarize([x / 1e9 for x in cpp_ns]),
                               checked and _check(rig, dst, src, rng)))
        progress.step(f"{direction} 4 KiB round trips")
    return rows


def verdict(rows: list[LatencyRow]) -> tuple[str, bool]:
    """The target's one line, and whether it was met (both directions)."""
    if not rows:
        return "Python 4 KiB p50 within 3 us of C++: not measured", False
    worst = max(rows, key=lambda r: r.delta_us)
    met = worst.delta_us <= TARGET_US
    figs = ", ".join(f"{r.direction} {r.delta_us:+.2f} us" for r in rows)
    return (f"Python 4 KiB round trip p50 within {TARGET_US:g} us of C++ (libferry): "
            f"{'met' if met else 'NOT MET'} ({figs})"), met


def table(rows: list[LatencyRow]) -> str:
    """The latency rows as text."""
    lines = ["4 KiB round trips (copy_ + wait from Python vs client.time_round_trips in C++, latency class), us:",
             f"  {'dir':<4} {'python p50':>11} {'p99':>9} {'min':>9} {'C++ p50':>9} {'p99':>9} {'min':>9}"
             f" {'delta p50':>10}  check"]
    for r in rows:
        p, c = r.python, r.cpp
        lines.append(f"  {r.direction:<4} {p.median * 1e6:11.2f} {p.p99 * 1e6:9.2f} {p.min * 1e6:9.2f} "
                     f"{c.median * 1e6:9.2f} {c.p99 * 1e6:9.2f} {c.min * 1e6:9.2f} {r.delta_us:+10.2f}  "
                     f"{'ok' if r.checked else 'FAILED'}")
    return "\n".join(lines)
