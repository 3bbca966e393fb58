"""``benchmarks.wal_pages``: the pages each writing unit of a turn writes, by b-tree (nothing is timed).

The counts themselves are the benchmark's; what is asserted is the shape of each turn: five writing units,
a waiter's admission and start in one of them, and every page named.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.wal_pages import main, measure


def test_each_turn_shape_writes_five_units_and_a_waiter_is_started_by_its_admission(tmp_path: Path) -> None:
    shapes = measure(tmp_path)
    at_once, waiter = shapes["admitted with its enqueue"], shapes["a waiter's"]
    assert [name for name, _ in at_once] == ["enqueue + admission", "start", "dispatch intent", "active", "completion"]
    assert [name for name, _ in waiter] == ["enqueue", "admission + start", "dispatch intent", "active", "completion"]
    first = at_once[0][1]
    assert first["leases"], "the enqueue's unit admits: it writes the lease"
    assert first["turn_requests"]
    assert at_once[1][1]["start_history"], "the start is a unit of its own"
    assert "leases" not in waiter[0][1], "the waiter's enqueue admits nothing"
    admitted = waiter[1][1]
    assert admitted["leases"], "the waiter's admission writes its lease"
    assert admitted["start_history"], "the waiter's admission starts its lease"
    for _name, pages in at_once + waiter:
        assert sum(pages.values()) > 0
        assert not any(tree.startswith("page ") for tree in pages), f"every page belongs to a b-tree: {pages}"


def test_the_command_prints_both_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "admitted with its enqueue turn: 5 writing units" in out
    assert "a waiter's turn: 5 writing units" in out
    assert "admission + start:" in out
