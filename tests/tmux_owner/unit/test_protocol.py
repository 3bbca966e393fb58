"""The one-line JSON protocol in process: request parsing, dispatch and response serialisation."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from tmux_owner.__main__ import main
from tmux_owner._bootstrap import BootstrapRequest
from tmux_owner._generations import PublishGenerationRequest
from tmux_owner._jscompat import dumps
from tmux_owner._plan_records import PlanFailure, PlanRequest
from tmux_owner._protocol import handle_request, parse_request, read_one_line, run_protocol, serialize_response
from tmux_owner._verdict_records import ObserveTerminalRequest

PLAN: dict[str, Any] = {
    "schema_version": 1,
    "op": "plan",
    "platform": "linux",
    "session_id": "session",
    "owner_generation": "generation",
    "cwd": "/",
    "state_dir": "/state",
    "socket_key": "socket",
    "tmux_argv": ["tmux", "new-session", "-s", "owned"],
    "baseline": {"state": "absent"},
}
ATTEMPT = {
    "token": "token",
    "session_name": "owned",
    "socket_key": "socket",
    "server_absent_before": True,
    "baseline": {"state": "absent"},
    "expires_at": "2026-01-01T00:00:07.000Z",
}
BOOTSTRAP = {
    "schema_version": 1,
    "op": "bootstrap",
    "session_id": "session",
    "owner_generation": "generation",
    "state_dir": "/state",
    "socket_key": "socket",
    "expected_scope": "gjc-owner-token.scope",
    "tmux_argv": ["tmux", "new-session", "-s", "owned"],
    "attempt": ATTEMPT,
}
PUBLISH = {
    "schema_version": 1,
    "op": "publish_generation",
    "session_id": "session",
    "owner_generation": "first",
    "state_dir": "/state",
    "baseline": {"state": "absent"},
}
OBSERVE = {
    "schema_version": 1,
    "op": "observe_terminal",
    "session_id": "session",
    "owner_generation": "first",
    "state_dir": "/state",
    "socket_key": "socket",
    "observer": "sidecar",
    "observed_at": "2026-01-01T00:00:00.000Z",
    "signal": "EXIT",
    "exit_code": None,
    "exit_kind": "cleanup",
    "reason": "test",
}


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (PLAN, PlanRequest),
        (BOOTSTRAP, BootstrapRequest),
        (PUBLISH, PublishGenerationRequest),
        (OBSERVE, ObserveTerminalRequest),
    ],
)
def test_each_request_shape_dispatches_to_its_record_and_round_trips(value: dict[str, Any], kind: type) -> None:
    """Each of the four request shapes parses to its record, which serialises back to the same bytes."""
    request = parse_request(dumps(value))
    assert isinstance(request, kind)
    assert dumps(request.to_json()) == dumps(value)


@pytest.mark.parametrize("value", [PLAN, BOOTSTRAP, PUBLISH, OBSERVE])
def test_any_extra_key_is_refused(value: dict[str, Any]) -> None:
    """A valid request plus one extra key parses to None."""
    assert parse_request(dumps({**value, "extra": 1})) is None


@pytest.mark.parametrize("value", [PLAN, BOOTSTRAP, PUBLISH, OBSERVE])
def test_any_missing_key_is_refused(value: dict[str, Any]) -> None:
    """A request missing any one of its keys parses to None."""
    for key in value:
        assert parse_request(dumps({k: v for k, v in value.items() if k != key})) is None


@pytest.mark.parametrize(
    "line",
    ["not-json", "[]", "1", "null", '"plan"', dumps({**PLAN, "op": "unknown"}), dumps({"op": "plan"}), "NaN"],
)
def test_invalid_json_non_objects_and_unknown_shapes_parse_to_none(line: str) -> None:
    """Invalid JSON, a non-object or an unknown request shape parses to None."""
    assert parse_request(line) is None


def test_an_empty_string_after_the_first_argv_element_is_allowed() -> None:
    """An empty string after the first argv element (`["tmux", ""]`) still makes a parseable plan request."""
    request = parse_request(dumps({**PLAN, "tmux_argv": ["tmux", ""]}))
    assert isinstance(request, PlanRequest)


def padded_plan(total_bytes: int) -> str:
    """A valid plan request line of exactly ``total_bytes`` UTF-8 bytes (padded in `cwd` with 2-byte characters)."""
    base = len(dumps({**PLAN, "cwd": ""}).encode())
    room = total_bytes - base
    line = dumps({**PLAN, "cwd": "é" * (room // 2) + "x" * (room % 2)})
    assert len(line.encode()) == total_bytes
    return line


def test_a_request_of_exactly_16_kib_is_accepted_and_one_byte_more_is_not() -> None:
    """A request line of 16384 UTF-8 bytes parses and one of 16385 bytes (bytes, not characters) does not."""
    assert isinstance(parse_request(padded_plan(16_384)), PlanRequest)
    assert parse_request(padded_plan(16_385)) is None
    assert parse_request("x" * 16_385) is None


def test_a_newline_anywhere_is_refused_but_other_json_whitespace_is_allowed() -> None:
    """A `\\n` anywhere makes the line None, while `\\r`, tabs and spaces between tokens are accepted."""
    assert parse_request(dumps(PLAN) + "\nextra") is None
    assert parse_request(dumps(PLAN).replace(",", ",\n", 1)) is None
    assert isinstance(parse_request(dumps(PLAN).replace(",", ",\r\t ", 1)), PlanRequest)


def test_a_response_is_compact_json_under_16_kib_or_the_fixed_too_large_failure() -> None:
    """A response is compact JSON on one line, and one of 16384 bytes or more is replaced by the response_too_large
    failure.
    """
    small = PlanFailure("scope_unavailable", "x")
    assert serialize_response(small) == '{"schema_version":1,"ok":false,"code":"scope_unavailable","diagnostic":"x"}'
    overhead = len(dumps({"v": ""}))
    assert serialize_response({"v": "x" * (16_383 - overhead)}).endswith('x"}')
    assert json.loads(serialize_response({"v": "x" * (16_384 - overhead)})) == {
        "schema_version": 1,
        "ok": False,
        "code": "scope_unavailable",
        "diagnostic": "response_too_large",
    }
    assert "\n" not in serialize_response({"v": "a\nb"})


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (b"abc", "abc"),
        (b"abc\n", "abc"),
        (b"abc\nx", None),
        (b"abc\n\n", None),
        (b"x" * 16_384 + b"\n", "x" * 16_384),
        (b"x" * 16_385, None),
        (b"\xff\n", "\ufffd"),
    ],
)
def test_stdin_holds_one_bounded_line_and_nothing_after_it(data: bytes, line: str | None) -> None:
    """Stdin holds at most 16384 bytes before an optional final newline and nothing after it, and invalid UTF-8 is
    replaced.
    """
    assert read_one_line(data) == line


def test_publication_and_observation_failures_have_the_seed_cli_answers(tmp_path: Path) -> None:
    """A replayed publication and an observation of a foreign generation answer the fixed generation_publication_failed
    and terminal_observation_failed.
    """
    publish = PublishGenerationRequest.from_json({**PUBLISH, "state_dir": str(tmp_path)})
    assert handle_request(publish).to_json()["code"] == "generation_published"
    assert handle_request(publish)["diagnostic"] == "generation_publication_failed"
    observe = ObserveTerminalRequest.from_json({**OBSERVE, "state_dir": str(tmp_path), "owner_generation": "foreign"})
    assert handle_request(observe)["diagnostic"] == "terminal_observation_failed"


def test_a_bootstrap_that_raises_still_answers_one_failure_line(tmp_path: Path) -> None:
    """Beyond the seed, a bootstrap that raises on a corrupt generation.json still answers one
    bootstrap_execution_failed line with status 1.
    """
    root = tmp_path / "session" / "owner-lifecycle"
    root.mkdir(parents=True)
    (root / "generation.json").write_text("{")
    output, status = run_protocol(dumps({**BOOTSTRAP, "state_dir": str(tmp_path)}).encode())
    assert json.loads(output)["diagnostic"] == "bootstrap_execution_failed"
    assert status == 1


def nested(depth: int, kind: str) -> str:
    """A JSON text ``depth`` levels deep: ``[[[...]]]``, ``{"a":{"a":...}}``, or a valid plan whose cwd is that deep."""
    if kind == "array":
        return "[" * depth + "]" * depth
    if kind == "object":
        return '{"a":' * depth + "{}" + "}" * depth
    return dumps({**PLAN, "cwd": "__DEEP__"}).replace('"__DEEP__"', "[" * depth + "]" * depth)


@pytest.mark.parametrize(
    ("kind", "depth"),
    [(kind, depth) for kind in ("array", "plan") for depth in (900, 990, 1_000, 5_000)]
    + [("object", depth) for depth in (900, 1_000, 2_700)],
)
def test_deeply_nested_json_is_an_invalid_line_not_an_internal_error(kind: str, depth: int) -> None:
    """JSON nested thousands of levels deep within 16 KiB parses to None and answers invalid_json_line, never raising
    RecursionError.
    """
    line = nested(depth, kind)
    assert len(line.encode()) <= 16_384
    assert parse_request(line) is None
    output, status = run_protocol(line.encode())
    assert json.loads(output) == {
        "schema_version": 1,
        "ok": False,
        "code": "scope_unavailable",
        "diagnostic": "invalid_json_line",
    }
    assert status == 1


def test_the_cli_entry_answers_deep_json_with_invalid_json_line(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's entry point answers a 5 000-deep array with invalid_json_line, not internal_error."""
    stdout = io.BytesIO()
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(nested(5_000, "array").encode())))
    monkeypatch.setattr("sys.stdout", io.TextIOWrapper(stdout))
    assert main([]) == 1
    assert json.loads(stdout.getvalue())["diagnostic"] == "invalid_json_line"
