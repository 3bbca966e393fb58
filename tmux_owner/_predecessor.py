"""Managed-owner predecessor: the one SIGABRT-ended child a replacement owner may resume from.

The evidence lives in the previous generation's lifecycle directory as a pair of
files written by the managed launcher: ``child-<tok>.binding.json`` (what was
started) and ``sigabrt-<tok>.receipt.json`` (that it died of SIGABRT). Both are read
twice through a no-follow root descriptor and must agree in every bound field.
"""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

import attrs

from ._errors import InvalidRecordError, TmuxOwnerError
from ._files import lifecycle_paths, open_lifecycle
from ._generations import OwnerGenerationBaseline
from ._jscompat import dumps, is_safe_integer, loads
from ._recovery_fs import RecoveryFsRoot
from ._validators import non_empty

EVIDENCE_READ_LIMIT = 64 * 1024
_BINDING = re.compile(r"child-([^/]+)\.binding\.json")
_RECEIPT = re.compile(r"sigabrt-([^/]+)\.receipt\.json")
_TOKEN = re.compile(r"[A-Za-z0-9._-]+")

UNAVAILABLE = "managed_owner_replacement_evidence_unavailable"
CHANGED = "managed_owner_replacement_evidence_changed"
UNTRUSTED = "managed_owner_replacement_evidence_untrusted"
AMBIGUOUS = "managed_owner_replacement_evidence_ambiguous"


@attrs.frozen(kw_only=True)
class ManagedOwnerPredecessorEvidence:
    """The proven predecessor of a managed owner."""

    generation: str
    session_id: str
    run_id: str
    incarnation: str
    predecessor_token: str


def _number_equal(left: Any, right: Any) -> bool:
    """JavaScript ``===`` between JSON values that must be numbers (``true`` is not ``1``)."""
    return is_safe_integer(left) and is_safe_integer(right) and left == right


def _string(value: Any) -> bool:
    return isinstance(value, str)


def _command_digest(command: Any) -> str:
    if isinstance(command, list) and command and all(non_empty(item) for item in command):
        return hashlib.sha256(dumps(command).encode("utf-8")).hexdigest()
    return ""


def _exact_evidence_json(root: RecoveryFsRoot, name: str) -> Any:
    first = root.read(name, EVIDENCE_READ_LIMIT)
    if not first.ok or first.data is None:
        raise TmuxOwnerError(UNAVAILABLE)
    second = root.read(name, EVIDENCE_READ_LIMIT)
    if not second.ok or second.data != first.data or second.identity != first.identity:
        raise TmuxOwnerError(CHANGED)
    content = first.data.decode("utf-8", errors="replace")
    if not content.endswith("\n") or content.index("\n") != len(content) - 1:
        raise TmuxOwnerError(UNTRUSTED)
    return loads(content)


def _valid_pair(binding: Any, receipt: Any, generation: str, session_id: str, token: str) -> bool:
    if not isinstance(binding, dict) or not isinstance(receipt, dict):
        return False
    command_sha256 = _command_digest(binding.get("command"))
    supervisor_pid = binding.get("supervisor_pid")
    child_pid = receipt.get("child_pid")
    exit_code = receipt.get("exit_code", ...)
    return (
        _number_equal(binding.get("schema_version"), 2)
        and binding.get("generation") == generation
        and binding.get("session_id") == session_id
        and non_empty(binding.get("run_id"))
        and non_empty(binding.get("endpoint_incarnation"))
        and binding.get("child_token") == token
        and _string(binding.get("command_sha256"))
        and binding["command_sha256"] == command_sha256
        and is_safe_integer(supervisor_pid)
        and supervisor_pid > 0
        and _string(binding.get("supervisor_start_time"))
        and _string(binding.get("created_at"))
        and _number_equal(receipt.get("schema_version"), 2)
        and receipt.get("generation") == generation
        and receipt.get("session_id") == session_id
        and _string(receipt.get("run_id"))
        and receipt["run_id"] == binding["run_id"]
        and _string(receipt.get("endpoint_incarnation"))
        and receipt["endpoint_incarnation"] == binding["endpoint_incarnation"]
        and receipt.get("child_token") == token
        and _string(receipt.get("command_sha256"))
        and receipt["command_sha256"] == command_sha256
        and _number_equal(receipt.get("supervisor_pid"), supervisor_pid)
        and _string(receipt.get("supervisor_start_time"))
        and receipt["supervisor_start_time"] == binding["supervisor_start_time"]
        and is_safe_integer(child_pid)
        and child_pid > 0
        and _string(receipt.get("child_start_time"))
        and _string(receipt.get("received_at"))
        and (exit_code is None or is_safe_integer(exit_code))
        and receipt.get("signal") == "SIGABRT"
        and _number_equal(receipt.get("signal_number"), 6)
    )


def resolve_managed_owner_predecessor(
    state_dir: str | os.PathLike[str], session_id: str, baseline: OwnerGenerationBaseline
) -> ManagedOwnerPredecessorEvidence | None:
    """The single SIGABRT predecessor recorded in the baseline generation's directory, or ``None``.

    ``None`` when the baseline is absent or there is no ``child-*``/``sigabrt-*`` entry
    at all. Raises ``managed_owner_replacement_evidence_{unavailable,untrusted,
    ambiguous,changed}``; a root path with a symlinked component raises ``untrusted_root``
    (below the state directory, before anything is listed) and malformed JSON raises
    ``ValueError``, as in the seed. A ``baseline`` that is not an
    :class:`OwnerGenerationBaseline` raises ``InvalidRecordError``.
    """
    given: object = baseline  # callers outside the type checker may pass anything
    if not isinstance(given, OwnerGenerationBaseline):
        raise InvalidRecordError(OwnerGenerationBaseline.__name__)
    if baseline.record is None:
        return None
    generation = baseline.record.generation
    paths = lifecycle_paths(state_dir, session_id, generation)
    root = paths.root
    try:
        directory = open_lifecycle(paths)
        if directory is None:
            raise TmuxOwnerError(UNAVAILABLE)
        with directory:
            entries = directory.listdir()
    except OSError as error:
        raise TmuxOwnerError(UNAVAILABLE) from error
    bindings: set[str] = set()
    receipts: set[str] = set()
    for entry in entries:
        binding = _BINDING.fullmatch(entry)
        receipt = _RECEIPT.fullmatch(entry)
        if (entry.startswith("child-") and binding is None) or (entry.startswith("sigabrt-") and receipt is None):
            raise TmuxOwnerError(UNTRUSTED)
        if binding is not None:
            bindings.add(binding[1])
        if receipt is not None:
            receipts.add(receipt[1])
    if not bindings and not receipts:
        return None
    tokens = bindings & receipts
    if len(tokens) != 1 or len(receipts) != 1:
        raise TmuxOwnerError(AMBIGUOUS)
    (token,) = tokens
    if _TOKEN.fullmatch(token) is None:
        raise TmuxOwnerError(UNTRUSTED)
    with RecoveryFsRoot.open(root) as authority:
        binding_json = _exact_evidence_json(authority, f"child-{token}.binding.json")
        receipt_json = _exact_evidence_json(authority, f"sigabrt-{token}.receipt.json")
    if not _valid_pair(binding_json, receipt_json, generation, session_id, token):
        raise TmuxOwnerError(UNTRUSTED)
    return ManagedOwnerPredecessorEvidence(
        generation=generation,
        session_id=session_id,
        run_id=binding_json["run_id"],
        incarnation=binding_json["endpoint_incarnation"],
        predecessor_token=token,
    )
