#!/usr/bin/env python3
"""Runs ferry's GPU tests (pytest -m gpu) against a ferryd on the cuda backend.

Exits 77 (ctest's "skipped"), saying why, where they cannot run: torch missing, no CUDA device
visible to torch, or a ferry extension built without CUDA. Otherwise runs pytest on the given
test directory with FERRY_TEST_BACKEND=cuda and exits with its status.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

SKIPPED = 77


def why_not() -> Optional[str]:
    """Why the GPU tests cannot run here, or None when they can."""
    try:
        import torch
    except ImportError as e:
        return f"torch is not installed ({e})"
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return f"torch {torch.__version__} sees no CUDA device (torch.version.cuda = {torch.version.cuda})"
    try:
        import ferry
    except ImportError as e:
        return f"the ferry package does not import ({e}); set PYTHONPATH to <build>/python"
    if not ferry.built_with_cuda:
        return "ferry was built without CUDA (FERRY_CUDA=OFF)"
    return None


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tests", nargs="?", default=str(Path(__file__).resolve().parent),
                        help="the test directory (default: this script's)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER,
                        help="more arguments for pytest, after the directory (e.g. -x -k staged)")
    args = parser.parse_args(argv)

    reason = why_not()
    if reason is not None:
        print(f"ferry GPU tests skipped: {reason}", flush=True)
        return SKIPPED

    env = dict(os.environ, FERRY_TEST_BACKEND="cuda")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", "-rs", args.tests,
               *args.pytest_args]
    print("running:", " ".join(command), flush=True)
    return subprocess.call(command, env=env)


if __name__ == "__main__":
    sys.exit(main())
