"""Where a single pool copy's time goes at 12 to 96 MiB: the same pool tensor and CUDA tensor
copied (a) from Python, copy_ + wait, (a') the same with wait(spin=True), (b) by libferry alone in
C++ (client.time_round_trips, bulk), (c) by torch from a pre-pinned tensor, in turns of 20 so that
drift hits all alike.
Usage: python3 bench/gpu/pool_gap.py SOCKET"""
import statistics
import sys
import time

if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0 if len(sys.argv) == 2 else 2)

import torch

import ferry

c = ferry.Client(sys.argv[1], name="pool-gap")
torch.cuda.set_device(c.device)
MIB = 1 << 20
top = 96 * MIB
pool = c.empty(top, torch.uint8)
pool.copy_(torch.randint(0, 256, (top,), dtype=torch.uint8))
pinned = torch.empty(top, dtype=torch.uint8, pin_memory=True)
pinned.copy_(pool)
dev = torch.empty(top, dtype=torch.uint8, device="cuda")
print("size    dir   python copy_+wait   +wait(spin)   C++ libferry bulk   torch pinned   "
      "(medians of 100, ms; torch/python, torch/python spin, torch/C++)")
for n in (12 * MIB, 24 * MIB, 48 * MIB, 96 * MIB):
    for d in ("h2d", "d2h"):
        src, dst = (pool[:n], dev[:n]) if d == "h2d" else (dev[:n], pool[:n])
        tsrc, tdst = (pinned[:n], dev[:n]) if d == "h2d" else (dev[:n], pinned[:n])
        py, spin, cpp, th = [], [], [], []
        for turn in range(6):
            for _ in range(20):
                t0 = time.perf_counter_ns()
                c.copy_(dst, src, stream_waitable=False).wait()
                py.append(time.perf_counter_ns() - t0)
            for _ in range(20):
                t0 = time.perf_counter_ns()
                c.copy_(dst, src, stream_waitable=False).wait(spin=True)
                spin.append(time.perf_counter_ns() - t0)
            cpp += c.time_round_trips(dst, src, 20, priority="bulk")
            for _ in range(20):
                t0 = time.perf_counter_ns()
                tdst.copy_(tsrc, non_blocking=True)
                torch.cuda.synchronize()
                th.append(time.perf_counter_ns() - t0)
        py, spin, cpp, th = (statistics.median(x[20:]) / 1e6 for x in (py, spin, cpp, th))
        print(f"{n // MIB:3d} MiB {d}   {py:10.3f}     {spin:10.3f}     {cpp:10.3f}          {th:8.3f}      "
              f"{th / py:6.1%} {th / spin:6.1%} {th / cpp:6.1%}")
