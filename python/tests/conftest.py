"""pytest setup for ferry's Python tests: real ferryd processes and clients of them.

Environment:
  FERRY_TEST_FERRYD   the ferryd to run (default: the one in the build tree of the ferry extension
                      being imported, else ``ferryd`` on PATH)
  FERRY_TEST_BACKEND  the backend of the shared ferryd: host (default) or cuda

Each ferryd runs in a fresh private directory (so that parallel runs never share a socket), logs
to a file there, and is shown in the report of a test that fails while using it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

import pytest

import ferry
from ferryd_process import Ferryd, FerrydFactory

if TYPE_CHECKING:
    import torch


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU, torch with CUDA and ferryd's cuda backend")


def _find_ferryd() -> str:
    """FERRY_TEST_FERRYD, else the ferryd of the build tree the extension comes from, else PATH."""
    configured = os.environ.get("FERRY_TEST_FERRYD")
    if configured:
        return configured
    # <build>/python/ferry/_ferry.*.so -> <build>/ferryd (resolving a link into the build tree).
    beside = Path(ferry._ferry.__file__).resolve().parent.parent.parent / "ferryd"
    if beside.is_file():
        return str(beside)
    on_path = shutil.which("ferryd")
    if on_path:
        return on_path
    raise pytest.UsageError("no ferryd found: set FERRY_TEST_FERRYD to the ferryd binary")


@pytest.fixture(scope="session")
def ferryd_binary() -> str:
    """Path of the ferryd binary the tests run."""
    path = _find_ferryd()
    if not os.access(path, os.X_OK):
        raise pytest.UsageError(f"FERRY_TEST_FERRYD={path} is not an executable file")
    return path


@pytest.fixture(scope="session")
def backend() -> str:
    """The shared ferryd's backend, from FERRY_TEST_BACKEND (host or cuda)."""
    name = os.environ.get("FERRY_TEST_BACKEND", "host")
    if name not in ("host", "cuda"):
        raise pytest.UsageError(f"FERRY_TEST_BACKEND must be host or cuda, not {name!r}")
    return name


@pytest.fixture(scope="session")
def ferryd(ferryd_binary: str, backend: str) -> Iterator[Ferryd]:
    """One ferryd shared by the session (256 MiB pool of 1 MiB slabs) on FERRY_TEST_BACKEND."""
    d = Ferryd(ferryd_binary, backend)
    try:
        d.start()
        yield d
    finally:
        d.close()


@pytest.fixture
def make_ferryd(ferryd_binary: str, backend: str) -> Iterator[FerrydFactory]:
    """A factory of ferryds of the test's own (to kill, pause or restart); all stopped at its end."""
    factory = FerrydFactory(ferryd_binary, backend)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def client(ferryd: Ferryd, request: pytest.FixtureRequest) -> Iterator[ferry.Client]:
    """A client of the shared ferryd, closed at the end of the test."""
    if ferryd.paused:  # a test that failed while it had ferryd stopped
        ferryd.resume()
    c = ferryd.client(name=request.node.name[:60])
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> "torch.Generator":
    """A torch random generator for the test's data, seeded per test so that a failure repeats."""
    import zlib

    import torch

    return torch.Generator().manual_seed(zlib.crc32(request.node.nodeid.encode()))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Adds the log of every ferryd a failed test used to its report."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    daemons: list[Ferryd] = []
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, Ferryd):
            daemons.append(value)
        elif isinstance(value, FerrydFactory):
            daemons.extend(value.started)
    for d in daemons:
        report.sections.append((f"ferryd log ({d.describe()})", d.log_tail()))
