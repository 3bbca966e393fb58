"""Fixtures of the tests that run real worker processes."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from workers import WorkerProcess


@pytest.fixture
def spawn() -> Iterator[Callable[..., WorkerProcess]]:
    """Start worker processes; every one still running is killed when the test ends."""
    started: list[WorkerProcess] = []

    def start(*args: str) -> WorkerProcess:
        worker = WorkerProcess(*args)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()
