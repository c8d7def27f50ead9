"""Sample summaries for the benchmarks: median, p99, min, max and outliers, with their causes."""

from __future__ import annotations

import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

#: A sample this many times the median or more is an outlier.
OUTLIER_FACTOR = 1.5


@dataclass
class Sample:
    """One timed repetition: host-clock nanoseconds, the process's minor page faults meanwhile,
    and for the pin-then-copy path the nanoseconds spent pinning alone."""

    ns: int
    faults: int = 0
    pin_ns: int = 0


@dataclass
class Summary:
    """Seconds over the timed repetitions (warm-up excluded)."""

    n: int = 0
    median: float = 0.0
    p99: float = 0.0
    min: float = 0.0
    max: float = 0.0
    outliers: int = 0  # samples > OUTLIER_FACTOR x median
    outlier_reps: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, float]:
        """The figures, for JSON."""
        return {"n": self.n, "median": self.median, "p99": self.p99, "min": self.min, "max": self.max,
                "outliers": self.outliers}


def median(values: Sequence[float]) -> float:
    """The median (the mean of the middle two for an even count); 0 for no values."""
    v = sorted(values)
    if not v:
        return 0.0
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2


def summarize(seconds: Sequence[float]) -> Summary:
    """Median, p99 (nearest rank), min, max and the outliers (> 1.5x the median) of ``seconds``."""
    if not seconds:
        return Summary()
    v = sorted(seconds)
    m = median(v)
    reps = [i for i, s in enumerate(seconds) if m > 0 and s > OUTLIER_FACTOR * m]
    return Summary(n=len(v), median=m, p99=v[min(len(v) - 1, int(len(v) * 0.99))], min=v[0], max=v[-1],
                   outliers=len(reps), outlier_reps=reps)


def minor_faults() -> int:
    """This process's minor page faults so far (all threads)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def timed(fn: Callable[[], Optional[int]]) -> Sample:
    """Runs ``fn`` once on the host clock; ``fn`` must return only once its copy is complete
    (after a synchronize or a wait), and may return the nanoseconds it spent pinning."""
    f0 = minor_faults()
    t0 = time.perf_counter_ns()
    pin_ns = fn()
    t1 = time.perf_counter_ns()
    return Sample(ns=t1 - t0, faults=minor_faults() - f0, pin_ns=int(pin_ns or 0))


def explain_outliers(samples: Sequence[Sample], summary: Summary) -> str:
    """Why each outlier of ``summary`` (over ``samples``) was slow, where a cause shows:
    the first timed call, page faults well above the median sample's, or pinning that took
    well over its median. Empty when there are none."""
    if not summary.outliers:
        return ""
    med_faults = median([s.faults for s in samples])
    med_pin = median([s.pin_ns for s in samples])
    causes: Counter[str] = Counter()
    for i in summary.outlier_reps:
        s = samples[i]
        why = []
        if i == 0:
            why.append("first timed call")
        if s.faults > max(64.0, 2 * med_faults):
            why.append("page faults")
        if med_pin > 0 and s.pin_ns > OUTLIER_FACTOR * med_pin:
            why.append("slow pinning")
        causes[" + ".join(why) or "no cause seen"] += 1
    parts = ", ".join(f"{n} {c}" for c, n in causes.most_common())
    return f"{summary.outliers} outlier{'s' if summary.outliers > 1 else ''} (> {OUTLIER_FACTOR}x median): {parts}"
