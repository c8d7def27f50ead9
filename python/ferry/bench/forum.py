"""``python -m ferry.bench forum``: the PyTorch forum's "fastest way to transfer tensors from CPU
to GPU" experiment, measured with warm-up, repetitions and a byte check.

Tensors of shape (24, 2, 1, seq, 4096) float16 (0.375 MiB per seq; 392 MiB at seq 1046) go
host to device and back by each way a PyTorch user has:

h2d: torch pageable ``.to('cuda')``; ``pin_memory()`` then ``.to('cuda', non_blocking=True)``
(pinning timed on its own too); a pre-pinned tensor's ``.to('cuda', non_blocking=True)``; a ferry
pool tensor (``client.empty``) ``copy_`` into a CUDA tensor and ``wait(spin=True)`` (torch's
synchronize spins too); ferry ``copy_staged_``
from the pageable tensor.
d2h: ``.to('cpu')`` (a fresh pageable tensor each call), ``copy_`` into a reused pageable tensor,
into a pre-pinned tensor (non_blocking), a ferry pool tensor, and ferry ``copy_staged_``.

Each (path, size) runs ``warmup`` untimed calls, then ``reps`` timed ones; then one more call
with other random bytes in the source and, where the destination exists beforehand, 0xFF in it,
whose result is compared byte for byte. Measurement here; tables, targets, files in
:mod:`ferry.bench._forum_report`.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy
import torch

from ._progress import Progress
from ._rig import Rig
from ._stats import Sample, Summary, explain_outliers, median, summarize, timed

DTYPE = torch.float16
DEFAULT_SEQS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1046)
QUICK_SEQS = (1, 16, 64)
MIB = 1 << 20


def shape(seq: int) -> tuple[int, ...]:
    """The forum's tensor shape for a sequence length."""
    return (24, 2, 1, seq, 4096)


def nbytes(seq: int) -> int:
    """Bytes of one tensor of :func:`shape` ``(seq)`` in float16."""
    return math.prod(shape(seq)) * 2


@dataclass(frozen=True)
class Path:
    """One way of copying: ``key`` is stable (CSV, JSON), ``label`` is for people."""

    key: str
    direction: str  # "h2d" | "d2h"
    label: str
    torch_gpu: bool  # needs torch's CUDA (skipped on the host backend)
    ferry: bool
    derived: bool = False  # figures taken from another path's samples (pinning alone)


PATHS = (
    Path("torch_pageable", "h2d", "torch pageable .to('cuda')", True, False),
    Path("torch_pin_copy", "h2d", "torch pin_memory() + .to(non_blocking)", True, False),
    Path("torch_pin_alone", "h2d", "  pin_memory() alone (of the above)", True, False, derived=True),
    Path("torch_pinned", "h2d", "torch pre-pinned .to(non_blocking)", True, False),
    Path("ferry_pool", "h2d", "ferry pool tensor copy_ + wait(spin)", False, True),
    Path("ferry_staged", "h2d", "ferry copy_staged_ from pageable", False, True),
    Path("torch_pageable", "d2h", "torch .to('cpu') (fresh pageable)", True, False),
    Path("torch_pageable_reused", "d2h", "torch pageable copy_ (reused dst)", True, False),
    Path("torch_pinned", "d2h", "torch pre-pinned copy_(non_blocking)", True, False),
    Path("ferry_pool", "d2h", "ferry pool tensor copy_ + wait(spin)", False, True),
    Path("ferry_staged", "d2h", "ferry copy_staged_ to pageable", False, True),
)


@dataclass
class Row:
    """One path at one size: the timed samples' summary, the first call, the byte check."""

    path: Path
    seq: int
    nbytes: int
    summary: Summary
    samples: list[Sample]
    first_s: float = float("nan")  # the first warm-up call, excluded from the summary
    checked: Optional[bool] = None  # None: nothing of its own to check (pinning alone)
    bad_bytes: int = 0
    note: str = ""
    pin: Optional[Summary] = None

    @property
    def gbps(self) -> float:
        """10^9 bytes per second at the median."""
        return self.nbytes / self.summary.median / 1e9 if self.summary.median > 0 else 0.0


class _Buffers:
    """Everything the paths copy from and to, allocated once at the largest size and sliced."""

    def __init__(self, rig: Rig, max_bytes: int, seed: int) -> None:
        rng = numpy.random.default_rng(seed)
        self.a = torch.from_numpy(rng.integers(0, 256, max_bytes, dtype=numpy.uint8))  # timed calls
        self.b = torch.from_numpy(rng.integers(0, 256, max_bytes, dtype=numpy.uint8))  # the checked call
        self.pool = rig.client.empty(max_bytes, torch.uint8)
        self.dev = rig.device_bytes(max_bytes)
        self.page = torch.empty(max_bytes, dtype=torch.uint8)
        self.pinned = torch.empty(max_bytes, dtype=torch.uint8, pin_memory=True) if rig.gpu else None


class _Case:
    """One path at one size: ``load`` puts bytes where the path reads, ``poison`` fills a
    destination that exists before the call, calling it runs one copy to completion."""

    def __init__(self, rig: Rig, bufs: _Buffers, path: Path, seq: int) -> None:
        self.rig, self.path, self.n, self.shape = rig, path, nbytes(seq), shape(seq)
        self.b = bufs
        self.src_pageable = self._t(bufs.a)
        self.result: Optional[torch.Tensor] = None
        self.run: Callable[[], Optional[int]] = getattr(self, f"_{path.direction}_{path.key}")

    def _t(self, buf: torch.Tensor) -> torch.Tensor:
        return buf[: self.n].view(DTYPE).view(self.shape)

    def load(self, content: torch.Tensor) -> None:
        """Makes the path's source hold ``content`` (uint8, n bytes)."""
        d, k = self.path.direction, self.path.key
        if d == "d2h":
            self.b.dev[: self.n].copy_(content)
            self.rig.sync()
        elif k in ("torch_pageable", "torch_pin_copy", "ferry_staged"):
            self.src_pageable = content.view(DTYPE).view(self.shape)
        elif k == "torch_pinned":
            self.b.pinned[: self.n].copy_(content)
        elif k == "ferry_pool":
            self.b.pool[: self.n].copy_(content)

    def poison(self) -> None:
        """0xFF in the destination where it exists before the call (``.to()`` makes a new one)."""
        d, k = self.path.direction, self.path.key
        dst = {("h2d", "ferry_pool"): self.b.dev, ("h2d", "ferry_staged"): self.b.dev,
               ("d2h", "torch_pageable_reused"): self.b.page, ("d2h", "torch_pinned"): self.b.pinned,
               ("d2h", "ferry_pool"): self.b.pool, ("d2h", "ferry_staged"): self.b.page}.get((d, k))
        if dst is not None:
            dst[: self.n].fill_(0xFF)
            self.rig.sync()

    # h2d: each returns once the bytes are on the device; the result is kept for the check.
    def _h2d_torch_pageable(self) -> None:
        self.result = self.src_pageable.to(self.rig.device)
        self.rig.sync()

    def _h2d_torch_pin_copy(self) -> int:
        t0 = time.perf_counter_ns()
        pinned = self.src_pageable.pin_memory()
        pin_ns = time.perf_counter_ns() - t0
        self.result = pinned.to(self.rig.device, non_blocking=True)
        self.rig.sync()
        return pin_ns

    def _h2d_torch_pinned(self) -> None:
        self.result = self._t(self.b.pinned).to(self.rig.device, non_blocking=True)
        self.rig.sync()

    def _h2d_ferry_pool(self) -> None:
        self.result = self._t(self.b.dev)
        self.rig.client.copy_(self.result, self._t(self.b.pool), stream_waitable=self.rig.stream_waitable).wait(spin=True)

    def _h2d_ferry_staged(self) -> None:
        self.result = self._t(self.b.dev)
        self.rig.client.copy_staged_(self.result, self.src_pageable)

    # d2h
    def _d2h_torch_pageable(self) -> None:
        self.result = self._t(self.b.dev).to("cpu")
        self.rig.sync()

    def _d2h_torch_pageable_reused(self) -> None:
        self.result = self._t(self.b.page)
        self.result.copy_(self._t(self.b.dev))
        self.rig.sync()

    def _d2h_torch_pinned(self) -> None:
        self.result = self._t(self.b.pinned)
        self.result.copy_(self._t(self.b.dev), non_blocking=True)
        self.rig.sync()

    def _d2h_ferry_pool(self) -> None:
        self.result = self._t(self.b.pool)
        self.rig.client.copy_(self.result, self._t(self.b.dev), stream_waitable=self.rig.stream_waitable).wait(spin=True)

    def _d2h_ferry_staged(self) -> None:
        self.result = self._t(self.b.page)
        self.rig.client.copy_staged_(self.result, self._t(self.b.dev))

    def differing_bytes(self, expected: torch.Tensor) -> int:
        """Bytes of the last result that differ from ``expected`` (uint8, n bytes)."""
        assert self.result is not None
        got = self.result.reshape(-1).view(torch.uint8)
        got = got.cpu() if got.is_cuda else got
        if torch.equal(got, expected):
            return 0
        return int(numpy.count_nonzero(got.numpy() != expected.numpy()))


def _note(path: Path, summary: Summary, samples: list[Sample], first_s: float, bad: int) -> str:
    parts = []
    if bad:
        parts.append(f"CHECK FAILED: {bad} bytes differ")
    if first_s > 1.5 * summary.median > 0:
        parts.append(f"first call {first_s * 1e3:.2f} ms (warm-up, excluded)")
    out = explain_outliers(samples, summary)
    if out:
        parts.append(out)
    faults = median([s.faults for s in samples])
    if path.direction == "d2h" and path.key == "torch_pageable" and faults > 0:
        parts.append(f"fresh pageable destination: {faults:.0f} page faults per call")
    if path.key == "torch_pin_copy":
        pin = median([s.pin_ns for s in samples]) / 1e9
        parts.append(f"pinning {pin * 1e3:.2f} ms of it ({100 * pin / summary.median:.0f}%)" if summary.median else "")
    return "; ".join(p for p in parts if p)


def measure(rig: Rig, bufs: _Buffers, path: Path, seq: int, reps: int, warmup: int) -> list[Row]:
    """Times ``path`` at ``seq`` and checks its bytes once; two rows for pin-then-copy (the copy,
    and pinning alone)."""
    case = _Case(rig, bufs, path, seq)
    n = case.n
    case.load(bufs.a[:n])
    first: Optional[Sample] = None
    for _ in range(warmup):
        s = timed(case.run)
        first = first or s
    first_s = first.ns / 1e9 if first else float("nan")
    samples = [timed(case.run) for _ in range(reps)]
    summary = summarize([s.ns / 1e9 for s in samples])
    # The checked call: other random bytes in, poison in the destination, every byte compared.
    case.load(bufs.b[:n])
    case.poison()
    case.run()
    bad = case.differing_bytes(bufs.b[:n])
    case.result = None
    row = Row(path, seq, n, summary, samples, first_s, checked=bad == 0, bad_bytes=bad,
              note=_note(path, summary, samples, first_s, bad))
    rows = [row]
    if path.key == "torch_pin_copy":
        pin = summarize([s.pin_ns / 1e9 for s in samples])
        row.pin = pin
        alone = next(p for p in PATHS if p.key == "torch_pin_alone")
        pin_samples = [Sample(ns=s.pin_ns, faults=s.faults) for s in samples]
        rows.append(Row(alone, seq, n, pin, pin_samples, first_s=first.pin_ns / 1e9 if first else float("nan"),
                        checked=None, note=explain_outliers(pin_samples, pin)))
    return rows


@dataclass
class ForumResult:
    """Every row, in the order measured, with what made them."""

    rows: list[Row] = field(default_factory=list)
    seqs: tuple[int, ...] = ()
    reps: int = 0
    warmup: int = 0
    seed: int = 0
    skipped: list[str] = field(default_factory=list)

    @property
    def checks_passed(self) -> bool:
        """True when no checked row had a differing byte."""
        return all(r.checked is not False for r in self.rows)


def run(rig: Rig, seqs: tuple[int, ...], reps: int, warmup: int, progress: Progress) -> ForumResult:
    """Measures every path that can run here at every sequence length in ``seqs``."""
    seed = int.from_bytes(os.urandom(8), "little")
    out = ForumResult(seqs=seqs, reps=reps, warmup=warmup, seed=seed)
    bufs = _Buffers(rig, max(nbytes(s) for s in seqs), seed)
    runnable = [p for p in PATHS if not p.derived and (rig.gpu or not p.torch_gpu)]
    out.skipped = [f"{p.direction} {p.label.strip()}" for p in PATHS if p.torch_gpu and not rig.gpu]
    for seq in seqs:
        for path in runnable:
            out.rows.extend(measure(rig, bufs, path, seq, reps, warmup))
            progress.step(f"{path.direction} {path.key} {nbytes(seq) / MIB:.2f} MiB")
    return out


def progress_steps(rig: Rig, seqs: tuple[int, ...]) -> int:
    """How many steps :func:`run` reports to its progress bar."""
    return len(seqs) * sum(1 for p in PATHS if not p.derived and (rig.gpu or not p.torch_gpu))
