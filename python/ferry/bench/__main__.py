"""``python -m ferry.bench``: the command line of ferry's Python benchmarks (``--help``)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence

import ferry

from . import latency
from ._progress import Progress
from ._rig import HOST_BACKEND_WARNING, Rig, warn

EPILOG_SOCKET = "ferryd's control socket defaults to $FERRY_SOCKET, else /run/ferry/ferryd.sock."


def _seqs(text: str) -> tuple[int, ...]:
    try:
        seqs = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seqs takes comma-separated integers, not {text!r}") from None
    if not seqs or min(seqs) < 1:
        raise argparse.ArgumentTypeError("--seqs: sequence lengths must be positive")
    return seqs


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {v}")
    return v


def _count(text: str) -> int:
    v = int(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must not be negative, not {v}")
    return v


def parser() -> argparse.ArgumentParser:
    """The argument parser, with a subcommand per benchmark."""
    p = argparse.ArgumentParser(prog="python -m ferry.bench", description=(
        "ferry's Python benchmarks against a running ferryd. On ferryd's host backend (no GPU) the ferry paths run "
        "against host-memory stand-ins for device memory and every report says its figures are not GPU figures."),
        epilog=EPILOG_SOCKET)
    sub = p.add_subparsers(dest="command", required=True, metavar="{forum,overlap,latency}")

    f = sub.add_parser("forum", help="CPU<->GPU copies of (24,2,1,seq,4096) float16: torch's ways against ferry's",
                       description=(
                           "The PyTorch forum's 'fastest way to transfer tensors from CPU to GPU', done with warm-up, "
                           "repetitions and a byte check: shapes (24, 2, 1, seq, 4096) float16 (0.375 MiB per seq). "
                           "h2d: torch pageable .to('cuda'), pin_memory() then .to(non_blocking) (and pinning alone), "
                           "pre-pinned .to(non_blocking), a ferry pool tensor copy_ + wait(spin=True), ferry copy_staged_. d2h: "
                           ".to('cpu'), copy_ into a reused pageable tensor, into a pre-pinned one, ferry pool, ferry "
                           "staged. Then 4 KiB round trips from Python against libferry's C++ loop. Prints tables, "
                           "ratio columns and a verdict per target. Exit status 1 if a byte check failed."),
                       epilog=EPILOG_SOCKET + " ferryd's pool must hold the largest tensor plus staging buffers "
                       "(392 MiB at seq 1046: give it 1 GiB or more).")
    f.add_argument("--socket", help="ferryd's control socket")
    f.add_argument("--reps", type=_positive, help="timed repetitions per path and size (default 20; --quick 5)")
    f.add_argument("--warmup", type=_count, help="untimed calls first (default 3; --quick 1)")
    f.add_argument("--seqs", type=_seqs, help="sequence lengths, comma-separated (default 1,2,4,...,512,1046; "
                   "--quick 1,16,64)")
    f.add_argument("--latency-reps", type=_positive, help="4 KiB round trips per direction, each of Python and C++ "
                   "(default 2000; --quick 200)")
    f.add_argument("--no-latency", action="store_true", help="leave out the 4 KiB round trips")
    f.add_argument("--csv", metavar="FILE", help="write one line per path and size (and latency figure)")
    f.add_argument("--json", action="store_true", help="print one JSON object (every sample) instead of the tables")
    f.add_argument("--plot", metavar="FILE.svg", help="write an SVG plot: GB/s (or ms) against size, log axes")
    f.add_argument("--plot-metric", choices=("gbps", "ms"), default="gbps", help="what the plot's y axis shows")
    f.add_argument("--stream-waitable", action="store_true",
                   help="make ferry's pool copies stream-waitable (an event per copy), as copies a CUDA stream "
                        "waits for are; default: not, since the forum waits on the host")
    f.add_argument("--quick", action="store_true", help="few sizes and repetitions (a smoke test, not figures)")
    f.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    f.set_defaults(run=_forum)

    o = sub.add_parser("overlap", help="matmul steps with their output copied to the host: exposed copy time",
                       description=(
                           "The seed workload: each step a 4096x4096 float32 torch.matmul on the step stream, its "
                           "64 MiB output copied to the host. Modes as ferry-bench overlap's: compute alone, compute "
                           "cut in blocks, copy alone, serial (torch: the copy after the math on the same stream; ferry: "
                           "copy_ after an event, waited for in the same step), pipelined "
                           "(torch side stream into pinned memory; ferry copy_ after= an event, into a pool tensor, "
                           "waited for on the GPU before the buffer is reused), in-step blocks (each block's copy "
                           "starts when its math is done). exposed = median step - median compute step; overlap = "
                           "1 - exposed / copy. Targets: ferry pipelined exposed <= 2% of serial; ferry in-step "
                           "<= 0.11 ms (H200, n = 4096). Exit status 1 if a check failed."),
                       epilog=EPILOG_SOCKET)
    o.add_argument("--socket", help="ferryd's control socket")
    o.add_argument("--n", type=_positive, help="matrix size (default 4096; 512 on the host backend, where the math "
                   "runs on the CPU; --quick 512 or 256)")
    o.add_argument("--steps", type=_positive, help="timed steps per mode and round (default 30; --quick 6)")
    o.add_argument("--warmup", type=_count, help="warm-up steps per mode and round (default 5; --quick 2)")
    o.add_argument("--rounds", type=_positive, help="rounds, each with fresh random inputs (default 3; --quick 1)")
    o.add_argument("--pieces", type=_positive, default=6, help="in-step: row blocks of the math (default 6)")
    o.add_argument("--ratio", type=float, default=0.5, help="in-step: each block this fraction of the one before")
    o.add_argument("--lanes", type=_positive, default=2, help="in-step: compute streams the blocks take turns on "
                   "(default 2)")
    o.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    o.add_argument("--csv", metavar="FILE", help="write one line per mode")
    o.add_argument("--quick", action="store_true", help="a small, short run (a smoke test, not figures)")
    o.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    o.set_defaults(run=_overlap)

    lt = sub.add_parser("latency", help="4 KiB round trips: Python copy_ + wait against libferry's C++ loop",
                        description=(
                            "4 KiB copies between a pool tensor and device memory, each waited for, timed from "
                            "Python (copy_ + wait, perf_counter_ns) and in C++ (client.time_round_trips: libferry "
                            "alone), in alternating blocks. Target: Python's p50 within 3 us of C++'s."),
                        epilog=EPILOG_SOCKET)
    lt.add_argument("--socket", help="ferryd's control socket")
    lt.add_argument("--reps", type=_positive, default=2000, help="round trips per direction and side (default 2000)")
    lt.add_argument("--warmup", type=_count, default=100, help="untimed round trips first (default 100)")
    lt.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    lt.add_argument("--quiet", action="store_true", help="no progress bar on stderr")
    lt.set_defaults(run=_latency)
    return p


def _forum(a: argparse.Namespace, rig: Rig) -> int:
    from . import _forum_report as report
    from . import forum

    rig.stream_waitable = a.stream_waitable
    seqs = a.seqs or (forum.QUICK_SEQS if a.quick else forum.DEFAULT_SEQS)
    reps = a.reps or (5 if a.quick else 20)
    warmup = a.warmup if a.warmup is not None else (1 if a.quick else 3)
    lat_reps = a.latency_reps or (200 if a.quick else 2000)
    progress = Progress(forum.progress_steps(rig, seqs) + (0 if a.no_latency else 2), enabled=not a.quiet)
    res = forum.run(rig, seqs, reps, warmup, progress)
    lat_rows = [] if a.no_latency else latency.measure(rig, lat_reps, 20 if a.quick else 200, progress)
    progress.finish()
    rats = report.ratios(res)
    tgts = report.targets(res, rats, lat_rows, rig.gpu)
    if a.csv:
        report.write_csv(a.csv, rig, res, lat_rows)
    if a.plot:
        report.write_plot(a.plot, rig, res, a.plot_metric)
    sys.stdout.write(report.to_json(rig, res, rats, lat_rows, tgts) if a.json
                     else report.text(rig, res, rats, lat_rows, tgts))
    return 0 if res.checks_passed and all(r.checked for r in lat_rows) else 1


def _overlap(a: argparse.Namespace, rig: Rig) -> int:
    from . import _overlap_report as report
    from .overlap import Runner

    n = a.n or ((512 if rig.gpu else 256) if a.quick else (4096 if rig.gpu else 512))
    steps = a.steps or (6 if a.quick else 30)
    warmup = a.warmup if a.warmup is not None else (2 if a.quick else 5)
    rounds = a.rounds or (1 if a.quick else 3)
    runner = Runner(rig, n, steps, warmup, rounds, a.pieces, a.ratio, a.lanes)
    progress = Progress(rounds * len(runner.res.modes), enabled=not a.quiet)
    res = runner.run(progress)
    progress.finish()
    figs = report.figures(res, rig.gpu)
    if a.csv:
        report.write_csv(a.csv, rig, figs)
    sys.stdout.write(report.to_json(rig, res, figs) if a.json else report.text(rig, res, figs))
    return 0 if all(c.passed for c in res.checks) else 1


def _latency(a: argparse.Namespace, rig: Rig) -> int:
    progress = Progress(2, enabled=not a.quiet)
    rows = latency.measure(rig, a.reps, a.warmup, progress)
    progress.finish()
    line, met = latency.verdict(rows)
    if a.json:
        print(json.dumps({"format": "ferry-python-latency/1", "environment": rig.environment(),
                          "host_backend": not rig.gpu, "rows": [r.as_dict() for r in rows],
                          "target": {"line": line, "met": met}, "notes": rig.notes}, indent=1))
    else:
        print(rig.banner())
        print(latency.table(rows))
        print(line)
    return 0 if all(r.checked for r in rows) else 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the command in ``argv`` (default: the process's); returns the exit status."""
    a = parser().parse_args(argv)
    rig = Rig(a.socket)
    try:
        if not rig.gpu:
            warn(HOST_BACKEND_WARNING)
        return a.run(a, rig)
    except ferry.ResourceExhausted as e:
        warn(f"{e}: ferryd's pool is too small for this run; start it with a larger --pool-size")
        return 2
    except ferry.Error as e:
        warn(str(e))
        return 2
    except KeyboardInterrupt:
        warn("interrupted")
        return 130
    finally:
        rig.close()


if __name__ == "__main__":
    sys.exit(main())
