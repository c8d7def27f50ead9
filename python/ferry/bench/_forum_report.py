"""The forum benchmark's output: ratios against the targets, verdicts, the text tables, CSV,
JSON and the SVG plot."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from typing import Any, Optional

from . import latency as lat
from ._rig import TIMING_NOTE, Rig
from ._svg import PALETTE, Series, write_line_plot
from .forum import MIB, PATHS, ForumResult, Row, nbytes, shape

POOL_MIN_BYTES = 16 * MIB
POOL_TARGET = 0.98
STAGED_MIN_BYTES = 64 * MIB
STAGED_TARGET = 4.0
SPREAD_MIN_BYTES = 16 * MIB
SPREAD_TARGET = 1.5

CSV_COLUMNS = ("test", "direction", "path", "label", "seq", "bytes", "mib", "reps", "warmup", "median_ms", "p99_ms",
               "min_ms", "max_ms", "gbps", "outliers", "first_ms", "pin_median_ms", "faults_median", "checked",
               "note", "backend", "timing")


@dataclass
class Ratios:
    """The target ratios at one size; None where a side was not measured."""

    seq: int
    nbytes: int
    pool_vs_pinned: dict[str, Optional[float]]  # per direction: ferry pool GB/s / pre-pinned torch GB/s
    staged_vs_pageable: dict[str, Optional[float]]  # ferry staged GB/s / torch's .to() (the target's baseline)
    staged_vs_fastest: dict[str, Optional[float]]  # ... / the faster torch pageable path (d2h: a reused dst too)
    staged_baseline: dict[str, str]  # which torch pageable path was the faster
    spread: dict[str, float]  # "h2d ferry_pool": max sample / median


@dataclass
class Target:
    """One target's verdict: ``met`` None when it could not be measured here."""

    name: str
    value: Optional[float]
    where: str
    met: Optional[bool]
    line: str


def _find(rows: list[Row], direction: str, key: str, seq: int) -> Optional[Row]:
    return next((r for r in rows if r.path.direction == direction and r.path.key == key and r.seq == seq), None)


def _ratio(num: Optional[Row], den: Optional[Row]) -> Optional[float]:
    """num's GB/s over den's (den's median time over num's)."""
    if num is None or den is None or num.summary.median <= 0:
        return None
    return den.summary.median / num.summary.median


def ratios(res: ForumResult) -> list[Ratios]:
    """The ratio columns for every size."""
    out = []
    for seq in res.seqs:
        pool, staged, fastest_ratio, base, spread = {}, {}, {}, {}, {}
        for d in ("h2d", "d2h"):
            pool[d] = _ratio(_find(res.rows, d, "ferry_pool", seq), _find(res.rows, d, "torch_pinned", seq))
            pageable = [r for r in (_find(res.rows, d, "torch_pageable", seq),
                                    _find(res.rows, d, "torch_pageable_reused", seq)) if r is not None]
            fastest = min(pageable, key=lambda r: r.summary.median) if pageable else None
            staged[d] = _ratio(_find(res.rows, d, "ferry_staged", seq), _find(res.rows, d, "torch_pageable", seq))
            fastest_ratio[d] = _ratio(_find(res.rows, d, "ferry_staged", seq), fastest)
            base[d] = fastest.path.key if fastest else ""
            for k in ("ferry_pool", "ferry_staged"):
                r = _find(res.rows, d, k, seq)
                if r is not None and r.summary.median > 0:
                    spread[f"{d} {k}"] = r.summary.max / r.summary.median
        out.append(Ratios(seq, nbytes(seq), pool, staged, fastest_ratio, base, spread))
    return out


def _worst(items: list[tuple[float, str]], lowest: bool) -> Optional[tuple[float, str]]:
    return (min if lowest else max)(items, key=lambda x: x[0]) if items else None


def targets(res: ForumResult, rats: list[Ratios], lat_rows: list[lat.LatencyRow], gpu: bool) -> list[Target]:
    """One verdict per target, each with its worst figure and where it was."""
    out = []

    def verdict(name: str, items: list[tuple[float, str]], lowest: bool, bound: float, fmt: str,
                why_none: str) -> Target:
        w = _worst(items, lowest)
        if w is None:
            return Target(name, None, "", None, f"{name}: not measured ({why_none})")
        met = w[0] >= bound if lowest else w[0] <= bound
        return Target(name, w[0], w[1], met, f"{name}: {'met' if met else 'NOT MET'} (worst {fmt.format(w[0])} "
                                             f"at {w[1]}; {len(items)} figures)")

    no_gpu = "no GPU: the torch paths did not run" if not gpu else ""
    pool = [(r.pool_vs_pinned[d], f"{r.nbytes / MIB:.1f} MiB {d}") for r in rats if r.nbytes >= POOL_MIN_BYTES
            for d in ("h2d", "d2h") if r.pool_vs_pinned[d] is not None]
    out.append(verdict(f"ferry pool >= {POOL_TARGET:.0%} of pre-pinned torch at >= 16 MiB", pool, True, POOL_TARGET,
                       "{:.1%}", no_gpu or "no size >= 16 MiB in this sweep"))
    staged = [(r.staged_vs_pageable[d], f"{r.nbytes / MIB:.1f} MiB {d}") for r in rats
              if r.nbytes >= STAGED_MIN_BYTES for d in ("h2d", "d2h") if r.staged_vs_pageable[d] is not None]
    out.append(verdict(f"ferry staged >= {STAGED_TARGET:g}x torch pageable .to('cuda') / .to('cpu') at >= 64 MiB, "
                       "both ways", staged, True,
                       STAGED_TARGET, "{:.2f}x", no_gpu or "no size >= 64 MiB in this sweep"))
    spread = [(v, f"{r.nbytes / MIB:.1f} MiB {k}") for r in rats if r.nbytes >= SPREAD_MIN_BYTES
              for k, v in r.spread.items()]
    out.append(verdict(f"ferry max sample / median <= {SPREAD_TARGET:g} at >= 16 MiB", spread, False, SPREAD_TARGET,
                       "{:.2f}", "no size >= 16 MiB in this sweep"))
    line, met = lat.verdict(lat_rows)
    worst = max(lat_rows, key=lambda r: r.delta_us) if lat_rows else None
    out.append(Target("Python 4 KiB p50 within 3 us of C++", worst.delta_us if worst else None,
                      worst.direction if worst else "", met if lat_rows else None, line))
    return out


def _ms(x: float) -> str:
    return f"{x * 1e3:.3f}" if math.isfinite(x) else "-"


def text(rig: Rig, res: ForumResult, rats: list[Ratios], lat_rows: list[lat.LatencyRow], tgts: list[Target]) -> str:
    """The whole report as text."""
    L = [rig.banner(), TIMING_NOTE,
         f"forum: tensors of shape {shape(0)[:3] + ('seq', 4096)} float16 (0.375 MiB per seq); {res.reps} timed reps "
         f"after {res.warmup} warm-up per path and size; medians, p99, min, max; GB/s = 1e9 bytes/s at the median; "
         "out: samples > 1.5x median; first: the first warm-up call; every path's bytes checked once per size "
         "(fresh random source, poisoned destination)"]
    for d, title in (("h2d", "host to device"), ("d2h", "device to host")):
        L += ["", f"{d}: {title}",
              f"{'seq':>5} {'MiB':>8}  {'path':<40} {'p50 ms':>9} {'p99 ms':>9} {'min ms':>9} {'max ms':>9} "
              f"{'GB/s':>7} {'out':>4} {'first ms':>9} {'check':>6}  note"]
        for r in (r for r in res.rows if r.path.direction == d):
            s = r.summary
            check = "-" if r.checked is None else ("ok" if r.checked else "FAIL")
            L.append(f"{r.seq:5d} {r.nbytes / MIB:8.2f}  {r.path.label:<40} {_ms(s.median):>9} {_ms(s.p99):>9} "
                     f"{_ms(s.min):>9} {_ms(s.max):>9} {r.gbps:7.2f} {s.outliers:4d} {_ms(r.first_s):>9} "
                     f"{check:>6}  {r.note}")
    pct = lambda v: f"{v:.1%}" if v is not None else "-"  # noqa: E731
    times = lambda v: f"{v:.2f}x" if v is not None else "-"  # noqa: E731
    L += ["", "target ratios per size: ferry pool / pre-pinned torch (GB/s); ferry staged / torch's pageable .to() "
          "(GB/s; 'fastest': / the faster torch pageable path, for d2h a copy_ into a reused pageable tensor); "
          "ferry max sample / median",
          f"{'seq':>5} {'MiB':>8}  {'pool/pinned h2d':>15} {'d2h':>7}  {'staged/.to() h2d':>16} {'d2h':>7}  "
          f"{'/fastest d2h':>12}  {'max/p50 pool h2d':>16} {'d2h':>5} {'staged h2d':>10} {'d2h':>5}"]
    for r in rats:
        sp = [r.spread.get(k) for k in ("h2d ferry_pool", "d2h ferry_pool", "h2d ferry_staged", "d2h ferry_staged")]
        f = [f"{v:.2f}" if v is not None else "-" for v in sp]
        L.append(f"{r.seq:5d} {r.nbytes / MIB:8.2f}  {pct(r.pool_vs_pinned['h2d']):>15} {pct(r.pool_vs_pinned['d2h']):>7}"
                 f"  {times(r.staged_vs_pageable['h2d']):>16} {times(r.staged_vs_pageable['d2h']):>7}  "
                 f"{times(r.staged_vs_fastest['d2h']):>12}  "
                 f"{f[0]:>16} {f[1]:>5} {f[2]:>10} {f[3]:>5}")
    if lat_rows:
        L += ["", lat.table(lat_rows)]
    L += ["", "targets:"] + [f"  {t.line}" for t in tgts]
    if not rig.gpu:
        L.append("  (HOST BACKEND: these verdicts are about memcpy through ferryd, not a GPU)")
    if res.skipped:
        L += ["", "skipped (no GPU): " + "; ".join(res.skipped)]
    L.append("")
    L.append("byte checks: " + ("all passed" if res.checks_passed and all(r.checked for r in lat_rows)
                                else "FAILED (see the check column)"))
    return "\n".join(L) + "\n"


def _row_dict(r: Row, rig: Rig, res: ForumResult) -> dict[str, Any]:
    s = r.summary
    return {"test": "bandwidth", "direction": r.path.direction, "path": r.path.key, "label": r.path.label.strip(),
            "seq": r.seq, "bytes": r.nbytes, "mib": round(r.nbytes / MIB, 4), "reps": s.n, "warmup": res.warmup,
            "median_ms": s.median * 1e3, "p99_ms": s.p99 * 1e3, "min_ms": s.min * 1e3, "max_ms": s.max * 1e3,
            "gbps": r.gbps, "outliers": s.outliers, "first_ms": r.first_s * 1e3 if math.isfinite(r.first_s) else "",
            "pin_median_ms": r.pin.median * 1e3 if r.pin else "",
            "faults_median": sorted(x.faults for x in r.samples)[len(r.samples) // 2] if r.samples else 0,
            "checked": "" if r.checked is None else r.checked, "note": r.note, "backend": rig.backend,
            "timing": "perf_counter_ns"}


def _latency_dicts(rows: list[lat.LatencyRow], rig: Rig) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        for key, s in (("python_copy_wait", r.python), ("cpp_round_trip", r.cpp)):
            out.append({"test": "latency", "direction": r.direction, "path": key, "label": key.replace("_", " "),
                        "seq": "", "bytes": lat.NBYTES, "mib": round(lat.NBYTES / MIB, 6), "reps": s.n, "warmup": "",
                        "median_ms": s.median * 1e3, "p99_ms": s.p99 * 1e3, "min_ms": s.min * 1e3,
                        "max_ms": s.max * 1e3, "gbps": lat.NBYTES / s.median / 1e9 if s.median else 0,
                        "outliers": s.outliers, "first_ms": "", "pin_median_ms": "", "faults_median": "",
                        "checked": r.checked, "note": "", "backend": rig.backend,
                        "timing": "perf_counter_ns" if key.startswith("python") else "steady_clock (C++)"})
    return out


def write_csv(path: str, rig: Rig, res: ForumResult, lat_rows: list[lat.LatencyRow]) -> None:
    """One line per path and size (and per latency figure), columns :data:`CSV_COLUMNS`."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for r in res.rows:
            w.writerow(_row_dict(r, rig, res))
        for d in _latency_dicts(lat_rows, rig):
            w.writerow(d)


def to_json(rig: Rig, res: ForumResult, rats: list[Ratios], lat_rows: list[lat.LatencyRow],
            tgts: list[Target]) -> str:
    """Everything, samples included, as one JSON object."""
    rows = []
    for r in res.rows:
        d = _row_dict(r, rig, res)
        d["samples_ns"] = [s.ns for s in r.samples]
        d["samples_faults"] = [s.faults for s in r.samples]
        rows.append(d)
    doc = {
        "format": "ferry-python-forum/1", "environment": rig.environment(), "timing": TIMING_NOTE,
        "host_backend": not rig.gpu, "shape": [24, 2, 1, "seq", 4096], "dtype": "float16",
        "seqs": list(res.seqs), "reps": res.reps, "warmup": res.warmup, "seed": res.seed, "rows": rows,
        "ratios": [{"seq": r.seq, "bytes": r.nbytes, "pool_vs_pinned": r.pool_vs_pinned,
                    "staged_vs_pageable": r.staged_vs_pageable, "staged_vs_fastest": r.staged_vs_fastest,
                    "staged_baseline": r.staged_baseline,
                    "ferry_max_over_median": r.spread} for r in rats],
        "latency": [r.as_dict() for r in lat_rows],
        "targets": [{"name": t.name, "value": t.value, "where": t.where, "met": t.met, "line": t.line} for t in tgts],
        "skipped": res.skipped, "notes": rig.notes,
        "checks_passed": res.checks_passed and all(r.checked for r in lat_rows),
    }
    return json.dumps(doc, indent=1) + "\n"


def write_plot(path: str, rig: Rig, res: ForumResult, metric: str) -> int:
    """The SVG: ``metric`` ("gbps" or "ms") against size, log axes, one line per path and
    direction (h2d solid, d2h dashed). Returns the number of lines."""
    keys = list(dict.fromkeys(p.key for p in PATHS))
    series = []
    for p in PATHS:
        pts = [(r.nbytes / MIB, r.gbps if metric == "gbps" else r.summary.median * 1e3)
               for r in res.rows if r.path is p]
        if pts:
            series.append(Series(f"{p.direction}: {p.label.strip()}", pts, PALETTE[keys.index(p.key) % len(PALETTE)],
                                 None if p.direction == "h2d" else "6,4"))
    where = rig.gpu_name if rig.gpu else "no GPU (ferryd host backend)"
    env = rig.environment()
    write_line_plot(path, series, title=f"CPU<->GPU copies of (24, 2, 1, seq, 4096) float16 tensors, {where}",
                    subtitle=[f"ferryd backend {rig.backend}, ferry {env['ferry_version']}, torch {env['torch']}, "
                              f"on {env['host']}; h2d solid, d2h dashed",
                              f"medians of {res.reps} reps after {res.warmup} warm-up; host clock (perf_counter_ns) "
                              "until the copy is complete"],
                    warning="" if rig.gpu else "HOST BACKEND: memcpy through ferryd, NOT GPU figures",
                    x_label="tensor size (MiB)",
                    y_label="GB/s (1e9 bytes/s, median)" if metric == "gbps" else "time per copy (ms, median)")
    return len(series)
