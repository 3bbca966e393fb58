"""What one demo run keeps about its workers and its victim, and what the verdict reads of a run."""

from __future__ import annotations

import queue
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any, Protocol, TextIO

import attrs

from ..plane import AdmissionPlane
from ..policy import Policy
from ._options import DemoOptions


@attrs.define
class Worker:
    agent: str
    process: subprocess.Popen[str]
    stderr_path: Path
    killed: bool = False


@attrs.define
class Victim:
    """The turn whose worker is killed mid-dispatch, and what the reaper did about it."""

    request_id: str
    agent: str
    index: int
    killed_at: float | None = None
    child_pid: int | None = None
    child_killed_at: float | None = None
    passes_retained_while_child_alive: int = 0
    phases_seen: set[str] = attrs.field(factory=set)
    released_at: float | None = None


class DemoRun(Protocol):
    """The run as the verdict sees it (implemented by ``_run.Demo``; the verdict never imports the runner)."""

    options: DemoOptions
    out: TextIO
    policy: Policy
    plane: AdmissionPlane
    content_key: bytes
    elapsed_s: float
    messages: queue.Queue[tuple[str, dict[str, Any]]]
    workers: list[Worker]
    results: dict[str, dict[str, Any]]
    violations: list[str]
    max_seats: int
    reaper_totals: Counter[str]
    victim: Victim | None
    capacity_request: str | None
    plan: dict[str, list[dict[str, Any]]]

    def drain_messages(self) -> None:
        """Take every message the workers have sent so far."""

    def reap(self, now: int) -> None:
        """Run one reaper pass and account for it."""
