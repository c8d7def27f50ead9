"""ferry's Python benchmarks: ``python -m ferry.bench {forum,overlap,latency} --help``.

- ``forum``: host<->GPU copies of (24, 2, 1, seq, 4096) float16 tensors by every PyTorch way
  (pageable, pin-then-copy, pre-pinned) against ferry's pool tensors and staged copies, with a
  4 KiB round trip against libferry's own; tables, targets, CSV, JSON and an SVG plot.
- ``overlap``: a 4096x4096 float32 matmul per step with its 64 MiB output copied to the host:
  serial, torch's side stream, ferry pipelined and in-step blocks; exposed time per step.
- ``latency``: the 4 KiB round trip alone.

Without a GPU (ferryd's host backend) the ferry paths still run, against host-memory stand-ins
for device memory, and every report says loudly that its figures are not GPU figures.
"""
