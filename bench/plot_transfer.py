#!/usr/bin/env python3
"""Plots ferry-bench transfer's CSV: bandwidth against copy size. Pinned memory in-process and
ferry's pool, one line per direction; from pageable memory (host to device): cudaMemcpy,
pin-then-copy and ferry's staged copy. Writes an SVG (no plotting library needed).

usage: plot_transfer.py transfer.csv out.svg [--title TEXT]
"""
import csv, gzip, math, statistics, sys
from collections import defaultdict

def main():
    if len(sys.argv) < 3 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) > 1 else 64
    title = "ferry-bench transfer"
    if "--title" in sys.argv:
        title = sys.argv[sys.argv.index("--title") + 1]
    samples = defaultdict(list)
    opener = gzip.open if sys.argv[1].endswith(".gz") else open
    with opener(sys.argv[1], "rt") as f:
        for row in csv.DictReader(f):
            if row["test"] not in ("bandwidth", "staged"):
                continue
            n = int(row["bytes"])
            path = row["path"] if row["test"] == "bandwidth" else "pageable: " + row["path"]
            samples[(path, row["direction"], n)].append(n / float(row["seconds"]) / 1e9)
    series = defaultdict(list)
    for (path, d, n), v in samples.items():
        series[(path, d)].append((n, statistics.median(v)))
    W, H, L, R, T, B = 860, 440, 70, 270, 40, 50
    sizes = sorted({n for (_, _, n) in samples})
    ymax = max(v for pts in series.values() for _, v in pts) * 1.08
    x = lambda n: L + (math.log2(n) - math.log2(sizes[0])) / (math.log2(sizes[-1]) - math.log2(sizes[0])) * (W - L - R)
    y = lambda v: H - B - v / ymax * (H - T - B)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W/2}" y="22" text-anchor="middle" font-size="14">{title}</text>']
    for g in range(0, int(ymax) + 1, 10):
        out.append(f'<line x1="{L}" x2="{W-R}" y1="{y(g):.1f}" y2="{y(g):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{L-8}" y="{y(g)+4:.1f}" text-anchor="end">{g}</text>')
    for n in sizes:
        label = f"{n>>30}G" if n >= 1 << 30 else f"{n>>20}M" if n >= 1 << 20 else f"{n>>10}K"
        out.append(f'<text x="{x(n):.1f}" y="{H-B+18}" text-anchor="middle">{label}</text>')
    out.append(f'<text x="{(L+W-R)/2}" y="{H-10}" text-anchor="middle">copy size (bytes)</text>')
    out.append(f'<text x="18" y="{(T+H-B)/2}" text-anchor="middle" transform="rotate(-90 18 {(T+H-B)/2})">GB/s (median)</text>')
    styles = {("in-process", "h2d"): ("#888", "4 3"), ("in-process", "d2h"): ("#bbb", "4 3"),
              ("ferry", "h2d"): ("#1f77b4", ""), ("ferry", "d2h"): ("#d62728", ""),
              ("pageable: pageable-cudaMemcpy", "h2d"): ("#2ca02c", "2 2"), ("pageable: pin-then-copy", "h2d"): ("#9467bd", "2 2"),
              ("pageable: ferry-staged", "h2d"): ("#ff7f0e", "")}
    names = {"in-process": "pinned, in-process", "ferry": "ferry pool (pinned)",
             "pageable: pageable-cudaMemcpy": "pageable, cudaMemcpy", "pageable: pin-then-copy": "pageable, pin then copy",
             "pageable: ferry-staged": "pageable, ferry staged"}
    for i, (key, (color, dash)) in enumerate(styles.items()):
        pts = sorted(series.get(key, []))
        if not pts:
            continue
        path = " ".join(f"{x(n):.1f},{y(v):.1f}" for n, v in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>')
        ly = T + 20 + 20 * i
        out.append(f'<line x1="{W-R+10}" x2="{W-R+40}" y1="{ly}" y2="{ly}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>')
        out.append(f'<text x="{W-R+46}" y="{ly+4}">{names.get(key[0], key[0])} {key[1]}</text>')
    out.append("</svg>")
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(out) + "\n")
    return 0

if __name__ == "__main__":
    sys.exit(main())
