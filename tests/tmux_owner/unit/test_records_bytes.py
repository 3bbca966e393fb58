"""Serialised records are byte-identical to what the seed's JSON.stringify writes, in memory and on disk."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from gates import require

from tmux_owner._generations import (
    GenerationRecord,
    OwnerGenerationBaseline,
    PublishGenerationRequest,
    PublishGenerationResult,
    replace_owner_generation,
)
from tmux_owner._intents import OwnerIntent, create_owner_intent
from tmux_owner._jscompat import dumps, dumps_line
from tmux_owner._verdict_records import ObserveTerminalRequest, OwnerIncident, OwnerVerdict
from tmux_owner._verdicts import observe_owner_terminal

AWKWARD = 'séance-✓ "q" \\ \x01 \u2028 😀'
RECORD = GenerationRecord(generation="g1", session_id="s1", published_at="2026-01-01T00:00:00.000Z")
INTENT = OwnerIntent(
    intent_id="i1",
    generation="g1",
    session_id="s1",
    server_key="k1",
    dispatch_id="d1",
    created_at="2026-01-01T00:00:00.000Z",
    expires_at="2026-01-01T00:01:00.000Z",
)
EXPECTED = OwnerVerdict(
    generation="g1",
    session_id="s1",
    server_key="k1",
    observed_at="2026-01-01T00:00:01.000Z",
    signal="SIGTERM",
    exit_code=None,
    result="owner_term_then_session_cleanup",
    observer="sidecar",
    classification="expected_operator_shutdown",
    reason="owner_exit",
    intent_id="i1",
    dedupe_key="owner-loss:s1:g1",
)
UNEXPECTED = OwnerVerdict(
    generation="g1",
    session_id="s1",
    server_key="k1",
    observed_at="2026-01-01T00:00:01Z",
    signal="EXIT",
    exit_code=-3,
    result="owner_lost",
    observer="raw_monitor",
    classification="unexpected_owner_loss",
    reason="test",
    dedupe_key="owner-loss:s1:g1",
)
OBSERVATION = ObserveTerminalRequest(
    session_id="s1",
    owner_generation="g1",
    state_dir="/state",
    socket_key="k1",
    observer="sidecar",
    observed_at="2026-01-01T00:00:01.000Z",
    signal="SIGTERM",
    exit_code=0,
    exit_kind="exit",
    reason="owner_exit",
    operator_dispatch_id="d1",
)

# Each expectation is written out as the seed's object literal (and its key order) serialises.
SEED_JSON = [
    (RECORD, '{"schema_version":1,"generation":"g1","session_id":"s1","published_at":"2026-01-01T00:00:00.000Z"}'),
    (OwnerGenerationBaseline.absent(), '{"state":"absent"}'),
    (
        OwnerGenerationBaseline.current(RECORD),
        '{"state":"current","schema_version":1,"generation":"g1","session_id":"s1",'
        '"published_at":"2026-01-01T00:00:00.000Z"}',
    ),
    (
        PublishGenerationRequest(
            session_id="s1", owner_generation="g1", state_dir="/state", baseline=OwnerGenerationBaseline.absent()
        ),
        '{"schema_version":1,"op":"publish_generation","session_id":"s1","owner_generation":"g1",'
        '"state_dir":"/state","baseline":{"state":"absent"}}',
    ),
    (PublishGenerationResult("g1"), '{"schema_version":1,"ok":true,"code":"generation_published","generation":"g1"}'),
    (
        INTENT,
        '{"schema_version":1,"intent_id":"i1","state":"pending","generation":"g1","session_id":"s1",'
        '"server_key":"k1","expected_terminal":{"signal":"SIGTERM","result":"owner_term_then_session_cleanup"},'
        '"dispatch_id":"d1","created_at":"2026-01-01T00:00:00.000Z","expires_at":"2026-01-01T00:01:00.000Z"}',
    ),
    (
        EXPECTED,
        '{"schema_version":1,"generation":"g1","session_id":"s1","server_key":"k1",'
        '"observed_at":"2026-01-01T00:00:01.000Z","signal":"SIGTERM","exit_code":null,'
        '"result":"owner_term_then_session_cleanup","observer":"sidecar",'
        '"classification":"expected_operator_shutdown","reason":"owner_exit","intent_id":"i1",'
        '"dedupe_key":"owner-loss:s1:g1"}',
    ),
    (
        UNEXPECTED,
        '{"schema_version":1,"generation":"g1","session_id":"s1","server_key":"k1",'
        '"observed_at":"2026-01-01T00:00:01Z","signal":"EXIT","exit_code":-3,"result":"owner_lost",'
        '"observer":"raw_monitor","classification":"unexpected_owner_loss","reason":"test",'
        '"dedupe_key":"owner-loss:s1:g1"}',
    ),
    (
        OwnerIncident.for_verdict(UNEXPECTED),
        '{"schema_version":1,"generation":"g1","session_id":"s1","dedupe_key":"owner-loss:s1:g1",'
        '"created_at":"2026-01-01T00:00:01Z","classification":"unexpected_owner_loss"}',
    ),
    (
        OBSERVATION,
        '{"schema_version":1,"op":"observe_terminal","session_id":"s1","owner_generation":"g1",'
        '"state_dir":"/state","socket_key":"k1","observer":"sidecar","observed_at":"2026-01-01T00:00:01.000Z",'
        '"signal":"SIGTERM","exit_code":0,"exit_kind":"exit","reason":"owner_exit","operator_dispatch_id":"d1"}',
    ),
]


@pytest.mark.parametrize(("record", "seed_json"), SEED_JSON, ids=lambda value: type(value).__name__)
def test_each_record_serialises_to_the_seeds_json(record: Any, seed_json: str) -> None:
    """Every record's to_json, dumped compactly, is exactly the seed's JSON.stringify text."""
    assert dumps(record.to_json()) == seed_json
    assert dumps_line(record.to_json()) == (seed_json + "\n").encode()


@pytest.mark.parametrize(("record", "seed_json"), SEED_JSON, ids=lambda value: type(value).__name__)
def test_each_record_round_trips_through_its_seed_json(record: Any, seed_json: str) -> None:
    """Parsing the seed's JSON gives back an equal record."""
    assert type(record).from_json(json.loads(seed_json)) == record


def test_the_verdict_alias_appends_owner_generation_last() -> None:
    """verdict.json holds the verdict with owner_generation appended as its last key."""
    assert dumps(EXPECTED.alias_json()) == dumps(EXPECTED.to_json())[:-1] + ',"owner_generation":"g1"}'


def test_an_integral_float_is_written_as_javascript_would() -> None:
    """An integral float read from JSON (exit_code 12.0, schema_version 1.0) is written back as JavaScript would, as 12
    and 1.
    """
    value = {**UNEXPECTED.to_json(), "exit_code": 12.0, "schema_version": 1.0}
    verdict = OwnerVerdict.from_json(value)
    assert '"exit_code":12,' in dumps(verdict.to_json())
    assert dumps(verdict.to_json()).startswith('{"schema_version":1,')


def test_files_written_by_the_module_hold_the_records_bytes(tmp_path: Path) -> None:
    """The generation, marker, intent, verdict, incident and alias files the package writes are each its record as
    compact JSON plus one newline.
    """
    replace_owner_generation(tmp_path, "s1", "g1")
    root = tmp_path / "s1" / "owner-lifecycle"
    pointer = GenerationRecord.from_json(json.loads((root / "generation.json").read_text()))
    assert (root / "generation.json").read_bytes() == dumps_line(pointer.to_json())
    assert (root / "generation-g1.published.json").read_bytes() == dumps_line(pointer.to_json())
    intent = create_owner_intent(
        tmp_path,
        generation="g1",
        session_id="s1",
        server_key="k1",
        dispatch_id="d1",
        created_at="2026-01-01T00:00:00.000Z",
        expires_at="2026-01-01T00:01:00.000Z",
    )
    assert (root / "intent-g1.json").read_bytes() == dumps_line(intent.to_json())
    loss = observe_owner_terminal(observation_with(OBSERVATION, state_dir=str(tmp_path), signal="EXIT"))
    assert (root / "verdict-g1.json").read_bytes() == dumps_line(loss.to_json())
    assert (root / "verdict.json").read_bytes() == dumps_line(loss.alias_json())
    assert (root / "incident-g1.json").read_bytes() == dumps_line(OwnerIncident.for_verdict(loss).to_json())


def observation_with(record: ObserveTerminalRequest, **changes: Any) -> ObserveTerminalRequest:
    return ObserveTerminalRequest.from_json(record.to_json() | changes)


def test_non_ascii_and_escapes_match_node_json_stringify() -> None:
    """For records holding awkward strings, node's JSON.stringify(JSON.parse(line)) gives back exactly the bytes we
    wrote.
    """
    node = shutil.which("node")
    require(node is not None, "node is not installed")
    assert node is not None
    records = [
        GenerationRecord(generation=AWKWARD, session_id="s1", published_at="2026-01-01T00:00:00.000Z"),
        OwnerVerdict.from_json(
            {**UNEXPECTED.to_json(), "server_key": AWKWARD, "generation": "é", "dedupe_key": "owner-loss:s1:é"}
        ),
        OwnerIntent.from_json({**INTENT.to_json(), "dispatch_id": AWKWARD}),
        ObserveTerminalRequest.from_json({**OBSERVATION.to_json(), "socket_key": AWKWARD, "exit_code": None}),
    ]
    ours = b"".join(dumps_line(record.to_json()) for record in records)
    script = (
        "const text = require('fs').readFileSync(0, 'utf8');"
        "const lines = text.split('\\n').filter(Boolean);"
        "process.stdout.write(lines.map(l => JSON.stringify(JSON.parse(l)) + '\\n').join(''));"
    )
    result = subprocess.run([node, "-e", script], input=ours, capture_output=True, check=True, timeout=60)
    assert result.stdout == ours
