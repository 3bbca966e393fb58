"""The Linux process start-time parser (field 22 of /proc/<pid>/stat) and the live /proc reader."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tmux_owner._procstat import (
    owner_process_start_time,
    parse_linux_proc_start_time,
    probe_linux_proc_pid,
    read_linux_proc_start_time,
)


def stat_line(comm: str = "owner", state: str = "S", start: str = "1234", pid: str = "1", tty: str = "0") -> str:
    """A /proc/<pid>/stat record whose field 22 is ``start``."""
    # fields 3..21 after ")" : state, ppid, pgrp, session, tty, then 14 more up to field 21
    after = [state, "0", "1", "1", tty, *["0"] * 14, start, "99", "100"]
    return f"{pid} ({comm}) " + " ".join(after)


@pytest.mark.parametrize(
    ("stat", "expected"),
    [
        (stat_line(), "1234"),
        (stat_line(comm="foo ) bar baz"), "1234"),  # a ")" inside the command name
        (stat_line(comm="tmux: server"), "1234"),
        (stat_line(comm="a (b) c"), "1234"),
        (stat_line(state="K"), "1234"),  # any one-letter state
        (stat_line(state="W"), "1234"),
        (stat_line(state="x"), "1234"),
        (stat_line(state="Z"), "1234"),
        (stat_line() + "\n", "1234"),
        (stat_line(tty="-1"), "1234"),
        (stat_line(start="18446744073709551615"), "18446744073709551615"),
        ("6290 (tmux: server) S 1 6290 6290 0 -1 " + " ".join(["0"] * 13) + " 34864 1 2", "34864"),
    ],
)
def test_start_time_is_field_22_counted_after_the_last_parenthesis(stat: str, expected: str) -> None:
    """The start time is field 22 counted after the last `)`, so spaces or parentheses in the command are harmless."""
    assert parse_linux_proc_start_time(stat) == expected


@pytest.mark.parametrize(
    "stat",
    [
        None,
        "",
        "x" + stat_line(),  # a prefix before the pid
        stat_line().replace("(owner) ", "(owner)"),  # no space after ")"
        stat_line(state="1"),
        stat_line(state="SS"),
        stat_line() + "\nsecond line",
        stat_line() + "\0",
        stat_line() + "\r\n",
        stat_line(pid="0"),
        stat_line(pid="01"),
        stat_line(pid="-1"),
        stat_line(tty="x"),
        stat_line(start="12a"),
        stat_line(start="１２"),
        "1 owner) S 0",
        "1 (owner) S 0 1 1 0",
        stat_line() + "\n\n",
    ],
)
def test_malformed_stat_records_yield_none(stat: str | None) -> None:
    """A malformed record (prefix, separators, state, tty, extra lines, NUL, CR, non-ASCII digits) yields None."""
    assert parse_linux_proc_start_time(stat) is None


def test_owner_process_start_time_is_not_applicable_off_linux() -> None:
    """Off Linux the owner's start time is not_applicable, and on Linux it is field 22 or None."""
    assert owner_process_start_time("darwin", None) == "not_applicable"
    assert owner_process_start_time("win32", "anything") == "not_applicable"
    assert owner_process_start_time("linux", stat_line()) == "1234"
    assert owner_process_start_time("linux", "malformed") is None
    assert owner_process_start_time("linux", None) is None


def test_the_live_reader_proves_this_process_and_matches_its_stat_file() -> None:
    """This process reads as live, with the start time of its own /proc/<pid>/stat."""
    probe = probe_linux_proc_pid(os.getpid())
    expected = parse_linux_proc_start_time(Path(f"/proc/{os.getpid()}/stat").read_text())
    assert probe.kind == "live"
    assert probe.start_time == expected
    assert read_linux_proc_start_time(os.getpid()) == expected


@pytest.mark.parametrize("pid", [0, -1, True, 1.5, "12", None, float("nan")])
def test_the_live_reader_refuses_an_invalid_pid(pid: object) -> None:
    """A pid that is not a positive safe integer, booleans included, is unverifiable with reason invalid_pid."""
    probe = probe_linux_proc_pid(pid)
    assert (probe.kind, probe.reason) == ("unverifiable", "invalid_pid")


def test_the_live_reader_reports_absence_platform_and_malformed_records(tmp_path: Path) -> None:
    """A missing /proc/<pid> is absent, a non-Linux platform unsupported, an unparsable stat malformed and an unreadable
    one a read error.
    """
    assert probe_linux_proc_pid(7, proc_root=tmp_path).kind == "absent"
    assert probe_linux_proc_pid(7, platform="darwin").reason == "unsupported_platform"
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "stat").write_text("garbage")
    assert probe_linux_proc_pid(7, proc_root=tmp_path).reason == "malformed_stat"
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "stat").mkdir()
    assert probe_linux_proc_pid(8, proc_root=tmp_path).reason == "read_error"
