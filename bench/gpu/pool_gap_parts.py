"""Where the Python layer's time goes on one pool copy (96 and 24 MiB, h2d and d2h), in turns:
(a) client.copy_ + Transfer.wait; (b) the extension's copy + wait, no Python layer; (c) one C++
round trip per Python call (client.time_round_trips(..., 1)): the extension's resolve, GIL and
call, but libferry's own wait; (d) C++ round trips 20 at a time. Medians in us; inner: the C++
loop's own time of (c). Usage: python3 bench/gpu/pool_gap_parts.py SOCKET"""
import statistics
import sys
import time

if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0 if len(sys.argv) == 2 else 2)

import torch

import ferry

c = ferry.Client(sys.argv[1], name="pool-gap-parts")
MIB = 1 << 20
top = 96 * MIB
pool = c.empty(top, torch.uint8)
pool.copy_(torch.randint(0, 256, (top,), dtype=torch.uint8))
dev = torch.empty(top, dtype=torch.uint8, device="cuda")
print("size dir   (a) copy_+wait  (b) ext copy+wait  (c) 1 C++ trip/call [inner]  (d) C++ loop  latency_ns(a)")
for n in (24 * MIB, 96 * MIB):
    for d in ("h2d", "d2h"):
        src, dst = (pool[:n], dev[:n]) if d == "h2d" else (dev[:n], pool[:n])
        sp, dp = src.data_ptr(), dst.data_ptr()
        a, b, cc, ci, dd, lat = [], [], [], [], [], []
        for turn in range(6):
            for _ in range(20):
                t0 = time.perf_counter_ns()
                t = c.copy_(dst, src, stream_waitable=False)
                t.wait()
                a.append(time.perf_counter_ns() - t0)
                lat.append(t.latency_ns)
            for _ in range(20):
                t0 = time.perf_counter_ns()
                x = c._c.copy(dp, d == "h2d", sp, d == "d2h", n, False, False, None, 0, 0)
                x.wait(None)
                b.append(time.perf_counter_ns() - t0)
            for _ in range(20):
                t0 = time.perf_counter_ns()
                inner = c.time_round_trips(dst, src, 1, priority="bulk")
                cc.append(time.perf_counter_ns() - t0)
                ci += inner
            dd += c.time_round_trips(dst, src, 20, priority="bulk")
        m = lambda v: statistics.median(v[20:]) / 1e3  # noqa: E731
        print(f"{n // MIB:3d} {d}   {m(a):12.1f}  {m(b):16.1f}  {m(cc):14.1f} [{m(ci):8.1f}]  {m(dd):10.1f}  {m(lat):10.1f}")
