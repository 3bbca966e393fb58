"""External-service gates: skip on a laptop, fail in CI (``CI=true``)."""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def require(condition: bool, reason: str) -> None:
    """Skip with a one-line ``reason`` when ``condition`` is false, but fail under CI."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"required in CI: {reason}", pytrace=False)
    pytest.skip(reason)
