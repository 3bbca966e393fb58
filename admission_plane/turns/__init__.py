"""The high-level turn API: one ``with`` block drives a turn through the whole lifecycle.

::

    with plane.turn(request_id="r-1", session_id="s-1", agent_id="agent-a",
                    provider="anthropic", model="claude", prompt="hello",
                    command=["my-provider-cli"]) as turn:
        reply = turn.child.stdout.read()      # the turn is active here; heartbeats run
        if b"overloaded" in reply:
            turn.fail("provider_capacity")    # cools the model down for everyone

Entering the block enqueues the request with its sealed prompt, waits for admission
(on the plane's doorbell; the queue position is reported to ``progress`` and kept in
:attr:`Turn.snapshot`), marks the lease starting, spawns (or adopts) the dispatch child,
records the child's process identity with the dispatch intent, reads the prompt back
from the payload, writes it to the child and marks the turn active. A background thread
heartbeats the lease from admission until the block ends. Leaving the block completes
the turn with the outcome chosen in the block (``completed`` by default).

Failure rules (never a re-enqueue): an exception while still queued cancels the request;
an exception after admission but before the prompt write abandons the lease
(``failed``, or ``cancelled`` for ``KeyboardInterrupt``); an exception once the write
began, or inside the block, marks the execution ``recovery_required`` (the seat stays
held as visible capacity debt). The original exception is always re-raised.
"""

from __future__ import annotations

from ._child import spawn_child
from ._support import DEFAULT_FINGERPRINT, Backoff, DispatchRefusedError, TurnNotAdmittedError
from ._turn import Turn, run_turn, turn

__all__ = [
    "DEFAULT_FINGERPRINT",
    "Backoff",
    "DispatchRefusedError",
    "Turn",
    "TurnNotAdmittedError",
    "run_turn",
    "spawn_child",
    "turn",
]
