"""An async connector process for the crash tests (no pytest here).

``python -m tests.admission.async_worker <db> <request-id> <policy-json>`` runs one turn through
:class:`admission_plane.aio.AsyncAdmissionPlane` with a real child process group (``sh``
reading its prompt plus a background ``sleep``), prints ``ready`` with the child's pid once
the turn is active (after the prompt write), then waits inside the block to be killed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from admission_plane import Policy
from admission_plane.aio import AsyncAdmissionPlane
from tests.admission.workers import CONTENT_KEY, ENCRYPTION_KEY, MODELS, emit, prompt_for

#: The group outlives its leader: killing only the recorded child leaves the background sleep behind.
CHILD = ("sh", "-c", "sleep 600 & cat >/dev/null; wait")


async def crash_after_prompt(database: str, request_id: str, policy_json: str) -> None:
    """Drive one async turn to ``active`` and wait in its block until SIGKILLed."""
    async with (
        AsyncAdmissionPlane(
            database,
            policy=Policy(*json.loads(policy_json)),
            encryption_key=ENCRYPTION_KEY,
            content_fingerprint_key=CONTENT_KEY,
        ) as aplane,
        aplane.turn(
            request_id=request_id,
            session_id="session-1",
            agent_id="agent-crash",
            provider="antigravity",
            model=MODELS[0],
            prompt=prompt_for(request_id),
            command=CHILD,
        ) as live,
    ):
        emit({"event": "ready", "request_id": request_id, "child_pid": live.pid, "pid": os.getpid()})
        await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(crash_after_prompt(*sys.argv[1:]))
