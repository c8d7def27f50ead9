"""What a benchmark runs on: a ferry client, the GPU torch sees (if any), and how to make
device memory, synchronize and describe the machine.

On the cuda backend "device memory" is a CUDA tensor of torch's caching allocator. On the host
backend (no GPU) it is a stand-in from ``client.empty_device``: host memory that ferryd treats as
the device, so the ferry paths run for real, but their figures are memcpy, not PCIe.
"""

from __future__ import annotations

import platform
import socket as _socket
import sys
from typing import Any, Optional

import torch

import ferry

HOST_BACKEND_WARNING = ("HOST BACKEND: ferryd simulates the GPU in host memory; these figures are memcpy "
                        "through ferryd, NOT GPU figures (run on a GPU with ferryd --backend cuda for those)")
TIMING_NOTE = ("timing: host clock (time.perf_counter_ns) around each call; a sample ends once the copy "
               "is complete (torch.cuda.synchronize(), which spins, for torch paths; Transfer.wait(spin=True) "
               "or the blocking copy_staged_ for ferry paths)")


class Rig:
    """A connected :class:`ferry.Client` and the device it copies to and from."""

    def __init__(self, socket: Optional[str]) -> None:
        try:
            self.client = ferry.Client(socket, name="ferry-bench")
        except ferry.Unavailable as e:
            raise SystemExit(f"ferry.bench: no ferryd at {socket or ferry.default_socket()}: {e}") from e
        self.backend = self.client.backend
        self.torch_cuda = torch.cuda.is_available()
        self.notes: list[str] = []
        # Whether the forum's pool copies are stream-waitable (ferryd records an event per copy);
        # they are waited for on the host, so by default not.
        self.stream_waitable = False
        if self.backend == "cuda" and not self.torch_cuda:
            raise SystemExit("ferry.bench: ferryd drives a GPU but this torch has no CUDA: install a CUDA build "
                             "of torch to benchmark against it")
        self.gpu = self.backend == "cuda"
        self.device: Optional[torch.device] = torch.device("cuda", self.client.device) if self.gpu else None
        if self.gpu:
            torch.cuda.set_device(self.device)
            self.gpu_name = torch.cuda.get_device_name(self.device)
        else:
            self.gpu_name = "no GPU (ferryd host backend)"
            self.notes.append(HOST_BACKEND_WARNING)
            if self.torch_cuda:
                self.notes.append("torch sees a GPU, but ferryd runs the host backend: the torch CUDA paths are "
                                  "skipped so that nothing is compared across the two")
            else:
                self.notes.append("torch has no GPU here: the torch CUDA paths are skipped")

    def close(self) -> None:
        """Ends the ferry session."""
        self.client.close()

    def device_bytes(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of device memory as a uint8 tensor (a stand-in on the host backend)."""
        if self.gpu:
            return torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self.client.empty_device(nbytes, torch.uint8)

    def sync(self) -> None:
        """Waits for all work queued on this process's GPU (nothing to wait for without one)."""
        if self.gpu:
            torch.cuda.synchronize(self.device)

    def environment(self) -> dict[str, Any]:
        """Where the figures come from, for reports."""
        env: dict[str, Any] = {
            "host": _socket.gethostname(), "ferry_version": ferry.__version__, "ferryd_backend": self.backend,
            "device": self.client.device, "gpu": self.gpu_name, "torch": torch.__version__,
            "python": platform.python_version(), "host_backend": not self.gpu,
        }
        if self.gpu:
            env["cuda_runtime"] = torch.version.cuda
            props = torch.cuda.get_device_properties(self.device)
            env["gpu_memory_bytes"] = props.total_memory
        return env

    def banner(self) -> str:
        """A header for text output: the machine, the backend, and the host-backend warning."""
        env = self.environment()
        lines = [f"ferry {env['ferry_version']}, ferryd backend {self.backend}, {self.gpu_name}, torch {env['torch']}"
                 f"{', CUDA ' + str(env['cuda_runtime']) if self.gpu else ''}, Python {env['python']} on {env['host']}"]
        if not self.gpu:
            bar = "!" * min(100, len(HOST_BACKEND_WARNING))
            lines += [bar, HOST_BACKEND_WARNING, bar]
        lines += [n for n in self.notes if n != HOST_BACKEND_WARNING]
        return "\n".join(lines)


def warn(msg: str) -> None:
    """A line on stderr."""
    print(f"ferry.bench: {msg}", file=sys.stderr)
