"""``admission-plane policy show | set | history`` and ``pause`` / ``resume``: steering a live plane.

A policy set here is a new live revision: every connector applies it at its next
transaction, without a restart. ``policy set`` reads a JSON object (a file, or ``-`` for
standard input) with the fields to change; fields it does not name keep their current
values. Pause and resume take a scope: nothing (everything), ``--lane``, or
``--provider`` with ``--model``.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from typing import Any

from ..errors import InvalidInputError
from ..policy import Policy
from ..values import Pause, PolicyRevision
from ._common import EXIT_OK, CommandFailed, emit, iso, now_ms, open_plane, span

#: The largest policy document ``policy set`` reads (a policy is a few kilobytes at most).
MAX_POLICY_BYTES = 1 << 20


def cmd_policy_show(args: argparse.Namespace) -> int:
    """Print the policy in force and its revision."""
    plane = open_plane(args)
    try:
        current = plane.current_policy()
    finally:
        plane.close()
    emit(args, _revision_json(current), _revision_text(current))
    return EXIT_OK


def cmd_policy_set(args: argparse.Namespace) -> int:
    """Put a new live policy revision in force (fields not given keep their current values)."""
    changes = _read_document(args.file)
    plane = open_plane(args, keys=True)
    try:
        merged = {**plane.current_policy().policy.to_json(), **changes}
        revision = plane.set_policy(Policy.from_json(merged), now=now_ms())
    finally:
        plane.close()
    emit(
        args,
        _revision_json(revision),
        f"policy revision {revision.revision} is in force\n" + _policy_text(revision.policy),
    )
    return EXIT_OK


def cmd_policy_history(args: argparse.Namespace) -> int:
    """Print the newest revisions, newest first."""
    plane = open_plane(args)
    try:
        revisions = plane.policy_history(args.limit)
    finally:
        plane.close()
    text = "\n".join(_revision_line(revision) for revision in revisions) or "no policy revision has been set"
    emit(args, [_revision_json(revision) for revision in revisions], text)
    return EXIT_OK


def cmd_pause(args: argparse.Namespace) -> int:
    """Pause admission in a scope."""
    return _steer(args, pause=True)


def cmd_resume(args: argparse.Namespace) -> int:
    """Resume admission in a scope."""
    return _steer(args, pause=False)


def add_scope_arguments(parser: argparse.ArgumentParser) -> None:
    """``--lane`` or ``--provider`` and ``--model`` (neither: everything)."""
    parser.add_argument("--lane", metavar="LANE", help="only this lane")
    parser.add_argument("--provider", metavar="PROVIDER", help="only this provider/model key (with --model)")
    parser.add_argument("--model", metavar="MODEL", help="only this provider/model key (with --provider)")


def _steer(args: argparse.Namespace, *, pause: bool) -> int:
    plane = open_plane(args, keys=True)
    try:
        operation = plane.pause if pause else plane.resume
        changed = operation(lane=args.lane, provider=args.provider, model=args.model, now=now_ms())
        pauses = plane.pauses()
    finally:
        plane.close()
    scope = _scope_text(args.lane, args.provider, args.model)
    verb = "paused" if pause else "resumed"
    text = f"{scope}: {verb}" if changed else f"{scope}: already {'paused' if pause else 'running'}"
    emit(args, {"changed": changed, "pauses": [_pause_json(item) for item in pauses]}, text)
    return EXIT_OK


def _read_document(path: str) -> dict[str, Any]:
    if path == "-":
        text = sys.stdin.read(MAX_POLICY_BYTES + 1)
    else:
        text = _read_regular_file(path)
    if len(text) > MAX_POLICY_BYTES:
        raise CommandFailed(f"the policy file is larger than {MAX_POLICY_BYTES} bytes")
    try:
        document = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidInputError("the policy file is not valid JSON") from None
    if not isinstance(document, dict):
        raise InvalidInputError("the policy file must hold a JSON object")
    return document


def _read_regular_file(path: str) -> str:
    """The file's text (at most one byte over the limit); a FIFO, a device or a directory is refused
    at once (opened non-blocking, so a FIFO without a writer cannot hang the command)."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        raise CommandFailed(f"cannot read the policy file: {error.strerror or error}") from None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise CommandFailed("cannot read the policy file: it is not a regular file")
        chunks, size = [], 0
        while size <= MAX_POLICY_BYTES and (chunk := os.read(descriptor, MAX_POLICY_BYTES + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(descriptor)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise CommandFailed("the policy file is not UTF-8 text") from None


def _scope_text(lane: str | None, provider: str | None, model: str | None) -> str:
    if lane is not None:
        return f"lane {lane}"
    if provider is not None or model is not None:
        return f"{provider}/{model}"
    return "admission"


def _pause_json(pause: Pause) -> dict[str, Any]:
    return {
        "scope": pause.scope,
        "lane": pause.lane,
        "provider": pause.provider,
        "model": pause.model,
        "since": pause.since,
    }


def _revision_json(revision: PolicyRevision) -> dict[str, Any]:
    return {"revision": revision.revision, "created_at": revision.created_at, "policy": revision.policy.to_json()}


def _revision_line(revision: PolicyRevision) -> str:
    policy = revision.policy
    lanes = ",".join(f"{lane.name}:{lane.weight}" for lane in policy.lanes)
    return (
        f"{revision.revision:>5}  {iso(revision.created_at)}  seats {policy.max_active_turns}  "
        f"starts {policy.max_concurrent_starts}  lanes {lanes}  key limits {len(policy.key_limits)}  "
        f"per session {policy.max_turns_per_session or '-'}  budgets {len(policy.budgets)}"
    )


def _revision_text(revision: PolicyRevision) -> str:
    head = (
        f"revision {revision.revision} (set {iso(revision.created_at)})"
        if revision.revision
        else "revision 0 (no live revision set: the durable seats and the connectors' own policy)"
    )
    return head + "\n" + _policy_text(revision.policy)


def _policy_text(policy: Policy) -> str:
    lines = [
        f"max active turns        {policy.max_active_turns}",
        f"max concurrent starts   {policy.max_concurrent_starts}",
        f"min start interval      {policy.min_start_interval_ms} ms",
        f"queue timeout           {policy.queue_timeout_ms} ms",
        f"capacity cooldown       {policy.capacity_cooldown_ms} ms",
        "lanes                   " + ", ".join(f"{lane.name} (weight {lane.weight})" for lane in policy.lanes),
        f"turns per session       {policy.max_turns_per_session or 'no limit'}"
        + (f" (beyond it: {policy.session_overflow})" if policy.max_turns_per_session else ""),
    ]
    for limit in policy.key_limits:
        key = limit.provider if limit.model is None else f"{limit.provider}/{limit.model}"
        parts = []
        if limit.max_active_turns is not None:
            parts.append(f"{limit.max_active_turns} active")
        if limit.max_concurrent_starts is not None:
            parts.append(f"{limit.max_concurrent_starts} starting")
        lines.append(f"key limit               {key}: {', '.join(parts)}")
    for budget in policy.budgets:
        key = f"{budget.provider} (all models)" if budget.model is None else f"{budget.provider}/{budget.model}"
        parts = []
        if budget.max_requests is not None:
            parts.append(f"{budget.max_requests} requests")
        if budget.max_tokens is not None:
            parts.append(f"{budget.max_tokens} tokens")
        lines.append(f"budget                  {key}: {', '.join(parts)} per {span(budget.window_ms)}")
    return "\n".join(lines)
