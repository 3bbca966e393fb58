"""The ``tmux-owner`` command (``python -m tmux_owner``) as a subprocess: one request line in, one response line out."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tmux_support import plan_request_json

from tmux_owner._jscompat import dumps

INVALID_LINE = '{"schema_version":1,"ok":false,"code":"scope_unavailable","diagnostic":"invalid_json_line"}\n'


def run_cli(data: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "tmux_owner", *args], input=data, capture_output=True, timeout=30, check=False
    )


def answer(result: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    """The single response line, after checking it is exactly one line and stderr is silent."""
    assert result.stderr == b""
    assert result.stdout.endswith(b"\n")
    assert result.stdout.count(b"\n") == 1
    return json.loads(result.stdout)


@pytest.fixture
def dead_socket() -> Iterator[list[str]]:
    """A tmux control argv on a private socket where no server runs (killed after, in case one started)."""
    directory = Path(tempfile.mkdtemp(prefix="tmo-"))
    control = ["tmux", "-S", str(directory / "sock")]
    try:
        yield control
    finally:
        subprocess.run([*control, "kill-server"], capture_output=True, check=False)
        shutil.rmtree(directory, ignore_errors=True)


def plan_request(state_dir: Path, control: list[str], session_name: str = "owned") -> dict[str, Any]:
    """A darwin plan request (no cgroups to read) for ``session_name`` on the server behind ``control``."""
    return plan_request_json(state_dir, [*control, "new-session", "-d", "-s", session_name], platform="darwin")


def test_the_cli_answers_a_plan_request(tmp_path: Path, dead_socket: list[str], tmux_binary: str) -> None:
    """A darwin plan request against an absent server answers a direct plan on one line with status 0."""
    result = run_cli((dumps(plan_request(tmp_path, dead_socket)) + "\n").encode())
    response = answer(result)
    assert (response["ok"], response["code"], response["execution"]["mode"]) == (True, "not_required", "direct")
    assert response["server_state"] == "absent"
    assert result.returncode == 0


def test_an_oversize_response_is_replaced_by_response_too_large(
    tmp_path: Path, dead_socket: list[str], tmux_binary: str
) -> None:
    """A plan request whose response would exceed 16 KiB answers the fixed response_too_large failure."""
    request = dumps(plan_request(tmp_path, dead_socket, "s" * 8_150))
    assert len(request.encode()) <= 16_384
    response = answer(run_cli(request.encode()))
    assert response == {
        "schema_version": 1,
        "ok": False,
        "code": "scope_unavailable",
        "diagnostic": "response_too_large",
    }


def test_the_cli_answers_a_bootstrap_request_and_fails_with_status_one(tmp_path: Path) -> None:
    """A bootstrap request whose attempt was never recorded answers attempt_capability_invalid with status 1."""
    request = {
        "schema_version": 1,
        "op": "bootstrap",
        "session_id": "session",
        "owner_generation": "generation",
        "state_dir": str(tmp_path),
        "socket_key": "socket",
        "expected_scope": "gjc-owner-token.scope",
        "tmux_argv": ["tmux", "new-session", "-s", "owned"],
        "attempt": {
            "token": "token",
            "session_name": "owned",
            "socket_key": "socket",
            "server_absent_before": True,
            "baseline": {"state": "absent"},
            "expires_at": "2026-01-01T00:00:07.000Z",
        },
    }
    result = run_cli(dumps(request).encode(), "--internal-tmux-owner-isolation")
    assert answer(result) == {
        "schema_version": 1,
        "ok": False,
        "code": "scope_bootstrap_failed",
        "diagnostic": "attempt_capability_invalid",
    }
    assert result.returncode == 1


def test_the_cli_publishes_a_generation_once_and_then_observes_its_terminal(tmp_path: Path) -> None:
    """Publishing a generation answers generation_published, publishing it again fails, and observing a cleanup exit
    answers its verdict.
    """
    publish = {
        "schema_version": 1,
        "op": "publish_generation",
        "session_id": "session",
        "owner_generation": "first",
        "state_dir": str(tmp_path),
        "baseline": {"state": "absent"},
    }
    first = run_cli(dumps(publish).encode())
    assert answer(first) == {"schema_version": 1, "ok": True, "code": "generation_published", "generation": "first"}
    assert first.returncode == 0
    assert answer(run_cli(dumps(publish).encode()))["diagnostic"] == "generation_publication_failed"
    observe = {
        "schema_version": 1,
        "op": "observe_terminal",
        "session_id": "session",
        "owner_generation": "first",
        "state_dir": str(tmp_path),
        "socket_key": "socket",
        "observer": "sidecar",
        "observed_at": "2026-01-01T00:00:00.000Z",
        "signal": "EXIT",
        "exit_code": 0,
        "exit_kind": "cleanup",
        "reason": "test",
    }
    verdict = run_cli((dumps(observe) + "\n").encode())
    response = answer(verdict)
    assert (response["classification"], response["result"]) == ("non_operator_cleanup", "cleanup")
    assert response["dedupe_key"] == "owner-loss:session:first"
    assert verdict.returncode == 0


@pytest.mark.parametrize(
    "data",
    [
        b"not json\n",
        b"",
        b"\n",
        b'{"schema_version":1}\n',
        b'{"schema_version":1,"op":"plan"}\n{"second":"line"}\n',
        b'{"a":1}\n\n',
        b"x" * 16_385 + b"\n",
        "é".encode() * 8_193,
        b"\xff\xfe\n",
    ],
)
def test_a_malformed_multi_line_or_oversize_request_gets_the_fixed_failure(data: bytes) -> None:
    """Anything but one valid request line of at most 16 KiB answers invalid_json_line, status 1, no traceback."""
    result = run_cli(data)
    assert result.stdout.decode() == INVALID_LINE
    assert result.stderr == b""
    assert result.returncode == 1


def test_unexpected_arguments_are_a_usage_error() -> None:
    """Only no argument or the bootstrap flag enters the protocol; anything else is status 2 with usage."""
    result = run_cli(b"{}\n", "--help")
    assert result.returncode == 2
    assert result.stdout == b""
    assert b"usage" in result.stderr
