"""Where the overlap benchmark's math runs: a CUDA stream (torch, cuBLAS) or, on ferryd's host
backend, the calling thread on the CPU.

Each step computes C[buf] = A @ B (n x n float32) into output ``buf`` (0 or 1: a double
buffer), whole or in row blocks (a row block of a row-major matrix is one contiguous range, so
its copy is one copy). Marks are step boundaries: CUDA events on the step stream, or the host
clock where the math runs on the host.
"""

from __future__ import annotations

import time
from typing import Optional

import numpy
import torch

from ._rig import Rig


class Engine:
    """The step stream, the compute lanes for in-step blocks, the inputs and the outputs."""

    def __init__(self, rig: Rig, n: int, lanes: int, marks: int) -> None:
        self.rig, self.n, self.gpu = rig, n, rig.gpu
        if self.gpu:
            self.stream: Optional[torch.cuda.Stream] = torch.cuda.Stream(rig.device)
            self.lanes: list[Optional[torch.cuda.Stream]] = [self.stream] + [
                torch.cuda.Stream(rig.device) for _ in range(lanes - 1)]
            self.side: Optional[torch.cuda.Stream] = torch.cuda.Stream(rig.device)  # torch's side-stream copies
            self.a = torch.empty((n, n), dtype=torch.float32, device=rig.device)
            self.b = torch.empty_like(self.a)
            self.out = [torch.empty_like(self.a) for _ in range(2)]
            self._events = [torch.cuda.Event(enable_timing=True) for _ in range(marks)]
        else:
            self.stream, self.lanes, self.side = None, [None] * lanes, None
            self.a = torch.empty((n, n), dtype=torch.float32)
            self.b = torch.empty_like(self.a)
            self.out = [rig.client.empty_device((n, n), torch.float32) for _ in range(2)]  # what ferryd copies
            self._stamps = [0] * marks
        self.a_host = torch.empty((n, n), dtype=torch.float32)
        self.b_host = torch.empty_like(self.a_host)

    @property
    def kind(self) -> str:
        """"cuda" or "host"."""
        return "cuda" if self.gpu else "host"

    def set_inputs(self, rng: numpy.random.Generator) -> None:
        """Fresh uniform random A and B in [-1, 1)."""
        for host, dev in ((self.a_host, self.a), (self.b_host, self.b)):
            host.copy_(torch.from_numpy(rng.uniform(-1.0, 1.0, (self.n, self.n)).astype(numpy.float32)))
            dev.copy_(host)
        self.sync()

    def gemm(self, buf: int, r0: int, r1: int, lane: int) -> None:
        """Rows r0:r1 of output ``buf``, on compute lane ``lane`` (0: the step stream)."""
        if self.gpu:
            with torch.cuda.stream(self.lanes[lane]):
                torch.matmul(self.a[r0:r1], self.b, out=self.out[buf][r0:r1])
        else:
            torch.matmul(self.a[r0:r1], self.b, out=self.out[buf][r0:r1])

    def fork(self) -> None:
        """The lanes wait for the step stream's work so far."""
        for lane in self.lanes[1:]:
            if lane is not None:
                lane.wait_stream(self.stream)

    def join(self) -> None:
        """The step stream waits for the lanes' work so far."""
        for lane in self.lanes[1:]:
            if lane is not None and self.stream is not None:
                self.stream.wait_stream(lane)

    def poison_output(self, buf: int, byte: int) -> None:
        """Fills output ``buf`` with ``byte`` on the step stream (before the next math)."""
        if self.gpu:
            with torch.cuda.stream(self.stream):
                self.out[buf].view(torch.uint8).fill_(byte)
        else:
            self.out[buf].view(torch.uint8).fill_(byte)

    def read_output(self, buf: int) -> torch.Tensor:
        """Output ``buf`` on the CPU (after a sync)."""
        self.sync()
        return self.out[buf].cpu() if self.gpu else self.out[buf].clone()

    def mark(self, i: int) -> None:
        """Step boundary ``i``."""
        if self.gpu:
            self._events[i].record(self.stream)
        else:
            self._stamps[i] = time.perf_counter_ns()

    def wait_mark(self, i: int) -> None:
        """The host waits until mark ``i`` has happened."""
        if self.gpu:
            self._events[i].synchronize()

    def seconds(self, a: int, b: int) -> float:
        """From mark a to mark b, both happened."""
        if self.gpu:
            return self._events[a].elapsed_time(self._events[b]) / 1e3
        return (self._stamps[b] - self._stamps[a]) / 1e9

    def sync(self) -> None:
        """Waits for everything queued on the GPU."""
        self.rig.sync()
