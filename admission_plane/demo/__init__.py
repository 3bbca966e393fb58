"""``admission-plane demo``: several real agents share one plane, with two injected faults.

What runs: one worker process per agent (:mod:`admission_plane.demo.worker`), each a
connector with its own process identity, submitting its turns one after another through
the high-level turn API; every provider call is a real child process. This process shows
live progress from the database, runs the reaper with live ``/proc`` evidence, and
injects, unless told not to:

* a **provider capacity failure**: one turn's provider exits "overloaded", the turn ends
  ``failed`` with ``provider_capacity`` and its model cools down; turns of that model
  wait while the other models keep flowing;
* a **worker killed mid-dispatch**: one worker is SIGKILLed right after its dispatch
  intent committed. Its provider child (in its own process group) lives on for a while;
  the reaper must keep the seat while the child lives, and release it once connector,
  child and group are gone. The turn ends ``recovery_required`` and is never replayed.
  A replacement worker (a new connector) carries on with that agent's later turns.

The run ends with a summary and checks the invariants; the exit status is 1 if any of
them was violated. Keys are generated per run (or loaded, with ``--db``) and handed to
the workers in their environment; neither keys nor prompts are ever printed.
"""

from __future__ import annotations

from ._options import DemoOptions
from ._run import run_demo

__all__ = ["DemoOptions", "run_demo"]
