"""The one-line JSON protocol: parse one request line, dispatch it, serialise one response line.

Requests and responses are single lines of compact JSON bounded by 16 KiB of UTF-8.
A request that is not exactly one of the four shapes gets the fixed
``invalid_json_line`` failure; a response too large to fit gets ``response_too_large``.
"""

from __future__ import annotations

import sys
from typing import Any

from ._bootstrap import BootstrapDependencies, BootstrapRequest, bootstrap_owner_isolation, real_bootstrap_dependencies
from ._errors import InvalidRecordError
from ._generations import PublishGenerationRequest, publish_owner_generation
from ._jscompat import MAX_LINE_BYTES, dumps, loads, utf8_length
from ._plan import OwnerIsolationProbe, plan_owner_isolation
from ._plan_records import PlanRequest
from ._tmux import TmuxProbe
from ._validators import SCHEMA_VERSION
from ._verdict_records import ObserveTerminalRequest
from ._verdicts import observe_owner_terminal

Request = PlanRequest | BootstrapRequest | PublishGenerationRequest | ObserveTerminalRequest
_REQUEST_TYPES: tuple[type[Request], ...] = (
    PlanRequest,
    BootstrapRequest,
    PublishGenerationRequest,
    ObserveTerminalRequest,
)
RESPONSE_TOO_LARGE = {
    "schema_version": SCHEMA_VERSION,
    "ok": False,
    "code": "scope_unavailable",
    "diagnostic": "response_too_large",
}


def parse_request(line: str) -> Request | None:
    """The seed's ``parseOwnerIsolationRequest``: one of the four request records, or ``None``.

    ``None`` for more than 16 KiB of UTF-8, any ``\\n``, invalid JSON, a non-object, or
    an object that is not exactly one request shape.
    """
    given: object = line  # callers outside the type checker may pass anything
    if not isinstance(given, str) or utf8_length(given) > MAX_LINE_BYTES or "\n" in given:
        return None
    try:
        value = loads(line)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    for request_type in _REQUEST_TYPES:
        try:
            return request_type.from_json(value)
        except ValueError:
            continue
    return None


def serialize_response(response: Any) -> str:
    """Compact JSON of ``response`` (a record or a dict); ``response_too_large`` unless under 16 KiB.

    The returned text never contains a newline: JSON escapes every newline in strings.
    Beyond the seed: a response JSON cannot represent (NaN, a non-JSON type, nesting
    too deep to encode) raises ``InvalidRecordError``.
    """
    record = response.to_json() if hasattr(response, "to_json") else response
    try:
        serialized = dumps(record)
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidRecordError("response") from error
    if utf8_length(serialized) < MAX_LINE_BYTES:
        return serialized
    return dumps(RESPONSE_TOO_LARGE)


def cli_failure(diagnostic: str) -> dict[str, Any]:
    """The command line's fixed failure: ``scope_unavailable`` with ``diagnostic``."""
    return {"schema_version": SCHEMA_VERSION, "ok": False, "code": "scope_unavailable", "diagnostic": diagnostic}


def handle_request(
    request: Request,
    *,
    probe: OwnerIsolationProbe | None = None,
    bootstrap_deps: BootstrapDependencies | None = None,
) -> Any:
    """Run one parsed request and return its response record; never raises.

    Publication and observation errors become the seed CLI's ``generation_publication_failed``
    and ``terminal_observation_failed``. Beyond the seed (whose CLI would crash): a bootstrap
    that raises (a corrupt ``generation.json``) answers ``bootstrap_execution_failed``.
    """
    if isinstance(request, PlanRequest):
        return plan_owner_isolation(request, probe or TmuxProbe(platform=sys.platform))
    if isinstance(request, BootstrapRequest):
        try:
            return bootstrap_owner_isolation(request, bootstrap_deps or real_bootstrap_dependencies())
        except Exception:  # noqa: BLE001 - the protocol answers every request with one line
            return {
                "schema_version": SCHEMA_VERSION,
                "ok": False,
                "code": "scope_bootstrap_failed",
                "diagnostic": "bootstrap_execution_failed",
            }
    if isinstance(request, PublishGenerationRequest):
        try:
            return publish_owner_generation(request)
        except Exception:  # noqa: BLE001 - every publication failure has one protocol answer
            return cli_failure("generation_publication_failed")
    try:
        return observe_owner_terminal(request)
    except Exception:  # noqa: BLE001 - every observation failure has one protocol answer
        return cli_failure("terminal_observation_failed")


def read_one_line(data: bytes) -> str | None:
    """The request line of raw stdin: at most 16 KiB before an optional single final ``\\n``.

    ``None`` when the line is longer or anything follows the newline. Invalid UTF-8 is
    replaced (U+FFFD), as JavaScript's ``TextDecoder`` does.
    """
    line, newline, rest = data.partition(b"\n")
    if len(line) > MAX_LINE_BYTES or (newline and rest):
        return None
    return line.decode("utf-8", errors="replace")


def run_protocol(
    data: bytes,
    *,
    probe: OwnerIsolationProbe | None = None,
    bootstrap_deps: BootstrapDependencies | None = None,
) -> tuple[str, int]:
    """Answer raw stdin with one response line (without its newline) and an exit status.

    The status is 1 for a malformed request and for a failed bootstrap, else 0.
    """
    line = read_one_line(data)
    request = None if line is None else parse_request(line)
    if request is None:
        return serialize_response(cli_failure("invalid_json_line")), 1
    response = handle_request(request, probe=probe, bootstrap_deps=bootstrap_deps)
    output = serialize_response(response)
    if isinstance(request, BootstrapRequest) and loads(output).get("ok") is not True:
        return output, 1
    return output, 0
