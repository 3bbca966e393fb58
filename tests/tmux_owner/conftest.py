"""Fixtures shared by the tmux_owner tests (plain helpers live in ``tmux_support.py``).

``unit/`` holds the tests that need at most a temporary directory and ordinary child
processes; ``real_tmux/`` the tests that start a real tmux server or run the
``tmux-owner`` command as a subprocess.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tmux_support import GENERATION, SESSION

from tmux_owner._generations import replace_owner_generation


@pytest.fixture
def state_dir(tmp_path: Path) -> Path:
    """A state directory in which the usual session's current owner generation is published."""
    replace_owner_generation(tmp_path, SESSION, GENERATION)
    return tmp_path
