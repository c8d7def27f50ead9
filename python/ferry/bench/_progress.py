"""A progress bar on stderr: redrawn in place on a terminal, one line per step otherwise."""

from __future__ import annotations

import sys
import time
from typing import Optional, TextIO


class Progress:
    """Counts steps of a long benchmark towards ``total`` and shows where it is on stderr.

    On a terminal it redraws one bar (with the elapsed time); in a log it writes one short line
    per step, so captured output stays readable. ``enabled=False`` (``--quiet``) shows nothing.
    """

    def __init__(self, total: int, enabled: bool = True, stream: Optional[TextIO] = None, width: int = 30) -> None:
        self.total = max(total, 1)
        self.done = 0
        self.enabled = enabled
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.started = time.monotonic()

    def step(self, what: str) -> None:
        """Marks one step done; ``what`` names it."""
        self.done += 1
        self.total = max(self.total, self.done)  # an estimate that ran short
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.started
        if self.tty:
            filled = self.width * self.done // self.total
            bar = "#" * filled + " " * (self.width - filled)
            self.stream.write(f"\r[{bar}] {100 * self.done // self.total:3d}% {elapsed:6.1f}s {what[:48]:<48}")
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(f"[{self.done}/{self.total}] {elapsed:.1f}s {what}\n")
        self.stream.flush()

    def finish(self) -> None:
        """Ends the bar's line on a terminal if the estimate ran long."""
        if self.enabled and self.tty and self.done < self.total:
            self.stream.write("\n")
            self.stream.flush()
