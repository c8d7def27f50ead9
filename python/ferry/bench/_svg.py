"""A dependency-free SVG line plot: one polyline per series, log or linear axes, a legend.

The benchmarks run where matplotlib is not installed; this writes plain SVG 1.1 that browsers,
``rsvg-convert`` and image viewers show. Each series is one ``<polyline class="series">``
carrying its name in ``data-series``, so scripts can find the lines again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence
from xml.sax.saxutils import escape, quoteattr

#: Colours that stay apart from each other in print and for most colour-blind readers.
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
           "#bcbd22", "#17becf")


@dataclass
class Series:
    """One line: ``points`` are (x, y) pairs; ``dash`` an SVG stroke-dasharray or None."""

    name: str
    points: list[tuple[float, float]] = field(default_factory=list)
    color: Optional[str] = None
    dash: Optional[str] = None


def _fmt(v: float) -> str:
    """A tick label: short, no trailing zeros."""
    if v == 0:
        return "0"
    if abs(v) >= 1000 or abs(v) < 0.01:
        return f"{v:.0e}".replace("e+0", "e").replace("e-0", "e-")
    return f"{v:.3g}"


def _log_ticks(lo: float, hi: float) -> list[float]:
    """Decades, and 2 and 5 times them where the range spans few decades."""
    first, last = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    steps = (1,) if last - first > 4 else (1, 2, 5)
    ticks = [m * 10.0 ** e for e in range(first, last + 1) for m in steps]
    return [t for t in ticks if lo * (1 - 1e-9) <= t <= hi * (1 + 1e-9)]


def _linear_ticks(lo: float, hi: float, count: int = 6) -> list[float]:
    span = hi - lo if hi > lo else 1.0
    raw = span / count
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step) * step
    return [start + i * step for i in range(int((hi - start) / step + 1e-9) + 1)]


def _nice_below(v: float) -> float:
    """The largest 1, 2 or 5 times a power of ten at or below ``v`` (> 0)."""
    e = math.floor(math.log10(v))
    return max(m * 10.0 ** e for m in (1, 2, 5) if m * 10.0 ** e <= v * (1 + 1e-9))


def _nice_above(v: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above ``v`` (> 0)."""
    e = math.floor(math.log10(v))
    return min(m * 10.0 ** e for m in (1, 2, 5, 10) if m * 10.0 ** e >= v * (1 - 1e-9))


class _Axis:
    def __init__(self, values: Sequence[float], log: bool, pixels: float, flip: bool) -> None:
        self.log = log
        vals = [v for v in values if v > 0] if log else list(values)
        if not vals:
            vals = [1.0, 10.0] if log else [0.0, 1.0]
        lo, hi = min(vals), max(vals)
        if log:
            lo, hi = _nice_below(lo), _nice_above(hi)
            if lo == hi:
                lo, hi = lo / 2, hi * 2
        else:
            lo = min(lo, 0.0)
            hi = hi if hi > lo else lo + 1
            hi += (hi - lo) * 0.05
        self.lo, self.hi, self.pixels, self.flip = lo, hi, pixels, flip

    def ok(self, v: float) -> bool:
        return v > 0 if self.log else math.isfinite(v)

    def __call__(self, v: float) -> float:
        if self.log:
            f = (math.log10(v) - math.log10(self.lo)) / (math.log10(self.hi) - math.log10(self.lo))
        else:
            f = (v - self.lo) / (self.hi - self.lo)
        return (1 - f) * self.pixels if self.flip else f * self.pixels

    def ticks(self) -> list[float]:
        return _log_ticks(self.lo, self.hi) if self.log else _linear_ticks(self.lo, self.hi)


def line_plot(series: Sequence[Series], *, title: str, x_label: str, y_label: str, subtitle: Sequence[str] = (),
              warning: str = "", log_x: bool = True, log_y: bool = True, width: int = 1060, height: int = 600) -> str:
    """The SVG text of a line plot of ``series``: ``subtitle`` lines under the title, then
    ``warning`` in red (points with a non-positive coordinate on a log axis are left out, as they
    have no place on it)."""
    subtitle = [subtitle] if isinstance(subtitle, str) else list(subtitle)
    lines = len(subtitle) + (1 if warning else 0)
    left, right, top, bottom = 78, 340, 44 + 18 * lines, 58
    pw, ph = width - left - right, height - top - bottom
    xs = [x for s in series for x, _ in s.points]
    ys = [y for s in series for _, y in s.points]
    ax, ay = _Axis(xs, log_x, pw, flip=False), _Axis(ys, log_y, ph, flip=True)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{left}" y="22" font-size="16" font-weight="bold">{escape(title)}</text>']
    for i, line in enumerate(subtitle):
        out.append(f'<text x="{left}" y="{42 + 18 * i}" fill="#444">{escape(line)}</text>')
    if warning:
        out.append(f'<text x="{left}" y="{42 + 18 * len(subtitle)}" fill="#c00000" font-weight="bold">'
                   f'{escape(warning)}</text>')
    out.append(f'<g transform="translate({left},{top})">')
    for t in ax.ticks():
        x = ax(t)
        out.append(f'<line x1="{x:.1f}" y1="0" x2="{x:.1f}" y2="{ph}" stroke="#e4e4e4"/>')
        out.append(f'<text x="{x:.1f}" y="{ph + 16}" text-anchor="middle">{_fmt(t)}</text>')
    for t in ay.ticks():
        y = ay(t)
        out.append(f'<line x1="0" y1="{y:.1f}" x2="{pw}" y2="{y:.1f}" stroke="#e4e4e4"/>')
        out.append(f'<text x="-6" y="{y + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
    out.append(f'<rect x="0" y="0" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{pw / 2:.1f}" y="{ph + 40}" text-anchor="middle" font-size="13">{escape(x_label)}</text>')
    out.append(f'<text transform="translate(-56,{ph / 2:.1f}) rotate(-90)" text-anchor="middle" '
               f'font-size="13">{escape(y_label)}</text>')
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        pts = [(ax(x), ay(y)) for x, y in sorted(s.points) if ax.ok(x) and ay.ok(y)]
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        coords = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        out.append(f'<polyline class="series" data-series={quoteattr(s.name)} points="{coords}" fill="none" '
                   f'stroke="{color}" stroke-width="2"{dash}/>')
        out.extend(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.6" fill="{color}"/>' for x, y in pts)
    out.append("</g>")
    lx, ly = width - right + 16, top + 6
    for i, s in enumerate(series):
        color = s.color or PALETTE[i % len(PALETTE)]
        y = ly + 20 * i
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        out.append(f'<line x1="{lx}" y1="{y}" x2="{lx + 26}" y2="{y}" stroke="{color}" stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 32}" y="{y + 4}">{escape(s.name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_line_plot(path: str, series: Sequence[Series], **kwargs: object) -> None:
    """Writes :func:`line_plot` of ``series`` to ``path`` (keyword arguments as for it)."""
    text = line_plot(series, **kwargs)  # type: ignore[arg-type]
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
