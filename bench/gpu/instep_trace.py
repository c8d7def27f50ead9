#!/usr/bin/env python3
"""Where an overlap step's exposed copy time goes through ferryd.

Sets each copy a session's lane ran (ferryd --trace-engine: when the lane's wait for the
client's event was over, and when the copy was done on the GPU) beside the step it served
(ferry-bench overlap --timeline: the step's start, the end of its math, its end; GPU times on
CLOCK_MONOTONIC, as ferryd's trace is), and prints per mode, medians [min, max] over the
steps, in microseconds:

  there   from the end of the step's math (or, copy alone, the step's start) to the lane's
          start on its last copy: the hand-off to ferryd's stream, plus any wait for the
          copies before it on the lane
  copy    the last copy's time on the engine
  back    from the last copy done to the step's end: the hand-off back to the client's stream
  exposed from the end of the math to the step's end (the in-process rows have this alone)

The split is for the in-step and copy-alone rows: a pipelined step waits for the copy of the
step before, so its last copy is not the one it waited for.

usage: instep_trace.py FERRYD_LOG TIMELINE_CSV
"""
from __future__ import annotations

import csv
import re
import statistics
import sys
from collections import defaultdict

# ferryd's time zero, and where it moves it later (each trace line counts from the last one).
ORIGIN = re.compile(r"time zero(?:,| moved to) (\d+) ns on CLOCK_MONOTONIC")
LANE = re.compile(
    r"engine trace: (h2d|d2h) lane, (\d+) bytes: accepted ([0-9.-]+), issued ([0-9.-]+), "
    r"on the engine ([0-9.-]+) to ([0-9.-]+), seen done ([0-9.-]+) us"
)


def read_lane_spans(path: str) -> list[tuple[float, float, int]]:
    """The lanes' copies as (start, end, bytes), microseconds on CLOCK_MONOTONIC, by start."""
    origin_us = None
    spans = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = ORIGIN.search(line)
            if m:
                origin_us = int(m.group(1)) / 1e3
                continue
            m = LANE.search(line)
            if m and origin_us is not None and float(m.group(5)) >= 0:
                spans.append((origin_us + float(m.group(5)), origin_us + float(m.group(6)), int(m.group(2))))
    if origin_us is None:
        sys.exit(f"{path}: no 'engine trace on' line (was ferryd started with --trace-engine?)")
    return sorted(spans)


def summary(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):8.1f} [{min(values):8.1f}, {max(values):8.1f}]"


def main(argv: list[str]) -> int:
    if len(argv) != 3 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) == 2 and argv[1] in ("-h", "--help") else 2
    spans = read_lane_spans(argv[1])
    rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    order: list[str] = []
    with open(argv[2], encoding="utf-8") as f:
        for rec in csv.DictReader(line for line in f if not line.startswith("#")):
            mode = rec["mode"]
            if mode not in order:
                order.append(mode)
            start, waits, end = float(rec["start_us"]), float(rec["waits_us"]), float(rec["end_us"])
            r = rows[mode]
            copy_alone = "copy alone" in mode
            math_end = start if copy_alone else waits
            r["exposed"].append(end - math_end)
            if not mode.startswith("ferryd"):
                continue
            mine = [s for s in spans if start < s[1] <= end]
            r["copies"].append(len(mine))
            if not mine:
                continue
            last = max(mine, key=lambda s: s[1])
            r["there"].append(last[0] - math_end)
            r["copy"].append(last[1] - last[0])
            r["back"].append(end - last[1])
    print(f"{len(spans)} lane copies in the trace; us, median [min, max] over the timed steps")
    print(f"{'mode':44} {'there':>26} {'copy':>26} {'back':>26} {'exposed':>26}  copies a step")
    for mode in order:
        r = rows[mode]
        copies = sorted(set(r["copies"])) if r["copies"] else []
        print(f"{mode:44} {summary(r['there']):>26} {summary(r['copy']):>26} {summary(r['back']):>26} "
              f"{summary(r['exposed']):>26}  {','.join(map(str, copies)) or '-'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
