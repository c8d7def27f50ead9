"""``python -m ferry.bench`` against a real ferryd on the host backend: the commands run, write
what they promise (CSV columns, JSON keys, an SVG with one line per path), check bytes, and say
that host-backend figures are not GPU figures.

The ferryd here is this file's own (``bench_host_ferryd``): started from FERRY_TEST_FERRYD, else
the ferryd of the build tree the extension comes from, else ``ferryd`` on PATH.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Iterator

import pytest

import ferry
from ferry.bench import _forum_report, _overlap_report, forum
from ferry.bench._rig import Rig
from ferry.bench._stats import summarize
from ferry.bench._svg import Series, line_plot
from ferry.bench.overlap import row_blocks
from ferryd_process import Ferryd

SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def bench_host_ferryd(ferryd_binary: str) -> Iterator[str]:
    """A ferryd of this module's own on the host backend; yields its socket."""
    d = Ferryd(ferryd_binary, "host")
    try:
        d.start()
        yield d.socket
    finally:
        d.close()


def _bench(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Runs ``python -m ferry.bench ARGS`` with this process's ferry package first on the path."""
    env = dict(os.environ)
    pkg_parent = str(Path(ferry.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([pkg_parent] + [p for p in [env.get("PYTHONPATH")] if p])
    return subprocess.run([sys.executable, "-m", "ferry.bench", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


def test_every_command_has_help() -> None:
    for cmd in ([], ["forum"], ["overlap"], ["latency"]):
        r = _bench(*cmd, "--help")
        assert r.returncode == 0, r.stderr
        assert "usage: python -m ferry.bench" in r.stdout


def test_forum_quick_writes_csv_and_an_svg_with_one_line_per_path(bench_host_ferryd: str, tmp_path: Path) -> None:
    csv_path, svg_path = tmp_path / "forum.csv", tmp_path / "forum.svg"
    r = _bench("forum", "--socket", bench_host_ferryd, "--quick", "--latency-reps", "50", "--csv", str(csv_path),
               "--plot", str(svg_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "HOST BACKEND" in r.stdout and "NOT GPU figures" in r.stdout
    assert "HOST BACKEND" in r.stderr  # said on stderr too, where a log of the run keeps it
    assert "byte checks: all passed" in r.stdout
    assert "targets:" in r.stdout and "Python 4 KiB round trip p50 within 3 us of C++" in r.stdout

    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == _forum_report.CSV_COLUMNS
        rows = list(reader)
    bw = [x for x in rows if x["test"] == "bandwidth"]
    series = sorted({(x["direction"], x["path"]) for x in bw})
    # The host backend runs ferry's paths only; the torch CUDA paths are skipped.
    assert series == [("d2h", "ferry_pool"), ("d2h", "ferry_staged"), ("h2d", "ferry_pool"), ("h2d", "ferry_staged")]
    for d, p in series:
        mine = [x for x in bw if (x["direction"], x["path"]) == (d, p)]
        assert [int(x["seq"]) for x in mine] == list(forum.QUICK_SEQS)
        for x in mine:
            assert x["checked"] == "True"
            assert int(x["bytes"]) == forum.nbytes(int(x["seq"]))
            assert int(x["reps"]) == 5
            assert 0 < float(x["min_ms"]) <= float(x["median_ms"]) <= float(x["p99_ms"]) <= float(x["max_ms"])
            assert abs(float(x["gbps"]) - int(x["bytes"]) / float(x["median_ms"]) / 1e6) < 1e-6 * float(x["gbps"])
            assert x["backend"] == "host"
    lat = [x for x in rows if x["test"] == "latency"]
    assert sorted((x["direction"], x["path"]) for x in lat) == [
        ("d2h", "cpp_round_trip"), ("d2h", "python_copy_wait"), ("h2d", "cpp_round_trip"), ("h2d", "python_copy_wait")]
    assert all(int(x["reps"]) == 50 and x["checked"] == "True" for x in lat)

    root = ET.parse(svg_path).getroot()
    assert root.tag == SVG_NS + "svg"
    lines = [e for e in root.iter(SVG_NS + "polyline") if e.get("class") == "series"]
    assert len(lines) == len(series)
    names = {e.get("data-series") for e in lines}
    assert names == {f"{d}: {next(p.label for p in forum.PATHS if (p.direction, p.key) == (d, k)).strip()}"
                     for d, k in series}
    for e in lines:
        assert len((e.get("points") or "").split()) == len(forum.QUICK_SEQS)
    text = " ".join(t.text or "" for t in root.iter(SVG_NS + "text"))
    assert "tensor size (MiB)" in text and "GB/s" in text and "HOST BACKEND" in text
    if shutil.which("rsvg-convert"):
        png = tmp_path / "forum.png"
        subprocess.run(["rsvg-convert", "-o", str(png), str(svg_path)], check=True, timeout=60)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_forum_json_holds_every_sample_and_the_targets(bench_host_ferryd: str) -> None:
    r = _bench("forum", "--socket", bench_host_ferryd, "--seqs", "1,2", "--reps", "3", "--warmup", "1",
               "--no-latency", "--json", "--quiet")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["format"] == "ferry-python-forum/1"
    assert doc["host_backend"] is True and doc["environment"]["ferryd_backend"] == "host"
    assert doc["checks_passed"] is True
    assert doc["seqs"] == [1, 2] and doc["reps"] == 3
    assert len(doc["rows"]) == 2 * 4
    for row in doc["rows"]:
        assert len(row["samples_ns"]) == 3 and all(ns > 0 for ns in row["samples_ns"])
    names = [t["name"] for t in doc["targets"]]
    assert len(names) == 4
    pool = doc["targets"][0]
    assert pool["met"] is None and "not measured" in pool["line"]  # no torch GPU path to compare with
    assert doc["latency"] == []


def test_overlap_quick_json(bench_host_ferryd: str, tmp_path: Path) -> None:
    csv_path = tmp_path / "overlap.csv"
    r = _bench("overlap", "--socket", bench_host_ferryd, "--quick", "--json", "--quiet", "--csv", str(csv_path))
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["format"] == "ferry-python-overlap-report/1"
    assert doc["engine"] == "host" and doc["daemon_backend"] == "host" and doc["host_backend"] is True
    assert any("NOT GPU figures" in n for n in doc["notes"])
    w = doc["workload"]
    assert w["n"] == 256 and w["bytes"] == 256 * 256 * 4 and w["steps"] == 6 and w["rounds"] == 1
    assert sum(b - a for a, b in w["blocks"]) == w["n"]
    for key in ("compute_seconds", "compute_blocks_seconds", "copy_seconds", "modes", "checks", "targets"):
        assert key in doc
    modes = {m["key"]: m for m in doc["modes"]}
    assert set(modes) == {"compute", "compute_blocks", "ferry_copy", "ferry_serial", "ferry_pipelined",
                          "ferry_in_step"}
    assert {m["strategy"] for m in doc["modes"]} == {"compute", "copy", "serial", "pipelined", "in-step"}
    for m in doc["modes"]:
        assert m["step_seconds"]["n"] == 6 and m["step_seconds"]["median"] > 0
        has_exposed = m["strategy"] in ("serial", "pipelined", "in-step")
        assert ("exposed_seconds" in m) == has_exposed
        if has_exposed:
            assert m["exposed_seconds"] == pytest.approx(m["step_seconds"]["median"] - doc["compute_seconds"]["median"])
    assert set(doc["skipped"]) == {"copy alone, in-process (torch)", "in-process serial (torch)",
                                   "in-process side stream (torch)", "in-process in-step blocks (torch)"}
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["ferry-copy-exact"]["pass"] and checks["copy-after-math"]["pass"]
    assert checks["ferry-copy-exact"]["runs"] > 0
    assert checks["in-process-copy-exact"]["runs"] == 0  # no torch copy ran: nothing was checked
    assert doc["checks_passed"] is True
    assert doc["targets"][0]["name"].startswith("ferry pipelined: exposed <= 2% of serial")
    with open(csv_path, newline="") as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames or ()) == _overlap_report.CSV_COLUMNS
        assert sorted(x["key"] for x in reader) == sorted(modes)


def test_the_byte_check_catches_a_copy_that_did_not_happen(bench_host_ferryd: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # The checked call loads other random bytes and poisons the destination: a path that leaves
    # the destination alone, or delivers the timed calls' bytes, must fail.
    monkeypatch.setattr(forum._Case, "_h2d_ferry_pool", lambda self: setattr(self, "result", self._t(self.b.dev)))
    rig = Rig(bench_host_ferryd)
    try:
        bufs = forum._Buffers(rig, forum.nbytes(2), seed=7)
        path = next(p for p in forum.PATHS if (p.direction, p.key) == ("h2d", "ferry_pool"))
        [row] = forum.measure(rig, bufs, path, 2, reps=2, warmup=0)
        assert row.checked is False and row.bad_bytes > forum.nbytes(2) // 2
        assert "CHECK FAILED" in row.note
        good = next(p for p in forum.PATHS if (p.direction, p.key) == ("d2h", "ferry_pool"))
        [ok] = forum.measure(rig, bufs, good, 2, reps=2, warmup=0)
        assert ok.checked is True and ok.bad_bytes == 0
    finally:
        rig.close()


def test_summaries_count_samples_over_one_and_a_half_medians() -> None:
    s = summarize([1.0, 1.0, 1.1, 1.2, 1.79, 1.81, 3.0])
    assert (s.n, s.median, s.min, s.max) == (7, 1.2, 1.0, 3.0)
    assert s.outliers == 2 and s.outlier_reps == [5, 6]  # over 1.5 x 1.2 = 1.8
    assert summarize([2.0, 4.0]).median == 3.0


def test_row_blocks_cover_the_matrix_in_shrinking_aligned_blocks() -> None:
    blocks = row_blocks(4096, 6, 0.5, 64)
    assert [b - a for a, b in blocks] == [2048, 1024, 512, 256, 128, 128]  # ferry-bench's cut, in rows
    for n, pieces in ((256, 6), (1000, 3), (512, 1)):
        blocks = row_blocks(n, pieces, 0.5, 8)
        assert blocks[0][0] == 0 and blocks[-1][1] == n
        assert all(a1 == b0 for (_, a1), (b0, _) in zip(blocks, blocks[1:]))


def test_svg_log_axes_put_points_in_order_and_leave_out_non_positive_ones() -> None:
    svg = line_plot([Series("a", [(1.0, 1.0), (10.0, 100.0), (100.0, 10.0)]), Series("b", [(1.0, 0.0), (10.0, 5.0)])],
                    title="t <&>", x_label="x", y_label="y", warning="w")
    root = ET.fromstring(svg)
    lines = [e for e in root.iter(SVG_NS + "polyline")]
    assert [e.get("data-series") for e in lines] == ["a", "b"]
    pts = [tuple(map(float, p.split(","))) for p in (lines[0].get("points") or "").split()]
    assert len(pts) == 3
    assert pts[0][0] < pts[1][0] < pts[2][0]  # x grows to the right
    assert pts[1][1] < pts[2][1] < pts[0][1]  # larger y is higher up (smaller SVG y)
    assert abs((pts[1][0] - pts[0][0]) - (pts[2][0] - pts[1][0])) < 0.2  # equal decades, equal widths
    assert len((lines[1].get("points") or "").split()) == 1  # y = 0 has no place on a log axis
    assert any(t.text == "t <&>" for t in root.iter(SVG_NS + "text"))
