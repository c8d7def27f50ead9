"""A ferryd process for tests: started in a private directory, stopped, killed, paused, restarted."""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import ferry

_UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes of a ferryd size such as "256MiB"."""
    for unit, scale in _UNITS.items():
        if text.endswith(unit):
            return int(text[: -len(unit)]) * scale
    return int(text)


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the process that started it exits (PR_SET_PDEATHSIG)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG


class Ferryd:
    """One ferryd: its own runtime directory (socket, lock, config, log), on a given backend.

    The config file written there keeps ferryd from reading /etc/ferry/ferryd.yaml and turns the
    metrics exporter off, so that runs in parallel share no socket and no port. The log file
    gathers the output of every start, and outlives :meth:`close` in memory for the report.
    """

    def __init__(self, binary: str, backend: str = "host", *, pool_size: str = "256MiB",
                 slab_size: str = "1MiB", config: str = "") -> None:
        self.binary = binary
        self.backend = backend
        self.pool_bytes = parse_size(pool_size)
        self.slab_bytes = parse_size(slab_size)
        self.dir = Path(tempfile.mkdtemp(prefix="ferry-test-"))  # short: a socket path has 107 bytes at most
        self.socket = str(self.dir / "ferryd.sock")
        self.log_path = self.dir / "ferryd.log"
        self.config_path = self.dir / "ferryd.yaml"
        self.config_path.write_text('metrics:\n  address: ""\n' + config)  # config: more YAML keys
        self.args = [binary, "--config", str(self.config_path), "--runtime-dir", str(self.dir), "--backend", backend,
                     "--pool-size", pool_size, "--slab-size", slab_size]
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self.paused = False
        self._final_log: Optional[str] = None

    # --- life --------------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        """Whether the process was started and has not exited."""
        return self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int:
        """The running process's id."""
        assert self.proc is not None, "ferryd was never started"
        return self.proc.pid

    def start(self, timeout: float = 60.0) -> None:
        """Starts ferryd and returns once its socket accepts connections."""
        if self.running:
            raise RuntimeError(f"ferryd (pid {self.pid}) is already running")
        try:
            os.unlink(self.socket)  # left behind by a killed ferryd; ours alone, in our own directory
        except FileNotFoundError:
            pass
        with open(self.log_path, "ab") as log:
            log.write(f"--- {' '.join(self.args)}\n".encode())
            log.flush()
            # A session of its own: a Ctrl-C at the terminal stops pytest, whose teardown stops ferryd.
            # Should pytest itself die (a ctest timeout), ferryd gets SIGTERM from the kernel.
            self.proc = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        self.paused = False
        deadline = time.monotonic() + timeout
        while not self._accepts():
            code = self.proc.poll()
            if code is not None:
                raise RuntimeError(f"ferryd exited with status {code} before it listened:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"ferryd did not listen on {self.socket} within {timeout} s:\n{self.log_tail()}")
            time.sleep(0.01)

    def _accepts(self) -> bool:
        if not os.path.exists(self.socket):
            return False
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:  # ferryd speaks SEQPACKET
            try:
                s.connect(self.socket)
                return True
            except OSError as e:
                if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
                    return False
                raise

    def stop(self, timeout: float = 20.0) -> Optional[int]:
        """SIGTERM (ferryd's clean stop), then SIGKILL after ``timeout`` seconds; the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            if self.paused:
                self.resume()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> int:
        """SIGKILL: ferryd dies at once, whatever it was doing; the exit status."""
        assert self.proc is not None, "ferryd was never started"
        if self.proc.poll() is None:
            self.proc.kill()  # ends a stopped process too
        self.paused = False
        return self.proc.wait()

    def restart(self) -> None:
        """Stops ferryd if it runs (cleanly) and starts it again on the same socket."""
        self.stop()
        self.start()

    def pause(self, timeout: float = 20.0) -> None:
        """SIGSTOP; returns once every thread of ferryd is stopped, so that nothing it does moves on."""
        os.kill(self.pid, signal.SIGSTOP)
        self.paused = True
        deadline = time.monotonic() + timeout
        while not self._all_threads_stopped():
            if time.monotonic() > deadline:
                raise RuntimeError(f"ferryd (pid {self.pid}) did not stop within {timeout} s")
            time.sleep(0.002)

    def resume(self) -> None:
        """SIGCONT: a paused ferryd goes on."""
        os.kill(self.pid, signal.SIGCONT)
        self.paused = False

    def _all_threads_stopped(self) -> bool:
        tasks = Path(f"/proc/{self.pid}/task")
        for task in tasks.iterdir():
            try:
                stat = (task / "stat").read_text()
            except FileNotFoundError:
                continue  # a thread that just exited
            state = stat[stat.rindex(")") + 2]
            if state not in "tT":
                return False
        return True

    def close(self) -> None:
        """Stops ferryd and removes its directory (keeping the log text for a report)."""
        try:
            self.stop()
        finally:
            self._final_log = self._read_log()
            shutil.rmtree(self.dir, ignore_errors=True)

    # --- use ---------------------------------------------------------------------------------------

    def client(self, **options: Any) -> ferry.Client:
        """A new ferry.Client of this ferryd."""
        return ferry.Client(self.socket, **options)

    def describe(self) -> str:
        """One line: backend, pid and directory."""
        pid = self.proc.pid if self.proc is not None else "-"
        return f"{self.backend} backend, pid {pid}, {self.dir}"

    def log_tail(self, lines: int = 200) -> str:
        """The last ``lines`` lines of ferryd's output."""
        text = self._final_log if self._final_log is not None else self._read_log()
        return "\n".join(text.splitlines()[-lines:])

    def _read_log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


class FerrydFactory:
    """Starts ferryds for one test (or one module) and stops every one of them at its end."""

    def __init__(self, binary: str, backend: str) -> None:
        self.binary = binary
        self.backend = backend
        self.started: list[Ferryd] = []

    def __call__(self, backend: Optional[str] = None, **options: Any) -> Ferryd:
        d = Ferryd(self.binary, backend or self.backend, **options)
        self.started.append(d)
        d.start()
        return d

    def close(self) -> None:
        for d in self.started:
            d.close()
