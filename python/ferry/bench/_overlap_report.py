"""The overlap benchmark's figures, targets and output (text, JSON, CSV), in ferry-bench's words:
exposed = median step - median compute step; overlap = 1 - exposed / copy time."""

from __future__ import annotations

import csv
import datetime
import json
from dataclasses import dataclass
from typing import Any, Optional

import torch

from ._rig import Rig
from ._stats import Summary, summarize
from .overlap import Mode, OverlapResult

PIPELINED_TARGET = 0.02  # ferry pipelined: exposed <= 2% of serial's exposed
IN_STEP_TARGET_S = 0.11e-3  # ferry in-step blocks: exposed <= 0.11 ms (the H200, n = 4096)
TIMING = {"cuda": "CUDA events (torch.cuda.Event) on the step stream at step boundaries",
          "host": "host clock (time.perf_counter_ns) at step boundaries; the math runs on the CPU"}
CSV_COLUMNS = ("mode", "key", "path", "strategy", "steps", "step_median_ms", "step_min_ms", "step_max_ms",
               "exposed_ms", "overlap", "engine")


@dataclass
class ModeFigures:
    """One mode's step times and, for modes that copy under math, exposed time and overlap."""

    mode: Mode
    step: Summary
    exposed: Optional[float] = None
    overlap: Optional[float] = None


@dataclass
class Target:
    """A target's verdict; ``met`` None when it cannot be measured here."""

    name: str
    value: Optional[float]
    met: Optional[bool]
    line: str


@dataclass
class Figures:
    """Everything derived from the step times."""

    modes: list[ModeFigures]
    compute: Summary
    compute_blocks: Summary
    copy_seconds: float
    copy_from: str
    targets: list[Target]
    notes: list[str]


def _find(figs: list[ModeFigures], key: str) -> Optional[ModeFigures]:
    return next((f for f in figs if f.mode.key == key), None)


def figures(res: OverlapResult, gpu: bool) -> Figures:
    """Medians, exposed time and overlap per mode, the targets and where ferry lost."""
    modes = [ModeFigures(m, summarize(res.times.get(m.key, []))) for m in res.modes]
    compute = _find(modes, "compute").step  # type: ignore[union-attr]
    blocks = _find(modes, "compute_blocks").step  # type: ignore[union-attr]
    copy = _find(modes, "torch_copy") or _find(modes, "ferry_copy")
    copy_s = copy.step.median if copy else 0.0
    for f in modes:
        if f.mode.strategy in ("serial", "pipelined", "in-step"):
            f.exposed = f.step.median - compute.median
            f.overlap = 1 - f.exposed / copy_s if copy_s > 0 else None
    notes = [] if gpu else [
        "host backend: the math and ferryd's threads share this machine's CPUs, so a mode's step also grows by "
        "the math slowed down by ferryd's work (polling, memcpy), which a GPU's copy engines do not cause"]
    for f in modes:
        base = next((b for b in modes if b.mode.path == "in-process" and b.mode.strategy == f.mode.strategy), None)
        if f.mode.ferry and f.exposed is not None and base and base.exposed is not None \
                and f.exposed > base.exposed + 0.02e-3:
            notes.append(f"{f.mode.name} exposes {(f.exposed - base.exposed) * 1e3:.3f} ms more than {base.mode.name}")
    return Figures(modes, compute, blocks, copy_s, copy.mode.name if copy else "", _targets(modes, res, gpu), notes)


def _targets(modes: list[ModeFigures], res: OverlapResult, gpu: bool) -> list[Target]:
    out = []
    name = f"ferry pipelined: exposed <= {PIPELINED_TARGET:.0%} of serial"
    pipe = _find(modes, "ferry_pipelined")
    serial = _find(modes, "torch_serial") or _find(modes, "ferry_serial")
    if pipe is None or serial is None or serial.exposed is None or serial.exposed <= 0:
        out.append(Target(name, None, None, f"{name}: not measured (no serial mode with a positive exposed time)"))
    else:
        v = pipe.exposed / serial.exposed  # type: ignore[operator]
        met = v <= PIPELINED_TARGET
        out.append(Target(name, v, met, f"{name}: {'met' if met else 'NOT MET'} ({pipe.exposed * 1e3:.3f} ms = "  # type: ignore[operator]
                                        f"{v:.1%} of {serial.mode.name}'s {serial.exposed * 1e3:.3f} ms)"))
    name = f"ferry in-step blocks: exposed <= {IN_STEP_TARGET_S * 1e3:.2f} ms (the H200 bound, n = 4096)"
    step = _find(modes, "ferry_in_step")
    if not gpu or res.n != 4096 or step is None or step.exposed is None:
        why = "no GPU" if not gpu else f"n = {res.n}, the bound is for n = 4096"
        out.append(Target(name, step.exposed if step else None, None, f"{name}: not applicable ({why})"))
    else:
        met = step.exposed <= IN_STEP_TARGET_S
        out.append(Target(name, step.exposed, met, f"{name}: {'met' if met else 'NOT MET'} "
                                                   f"({step.exposed * 1e3:.3f} ms)"))
    return out


def text(rig: Rig, res: OverlapResult, figs: Figures) -> str:
    """The report as text, in ferry-bench overlap's layout."""
    mib = res.n * res.n * 4 / (1 << 20)
    L = [rig.banner(), f"timing: {TIMING['cuda' if rig.gpu else 'host']}",
         f"overlap: {res.n}x{res.n} float32 matmul per step, its {mib:g} MiB output copied device to host",
         f"{res.rounds} rounds of fresh random inputs x {res.steps} timed steps (after {res.warmup} warm-up) per mode; "
         f"medians [min .. max] in ms; in-step blocks (rows): {' '.join(str(b - a) for a, b in res.blocks)}"
         + (f", on {res.lanes} compute streams in turn" if res.lanes > 1 and rig.gpu else ""), "",
         f"{'mode':<36} {'step':>10} {'[min .. max]':>24} {'exposed':>10} {'overlap':>8}"]
    for f in figs.modes:
        rng = f"[{f.step.min * 1e3:.3f} .. {f.step.max * 1e3:.3f}]"
        exp = f"{f.exposed * 1e3:.3f}" if f.exposed is not None else ""
        ov = f"{f.overlap:.1%}" if f.overlap is not None else ""
        L.append(f"{f.mode.name:<36} {f.step.median * 1e3:10.3f} {rng:>24} {exp:>10} {ov:>8}")
    L.append(f"\ncompute {figs.compute.median * 1e3:.3f} ms, copy {figs.copy_seconds * 1e3:.3f} ms ({figs.copy_from}) "
             "(exposed = step - compute; overlap = 1 - exposed / copy)")
    L += ["", "targets:"] + [f"  {t.line}" for t in figs.targets]
    if not rig.gpu:
        L.append("  (HOST BACKEND: the math runs on the CPU and the copies are memcpy: not GPU figures)")
    L += ["", "checks (bounds fixed before the run):"]
    for c in res.checks:
        state = "n/a" if not c.runs else ("ok" if c.passed else "FAIL")
        L.append(f"  {state:<4} {c.name:<22} worst {c.worst:<10.3g} bound {c.bound:<10.3g} "
                 f"{c.what}")
        if not c.passed:
            L.append(f"       first failure: {c.detail}")
    if res.skipped:
        L.append("\nskipped (torch has no GPU to run them on): " + "; ".join(res.skipped))
    L += [f"note: {n}" for n in figs.notes]
    return "\n".join(L) + "\n"


def _stat(s: Summary) -> dict[str, Any]:
    return {"median": s.median, "min": s.min, "max": s.max, "n": s.n}


def to_json(rig: Rig, res: OverlapResult, figs: Figures) -> str:
    """ferry-bench overlap's report keys, plus targets and the host-backend flag."""
    modes = []
    for f in figs.modes:
        m: dict[str, Any] = {"name": f.mode.name, "key": f.mode.key, "path": f.mode.path,
                             "strategy": f.mode.strategy, "step_seconds": _stat(f.step)}
        if f.exposed is not None:
            m["exposed_seconds"] = f.exposed
            m["overlap"] = f.overlap
        modes.append(m)
    doc = {
        "format": "ferry-python-overlap-report/1",
        "issued_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "environment": {**rig.environment(), "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32},
        "engine": "cuda" if rig.gpu else "host", "daemon_backend": rig.backend,
        "host_backend": not rig.gpu, "timing": TIMING["cuda" if rig.gpu else "host"],
        "workload": {"n": res.n, "bytes": res.n * res.n * 4, "steps": res.steps, "warmup": res.warmup,
                     "rounds": res.rounds, "blocks": [list(b) for b in res.blocks], "compute_streams": res.lanes},
        "compute_seconds": _stat(figs.compute), "compute_blocks_seconds": _stat(figs.compute_blocks),
        "copy_seconds": figs.copy_seconds, "modes": modes,
        "checks": [{"name": c.name, "what": c.what, "bound": c.bound, "worst": c.worst, "pass": c.passed,
                    "runs": c.runs,
                    **({"first_failure": c.detail} if not c.passed else {})} for c in res.checks],
        "targets": [{"name": t.name, "value": t.value, "met": t.met, "line": t.line} for t in figs.targets],
        "skipped": res.skipped, "notes": rig.notes + figs.notes,
        "checks_passed": all(c.passed for c in res.checks),
    }
    return json.dumps(doc, indent=1) + "\n"


def write_csv(path: str, rig: Rig, figs: Figures) -> None:
    """One line per mode, columns :data:`CSV_COLUMNS`."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS)
        w.writeheader()
        for m in figs.modes:
            w.writerow({"mode": m.mode.name, "key": m.mode.key, "path": m.mode.path, "strategy": m.mode.strategy,
                        "steps": m.step.n, "step_median_ms": m.step.median * 1e3, "step_min_ms": m.step.min * 1e3,
                        "step_max_ms": m.step.max * 1e3,
                        "exposed_ms": "" if m.exposed is None else m.exposed * 1e3,
                        "overlap": "" if m.overlap is None else m.overlap, "engine": "cuda" if rig.gpu else "host"})
