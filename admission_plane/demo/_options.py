"""The demo's options and its progress display."""

from __future__ import annotations

import time
from typing import TextIO

import attrs


@attrs.frozen
class DemoOptions:
    """Flags of ``admission-plane demo`` (see ``admission-plane demo --help``)."""

    agents: int = 6
    turns: int = 5
    seats: int = 3
    starts: int = 2
    start_interval_ms: int = 0
    cooldown_ms: int = 4_000
    models: tuple[str, ...] = ("model-a", "model-b")
    provider_ms: tuple[int, int] = (200, 700)
    capacity_fault: bool = True
    kill_fault: bool = True
    database: str | None = None
    key_file: str | None = None
    json_summary: bool = False
    progress: str = "auto"
    queue_timeout_ms: int = 600_000


class Display:
    """A redrawn line on a terminal, plain periodic lines otherwise."""

    def __init__(self, mode: str, out: TextIO) -> None:
        if mode == "auto":
            mode = "live" if out.isatty() else "lines"
        self.mode, self.out = mode, out
        self._last_line = ""
        self._last_print = 0.0

    def update(self, line: str) -> None:
        if self.mode == "live":
            self.out.write("\r\x1b[K" + line)
            self.out.flush()
        elif self.mode == "lines":
            now = time.monotonic()
            if line != self._last_line and now - self._last_print >= 1.0:
                self.out.write(line + "\n")
                self.out.flush()
                self._last_line, self._last_print = line, now

    def note(self, line: str) -> None:
        if self.mode == "live":
            self.out.write("\r\x1b[K" + line + "\n")
        elif self.mode == "lines":
            self.out.write(line + "\n")
        self.out.flush()

    def finish(self) -> None:
        if self.mode == "live":
            self.out.write("\r\x1b[K")
            self.out.flush()
