#!/usr/bin/env python3
"""Were the copy engines kept fed? Splits the copies of a ferryd --trace-engine log into bursts
(copies with more than GAP microseconds of quiet between them: ferry-bench's reps, which the
in-process rows separate) and prints, for each burst of at least MIN_MIB MiB, its bytes, its
span from the first issue to the last copy done, the GB/s that makes, the share of the span with
at least one stream's copies on an engine (busy), and the stream shares (a stream's part of a
group) with their mean size.

A slow burst with the engines busy throughout was slow on the engines; one with them idle for
part of it was waiting for ferryd (or its client) to hand them work.

usage: engine_busy.py FERRYD_TRACE_LOG [GAP_US (default 200)] [MIN_MIB (default 16)]
"""
from __future__ import annotations

import re
import sys

ORIGIN = re.compile(r"time zero(?:,| moved to) (\d+) ns on CLOCK_MONOTONIC")
SPAN = re.compile(
    r"engine trace: (h2d|d2h) (?:stream \d+|lane), (\d+) bytes: accepted ([0-9.-]+), issued ([0-9.-]+), "
    r"on the engine ([0-9.-]+) to ([0-9.-]+), seen done ([0-9.-]+) us"
)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    gap = float(argv[2]) if len(argv) > 2 else 200.0
    min_bytes = (float(argv[3]) if len(argv) > 3 else 16.0) * (1 << 20)
    spans = []  # (issued, start, end, bytes, direction), microseconds on CLOCK_MONOTONIC
    zero = None  # ferryd's time zero, which it moves now and then (each line counts from the last)
    with open(argv[1], encoding="utf-8", errors="replace") as f:
        for line in f:
            z = ORIGIN.search(line)
            if z:
                zero = int(z.group(1)) / 1e3
                continue
            m = SPAN.search(line)
            if m and zero is not None and float(m.group(5)) >= 0:
                spans.append((zero + float(m.group(4)), zero + float(m.group(5)), zero + float(m.group(6)),
                              int(m.group(2)), m.group(1)))
    spans.sort()
    bursts, cur, last_end = [], [], None
    for s in spans:
        if cur and s[0] > last_end + gap:
            bursts.append(cur)
            cur = []
        cur.append(s)
        last_end = max(last_end, s[2]) if cur[:-1] else s[2]
    if cur:
        bursts.append(cur)
    print(f"{'burst':>5} {'dir':>4} {'MiB':>8} {'span us':>9} {'GB/s':>7} {'busy':>6} {'shares':>7} {'KiB a share':>11}")
    for i, b in enumerate(bursts):
        total = sum(s[3] for s in b)
        if total < min_bytes:
            continue
        t0, t1 = min(s[0] for s in b), max(s[2] for s in b)
        busy, run_start, run_end = 0.0, None, None
        for _, start, end, _, _ in sorted(b, key=lambda s: s[1]):
            if run_end is None or start > run_end:
                if run_end is not None:
                    busy += run_end - run_start
                run_start, run_end = start, end
            else:
                run_end = max(run_end, end)
        if run_end is not None:
            busy += run_end - run_start
        span = max(t1 - t0, 1e-9)
        dirs = "/".join(sorted({s[4] for s in b}))
        print(f"{i:5d} {dirs:>4} {total / (1 << 20):8.1f} {span:9.1f} {total / span / 1e3:7.2f} "
              f"{100 * busy / span:5.1f}% {len(b):7d} {total / len(b) / 1024:11.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
