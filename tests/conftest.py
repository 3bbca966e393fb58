"""Shared fixtures: external-service gates that skip on a laptop and fail in CI."""

from __future__ import annotations

import os
import shutil

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require(condition: bool, reason: str) -> None:
    """Skip with a one-line ``reason`` when ``condition`` is false, but fail under CI."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def tmux_binary() -> str:
    """Path of the tmux binary; skips (fails in CI) when tmux is not installed."""
    path = shutil.which("tmux")
    require(path is not None, "tmux is not installed")
    assert path is not None
    return path
