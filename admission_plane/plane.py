"""``AdmissionPlane``: the public class, the service's operations plus the turn API and the reaper.

It sits above both: :class:`~admission_plane.turns.Turn` and
:func:`~admission_plane.reaper.reap` are built on
:class:`~admission_plane.service.AdmissionService`, and this class only adds the two
shortcuts to them, so the service never imports the layers built on it.
"""

from __future__ import annotations

from typing import Any

from .evidence import ProcReaders
from .reaper import reap
from .service import AdmissionService
from .turns import Turn
from .values import ReaperSummary

__all__ = ["AdmissionPlane"]


class AdmissionPlane(AdmissionService):
    """A durable, cross-process admission plane for agent turns.

    Every operation of :class:`~admission_plane.service.AdmissionService` (see there for
    opening a database, keys and policies), plus :meth:`turn` and :meth:`reap_suspects`.
    """

    def turn(self, **options: Any) -> Turn:
        """A :class:`~admission_plane.turns.Turn` on this plane: ``with plane.turn(...) as turn: ...``.

        It enqueues the prompt, waits for admission, starts the dispatch child, records its
        identity with the dispatch intent, heartbeats while the block runs and completes with
        the right outcome; see :class:`~admission_plane.turns.Turn` for the options.
        """
        return Turn(self, **options)

    def reap_suspects(self, now: int, readers: ProcReaders | None = None) -> ReaperSummary:
        """One reaper pass with process evidence from ``readers`` (default: this host's ``/proc``).

        See :func:`admission_plane.reaper.reap` for the rules. Never raises for one bad
        lease, never requeues. A ``now`` that is not a timestamp, or ``readers`` without
        callable ``read_file`` and ``read_link``, raise
        :class:`~admission_plane.errors.InvalidInputError` before anything is read.
        """
        return reap(self, now, readers)
