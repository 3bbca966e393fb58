"""The two errors of this package: a refused operation, named by its bare code, and a malformed record.

Every refusal is a :class:`TmuxOwnerError` whose ``code`` (and ``str()``) is the bare code
the original TypeScript implementation (the seed) throws, e.g. ``generation_replay``,
``immutable_record_conflict``, ``immutable_record_corrupt``, ``verdict_lock_contended``;
:data:`CODES` lists them all.
"""

from __future__ import annotations

INVALID_RECORD = "invalid_record"

# Every code a TmuxOwnerError of this package carries. The seed's codes, then ours
# (beyond the seed): a refused path component (``invalid_session_id``, ``invalid_generation``,
# ``invalid_token``), a state directory the file system cannot name (``invalid_state_dir``),
# a symlinked or non-directory session or lifecycle directory (``untrusted_root``, the
# code the seed's root opener uses for a symlinked component), and a lifecycle file the
# package would replace, rename onto or lock that is a symlink or not a regular file
# (``untrusted_lifecycle_file``).
CODES = frozenset(
    {
        INVALID_RECORD,
        "baseline_generation_changed",
        "baseline_generation_corrupt",
        "generation_baseline_changed",
        "generation_lock_contended",
        "generation_mismatch",
        "generation_replay",
        "immutable_record_conflict",
        "immutable_record_corrupt",
        "invalid_path",
        "managed_owner_replacement_evidence_ambiguous",
        "managed_owner_replacement_evidence_changed",
        "managed_owner_replacement_evidence_unavailable",
        "managed_owner_replacement_evidence_untrusted",
        "owner_generation_mismatch",
        "owner_intent_consumption_failed",
        "owner_intent_invalid",
        "owner_intent_replay",
        "owner_pid_identity_mismatch",
        "owner_term_verdict_timeout",
        "terminal_observation_invalid",
        "unsupported_platform",
        "untrusted_root",
        "verdict_lock_contended",
        "verdict_lock_lost",
        # beyond the seed
        "invalid_generation",
        "invalid_session_id",
        "invalid_state_dir",
        "invalid_token",
        "untrusted_lifecycle_file",
    }
)


class TmuxOwnerError(Exception):
    """A lifecycle operation refused; ``code`` (and ``str()``) is the seed's bare code."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code

    def __str__(self) -> str:
        return self.code


class InvalidRecordError(TmuxOwnerError, ValueError):
    """A value does not have the exact shape the seed accepts for a record; ``record`` names the record or field."""

    def __init__(self, record: str) -> None:
        super().__init__(INVALID_RECORD)
        self.record = record

    def __str__(self) -> str:
        return f"{INVALID_RECORD}: {self.record}"
