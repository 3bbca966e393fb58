"""What a probe proved about the tmux server behind a socket, and when that proof is safe to act on.

The plan, the execution's re-proof and the scoped bootstrap's receipt all judge a
server by the same structural rules (:func:`is_safe_server_proof`) and compare two
proofs the same way (:func:`same_server_identity`).
"""

from __future__ import annotations

from typing import Any, Literal, get_args

import attrs

from ._cgroup import CgroupInfo
from ._jscompat import is_safe_integer
from ._validators import non_empty, one_of

ServerState = Literal["absent", "safe", "unsafe", "unverifiable"]
SERVER_STATES: frozenset[str] = frozenset(get_args(ServerState))


@attrs.frozen
class TmuxServerProof:
    """What a probe proved about the tmux server behind a socket.

    ``pid`` is kept as given so :func:`is_safe_server_proof` can judge it; ``pid_proven``
    ``False`` marks a placeholder pid from a platform that cannot prove one.
    """

    state: ServerState = attrs.field(validator=one_of(SERVER_STATES))
    pid: int | None = None
    start_time: str | None = None
    cgroup: CgroupInfo | None = None
    session_names: tuple[str, ...] | None = None
    pid_proven: bool | None = None

    def to_json(self) -> dict[str, Any]:
        """The seed's probe object (camelCase keys), omitting what is unknown."""
        record: dict[str, Any] = {"state": self.state}
        if self.pid is not None:
            record["pid"] = self.pid
        if self.start_time is not None:
            record["startTime"] = self.start_time
        if self.cgroup is not None:
            record["cgroup"] = self.cgroup.to_json()
        if self.session_names is not None:
            record["sessionNames"] = list(self.session_names)
        if self.pid_proven is not None:
            record["pidProven"] = self.pid_proven
        return record


def is_safe_server_proof(server: TmuxServerProof, platform: str = "linux") -> bool:
    """Structurally safe: state ``safe``, a positive safe-integer pid, a start time, and a safe cgroup.

    Off Linux a ``not_applicable`` cgroup also counts. Anything but a proof is not safe.
    """
    given: object = server  # callers outside the type checker may pass anything
    if not isinstance(given, TmuxServerProof) or not isinstance(given.cgroup, CgroupInfo | None):
        return False
    classification = None if server.cgroup is None else server.cgroup.classification
    return (
        server.state == "safe"
        and is_safe_integer(server.pid)
        and server.pid > 0
        and non_empty(server.start_time)
        and (classification == "safe" or (platform != "linux" and classification == "not_applicable"))
    )


def same_server_identity(left: TmuxServerProof, right: TmuxServerProof) -> bool:
    """Whether two probes saw the same server: pid, start time and cgroup classification/scope/diagnostic."""
    given: tuple[object, object] = (left, right)  # callers outside the type checker may pass anything
    if not all(isinstance(proof, TmuxServerProof) for proof in given):
        return False
    return (
        left.pid == right.pid
        and left.start_time == right.start_time
        and _cgroup_fields(left.cgroup) == _cgroup_fields(right.cgroup)
    )


def _cgroup_fields(cgroup: CgroupInfo | None) -> tuple[str | None, str | None, str | None]:
    if cgroup is None:
        return (None, None, None)
    return (cgroup.classification, cgroup.scope, cgroup.diagnostic)
