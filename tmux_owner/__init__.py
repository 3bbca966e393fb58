"""tmux_owner: launch, supervise and close tmux-hosted agent owners through file evidence.

Independent of :mod:`admission_plane`; no SQLAlchemy. The public surface is re-exported
here through ``__all__``; private modules are free to change.
"""

from ._common import TmuxOwnerError, is_canonical_utc_timestamp
from ._files import LifecyclePaths, lifecycle_paths, memory_guard_claim_paths

__all__ = [
    "LifecyclePaths",
    "TmuxOwnerError",
    "is_canonical_utc_timestamp",
    "lifecycle_paths",
    "memory_guard_claim_paths",
]
