"""``admission-plane demo`` in a shortened form: real workers, both injected faults, invariants checked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SHORT = [
    "--agents",
    "3",
    "--turns",
    "3",
    "--cooldown-ms",
    "1500",
    "--provider-min-ms",
    "50",
    "--provider-max-ms",
    "150",
]


def run_demo(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run the demo as a subprocess from a directory outside the source tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ADMISSION_PLANE_")}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    return subprocess.run(
        [sys.executable, "-m", "admission_plane", "demo", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_short_demo_survives_a_capacity_failure_and_a_killed_worker(tmp_path: Path) -> None:
    """The capacity failure cools one model, the killed worker's seat is held then released, nothing is replayed."""
    result = run_demo(tmp_path, *SHORT, "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["violations"] == []
    assert summary["outcomes"] == {"completed": 7, "failed": 1, "recovery_required": 1}
    assert summary["max_seats_observed"] <= summary["policy"]["max_active_turns"]
    capacity = summary["capacity_fault"]
    assert capacity["observed"]
    assert capacity["same_model_admitted_during_cooldown"] == 0
    killed = summary["kill_fault"]
    assert killed["killed"]
    assert killed["passes_retained_while_child_alive"] >= 1
    assert killed["final_state"] == "recovery_required"
    assert killed["admissions"] == 1
    assert "recovery_required" in killed["phases_seen"]
    assert summary["events_by_kind"]["request_recovery_seat_released"] == 1
    assert "please answer" not in result.stdout + result.stderr


@pytest.mark.slow
def test_demo_prints_progress_and_a_summary_table_without_faults(tmp_path: Path) -> None:
    """With faults switched off every turn completes, and the text output ends with the summary table."""
    result = run_demo(
        tmp_path,
        "--agents",
        "2",
        "--turns",
        "2",
        "--provider-min-ms",
        "10",
        "--provider-max-ms",
        "30",
        "--no-capacity-fault",
        "--no-kill-fault",
        "--progress",
        "lines",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "queued" in result.stdout
    assert "turns completed" in result.stdout
    assert "max seats observed" in result.stdout
    assert "wait agent-0" in result.stdout
    assert "events request_admitted" in result.stdout
    assert result.stdout.rstrip().endswith("all invariants held")
