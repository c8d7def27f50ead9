"""``python -m ferry.bench overlap``: the seed workload from PyTorch.

Each step computes C = A @ B (4096 x 4096 float32, cuBLAS) on the step stream and copies C
(64 MiB) to the host. The modes and words are those of ferry-bench's overlap (bench/overlap.cc):

- compute: the math alone (the reference); compute, cut in blocks: the same math in row blocks
  (``pieces`` blocks, each ``ratio`` of the one before, the last two equal) taking turns on
  ``lanes`` compute streams;
- copy alone: the copy without the math (torch on the step stream; ferry after an event);
- serial: the math, then the copy on the same stream, then the next step (no overlap);
- pipelined: the copy of step k runs under step k+1's math and the step stream waits for it at
  the end of step k+1 (double buffer): torch on a side stream into a pinned tensor, or ferry's
  ``copy_`` ``after=`` an event recorded after the math, into a pool tensor, waited for on the
  GPU (``client.stream_wait``) before its buffer is reused;
- in-step blocks: each block's copy starts when its block's math is done; all copies landed by
  the end of the step (torch: a side stream; ferry: one ``copy_`` after an event per block).

exposed copy time = median warm step with copies - median step of the math alone;
overlap = 1 - exposed / copy time. Every mode is checked: host destinations poisoned (0xFF) and
device outputs poisoned (0xFE) before two extra steps, then every word compared.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Optional

import numpy
import torch

from ._engine import Engine
from ._progress import Progress
from ._rig import Rig
from ._stats import median

SLOTS = 4  # steps whose events and transfers may be live at once (the host runs <= 2 steps ahead)
HOST_POISON, DEVICE_POISON = 0xFF, 0xFE


@dataclass(frozen=True)
class Mode:
    """One way of running the steps; ``strategy`` as ferry-bench names it."""

    key: str
    name: str
    path: str  # "in-process" | "ferry"
    strategy: str  # "compute" | "copy" | "serial" | "pipelined" | "in-step"
    torch_gpu: bool = False  # needs torch's CUDA (skipped on the host backend)

    @property
    def ferry(self) -> bool:
        return self.path == "ferry"

    @property
    def blocks(self) -> bool:
        return self.key in ("compute_blocks", "torch_in_step", "ferry_in_step")

    @property
    def compute(self) -> bool:
        return self.strategy != "copy"

    @property
    def copies(self) -> bool:
        return self.strategy != "compute"


MODES = (
    Mode("compute", "compute (math alone)", "in-process", "compute"),
    Mode("compute_blocks", "compute, cut in blocks", "in-process", "compute"),
    Mode("torch_copy", "copy alone, in-process (torch)", "in-process", "copy", True),
    Mode("torch_serial", "in-process serial (torch)", "in-process", "serial", True),
    Mode("torch_side_stream", "in-process side stream (torch)", "in-process", "pipelined", True),
    Mode("torch_in_step", "in-process in-step blocks (torch)", "in-process", "in-step", True),
    Mode("ferry_copy", "ferry copy alone", "ferry", "copy"),
    Mode("ferry_serial", "ferry serial", "ferry", "serial"),
    Mode("ferry_pipelined", "ferry pipelined", "ferry", "pipelined"),
    Mode("ferry_in_step", "ferry in-step blocks", "ferry", "in-step"),
)


def row_blocks(n: int, pieces: int, ratio: float, align: int) -> list[tuple[int, int]]:
    """``pieces`` row blocks, each ``ratio`` of the one before, the last two equal, rounded to
    multiples of ``align`` rows (ferry-bench's GeometricColumns, in rows)."""
    pieces = max(1, pieces)
    w, x = [], 1.0
    for i in range(pieces):
        w.append(w[-1] if i == pieces - 1 and pieces > 1 else x)
        x *= ratio
    total, out, at = sum(w), [], 0
    for i in range(pieces):
        rows = max(math.floor(w[i] / total * n / align + 0.5) * align, align)  # C++ lround
        if i == pieces - 1 or at + rows > n:
            rows = n - at
        if rows <= 0:
            break
        out.append((at, at + rows))
        at += rows
    return out


@dataclass
class Check:
    """A correctness check with its bound fixed before the run; ``worst`` against it."""

    name: str
    what: str
    bound: float
    worst: float = 0.0
    passed: bool = True
    detail: str = ""
    runs: int = 0  # values seen: 0 means nothing of this kind ran

    def see(self, value: float, where: str) -> None:
        """Records ``value``; fails (keeping the first failure's detail) above the bound."""
        self.runs += 1
        self.worst = max(self.worst, value)
        if not value <= self.bound:
            if self.passed:
                self.detail = f"{where}: {value:g}"
            self.passed = False


@dataclass
class OverlapResult:
    """Step times per mode (seconds, warm steps of every round), checks, what was skipped."""

    n: int
    steps: int
    warmup: int
    rounds: int
    blocks: list[tuple[int, int]]
    lanes: int
    modes: list[Mode] = field(default_factory=list)
    times: dict[str, list[float]] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


class Runner:
    """Runs every mode that can run here, ``rounds`` times with fresh inputs."""

    def __init__(self, rig: Rig, n: int, steps: int, warmup: int, rounds: int, pieces: int, ratio: float,
                 lanes: int) -> None:
        self.rig, self.client = rig, rig.client
        self.steps, self.warmup, self.rounds = steps, warmup, rounds
        self.blocks = row_blocks(n, pieces, ratio, 64 if n >= 512 else 8)
        self.e = Engine(rig, n, lanes, marks=warmup + steps + 2)
        self.pool = [self.client.empty((n, n), torch.float32) for _ in range(2)]
        self.pinned = [torch.empty((n, n), dtype=torch.float32, pin_memory=True) for _ in range(2)] if rig.gpu else []
        self.events = [self.client.event() for _ in range(SLOTS * len(self.blocks))]
        self.res = OverlapResult(n, steps, warmup, rounds, self.blocks, lanes)
        self.res.modes = [m for m in MODES if rig.gpu or not m.torch_gpu]
        self.res.skipped = [m.name for m in MODES if m.torch_gpu and not rig.gpu]
        bound = 5e-7 * n  # FP32 sums of n products in [-1, 1): ~sqrt(n) 2^-24 |c|; 20x that
        self.res.checks = [
            Check("destination-written", "host destinations poisoned (0xFF) before each checked step: "
                  "poisoned words left", 0),
            Check("ferry-copy-exact", "bytes copied through ferry equal the device's bytes: words differing", 0),
            Check("in-process-copy-exact", "bytes copied by torch equal the device's bytes: words differing", 0),
            Check("chunked-vs-unchunked", "max |blocked product - whole product| over all n*n entries", bound),
            Check("unchunked-vs-fp64", "max |whole FP32 product - float64 CPU product| on a random 128x128 block",
                  bound),
            Check("chunked-vs-fp64", "max |blocked FP32 product - float64 CPU product| on the same block", bound),
            Check("schedule-keeps-result", "every mode's product is bitwise the reference product of its cut "
                  "(1: differs)", 0),
            Check("copy-after-math", "device outputs poisoned (0xFE) before each checked step's math: poisoned "
                  "words that reached the host", 0),
        ]
        self.ref: dict[bool, torch.Tensor] = {}  # blocked? -> reference product of this round

    def _check(self, name: str) -> Check:
        return next(c for c in self.res.checks if c.name == name)

    def host_out(self, mode: Mode, buf: int) -> torch.Tensor:
        return self.pool[buf] if mode.ferry else self.pinned[buf]

    def run_steps(self, mode: Mode, steps: int) -> list[float]:
        """``steps`` steps of ``mode``; every step's time, warm-up included."""
        e, n = self.e, self.e.n
        blocks = self.blocks if mode.blocks else [(0, n)]
        lanes = len(e.lanes) if mode.blocks else 1
        xfers: list[list[Any]] = [[] for _ in range(SLOTS)]
        tokens: list[Optional[torch.cuda.Event]] = [None] * SLOTS
        e.mark(0)
        for k in range(steps):
            buf, slot, prev = k % 2, k % SLOTS, (k - 1) % SLOTS
            if k >= 2:
                e.wait_mark(k - 1)
            xfers[slot] = []
            if lanes > 1:
                e.fork()
            for p, (r0, r1) in enumerate(blocks):
                lane = p % lanes
                if mode.compute:
                    e.gemm(buf, r0, r1, lane)
                if not mode.copies:
                    continue
                src, dst = e.out[buf][r0:r1], self.host_out(mode, buf)[r0:r1]
                if mode.key in ("torch_copy", "torch_serial"):
                    with torch.cuda.stream(e.stream):
                        dst.copy_(src, non_blocking=True)
                elif mode.key in ("torch_side_stream", "torch_in_step"):
                    e.side.wait_stream(e.lanes[lane])
                    with torch.cuda.stream(e.side):
                        dst.copy_(src, non_blocking=True)
                    tokens[slot] = torch.cuda.Event()
                    tokens[slot].record(e.side)
                else:  # ferry: after an event on the block's lane, the copy alone included
                    ev = self.events[slot * len(self.blocks) + p]
                    ev.record(e.lanes[lane])
                    # bulk: a stream can wait for it (small blocks would go in the latency class)
                    xfers[slot].append(self.client.copy_(dst, src, after=ev, priority="bulk"))
            if lanes > 1:
                e.join()
            if mode.key == "torch_side_stream" and k >= 1:
                e.stream.wait_event(tokens[prev])
            elif mode.key == "torch_in_step":
                e.stream.wait_event(tokens[slot])
            elif mode.key in ("ferry_copy", "ferry_serial", "ferry_in_step"):
                self.client.stream_wait(xfers[slot], e.stream)
            elif mode.key == "ferry_pipelined" and k >= 1:
                self.client.stream_wait(xfers[prev], e.stream)
            e.mark(k + 1)
        # The pipelined modes' last copy is still running: wait for it, untimed.
        if steps and mode.key == "torch_side_stream":
            e.stream.wait_event(tokens[(steps - 1) % SLOTS])
        e.sync()
        for slot_xfers in xfers:  # a stream wait does not raise a copy's error; a host wait does
            for t in slot_xfers:
                t.wait(30.0)
        return [e.seconds(k, k + 1) for k in range(steps)]

    def checked_steps(self, mode: Mode, rnd: int) -> None:
        """Two more steps with poisoned destinations and outputs, then every word compared."""
        e = self.e
        e.sync()
        for b in range(2):
            if mode.copies:
                self.host_out(mode, b).view(torch.uint8).fill_(HOST_POISON)
            if mode.compute:
                e.poison_output(b, DEVICE_POISON)
        self.run_steps(mode, 2)
        where = f"{mode.name}, round {rnd + 1}"
        hp = numpy.frombuffer(bytes([HOST_POISON] * 4), numpy.int32)[0]
        dp = numpy.frombuffer(bytes([DEVICE_POISON] * 4), numpy.int32)[0]
        for b in range(2):
            dev = e.read_output(b)
            if mode.strategy == "compute":
                if b == 0:
                    self.ref[mode.blocks] = dev
                continue
            host = self.host_out(mode, b).view(torch.int32).numpy().reshape(-1)
            d = dev.view(torch.int32).numpy().reshape(-1)
            self._check("destination-written").see(int(numpy.count_nonzero(host == hp)), where)
            exact = "ferry-copy-exact" if mode.ferry else "in-process-copy-exact"
            self._check(exact).see(int(numpy.count_nonzero(host != d)), where)
            if mode.compute:
                self._check("copy-after-math").see(int(numpy.count_nonzero(host == dp)), where)
                same = torch.equal(dev.view(torch.int32), self.ref[mode.blocks].view(torch.int32))
                self._check("schedule-keeps-result").see(0 if same else 1, where)
        if mode.key == "compute_blocks":
            self._compare_products(rnd)

    def _compare_products(self, rnd: int) -> None:
        e, n = self.e, self.e.n
        whole, blocked = self.ref[False], self.ref[True]
        self._check("chunked-vs-unchunked").see(float((whole - blocked).abs().max()), f"round {rnd + 1}")
        bs = min(n, 128)
        rng = numpy.random.default_rng()
        i, j = int(rng.integers(0, n - bs + 1)), int(rng.integers(0, n - bs + 1))
        ref = e.a_host[i:i + bs].double() @ e.b_host[:, j:j + bs].double()
        for name, got in (("unchunked-vs-fp64", whole), ("chunked-vs-fp64", blocked)):
            self._check(name).see(float((got[i:i + bs, j:j + bs].double() - ref).abs().max()), f"round {rnd + 1}")

    def run(self, progress: Progress) -> OverlapResult:
        """Every mode, every round; step times exclude each run's warm-up steps."""
        rng = numpy.random.default_rng(int.from_bytes(os.urandom(8), "little"))
        for rnd in range(self.rounds):
            self.e.set_inputs(rng)
            for mode in self.res.modes:
                t = self.run_steps(mode, self.warmup + self.steps)
                self.res.times.setdefault(mode.key, []).extend(t[min(self.warmup, len(t) - 1):])
                self.checked_steps(mode, rnd)
                progress.step(f"{mode.name}, round {rnd + 1}")
        return self.res


def median_of(res: OverlapResult, key: str) -> Optional[float]:
    """The median step time of a mode, None if it did not run."""
    t = res.times.get(key)
    return median(t) if t else None
