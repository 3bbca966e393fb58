"""What every operation of a plane needs: its engine, policy, keys, clock and identity.

The façade (:class:`admission_plane.AdmissionPlane`) builds one :class:`PlaneContext` and
hands it to the job modules of this package; each public operation is one call of
:meth:`PlaneContext.run`, which runs one unit of work.
"""

from __future__ import annotations

import hmac
import threading
from collections.abc import Callable
from typing import TypeVar

import attrs
from sqlalchemy import Engine

from .. import _validate as v
from ..clock import Clock
from ..crypto import EventCorrelator, SecretKey
from ..errors import AdmissionStateError, InvalidInputError, MissingKeyError
from ..evidence import ConnectorIdentity
from ..policy import Policy
from ..store.doorbell import Chimes, Doorbell, ListeningDoorbell
from ..store.tx import Tx
from ..store.unit_of_work import Gate, SentUnitRefused, run
from ._wake import Wake

T = TypeVar("T")


@attrs.frozen
class WaitHint:
    """What an enqueue learned when its request's admission (``admit_as``) admitted nothing, for its connector's
    wait: what a look would have answered (``wake``) and the doorbell's counters (``seen``), both read under the
    SQLite writer gate, so every change since rang after ``seen``. The wait starts from it instead of a look of
    its own (:func:`admission_plane.service._waiting.wait_for_admission`)."""

    request_id: str
    owner_instance_id: str
    seen: Chimes
    wake: Wake


@attrs.frozen
class FaultInjection:
    """Test hooks. ``after_process_identity_persisted`` runs inside the dispatch-intent
    transaction after the identity row is written; if it raises, the transaction rolls back
    and the call reports ``transaction_fault``."""

    after_process_identity_persisted: Callable[[], object] | None = None


class PlaneKeys:
    """The plane's copies of its two keys; :meth:`wipe` zero-fills them."""

    __slots__ = ("_content", "_correlate", "_encryption")

    def __init__(self, encryption_key: bytes | None, content_fingerprint_key: bytes | None) -> None:
        self._encryption = None if encryption_key is None else SecretKey(encryption_key, "encryption")
        self._content = (
            None if content_fingerprint_key is None else SecretKey(content_fingerprint_key, "content fingerprint")
        )
        if self._encryption is not None and self._content is not None and _same(self._encryption, self._content):
            self._encryption.wipe()
            self._content.wipe()
            raise InvalidInputError("admission encryption and content fingerprint keys must differ")
        self._correlate = None if self._content is None else EventCorrelator(self._content)

    @property
    def encryption(self) -> SecretKey | None:
        """The payload key, if the plane has one."""
        return self._encryption

    @property
    def content(self) -> SecretKey | None:
        """The content, policy and journal HMAC key, if the plane has one."""
        return self._content

    def require_encryption(self) -> SecretKey:
        """The payload key; :class:`MissingKeyError` without one."""
        if self._encryption is None:
            raise MissingKeyError("payload persistence requires an encryption key")
        return self._encryption

    def require_content(self) -> SecretKey:
        """The HMAC key; :class:`MissingKeyError` without one."""
        if self._content is None:
            raise MissingKeyError("admission event correlation requires a content fingerprint key")
        return self._content

    def correlation(self, request_id: str) -> str:
        """The journal's correlation HMAC of ``request_id``."""
        self.require_content()
        assert self._correlate is not None  # set together with the content key
        return self._correlate(request_id)

    def wipe(self) -> None:
        """Zero-fill both keys and the correlator's cache."""
        for key in (self._encryption, self._content):
            if key is not None:
                key.wipe()
        if self._correlate is not None:
            self._correlate.forget()


def _same(first: SecretKey, second: SecretKey) -> bool:
    """Whether two keys hold the same bytes (compared in constant time)."""
    return hmac.compare_digest(first.material(), second.material())


class PlaneContext:
    """One plane's configuration and resources, shared by its job modules (thread-safe)."""

    def __init__(
        self,
        *,
        engine: Engine,
        owns_engine: bool,
        policy: Policy,
        keys: PlaneKeys,
        owner_identity: ConnectorIdentity,
        host_id: str,
        clock: Clock,
        faults: FaultInjection,
        doorbell: Doorbell | ListeningDoorbell | None,
    ) -> None:
        self.engine = engine
        self.policy = policy
        self.keys = keys
        self.owner_identity = owner_identity
        self.host_id = host_id
        self.clock = clock
        self.faults = faults
        self.doorbell = doorbell
        #: Whether ``owner_identity`` is known to be recorded (a queued-owner row is never deleted).
        self.owner_recorded = False
        #: Budget reservations this plane made (settled charges are pruned every so many).
        self.reservations = 0
        #: Whether this plane's last wait for admission had to wait (a hint, see ``_waiting``).
        self.queue_busy = False
        #: The durable policy's revision this plane last read and the policy in force with it
        #: (``_policy.effective_of``): what a start or an enqueue sent whole with its commit assumes, and the
        #: server checks (revision 0: none set, or no durable policy, is this plane's own policy).
        self.policy_seen: tuple[int, Policy] = (0, policy)
        #: Whether a live turn's completion may be sent whole with its commit: its last completion read the long
        #: way had no budget reservation to settle and no soft drain pending (a hint, ``_lifecycle``).
        self.release_sent = True
        #: The last enqueue's :class:`WaitHint` (one at most; taken by the wait for that request and owner).
        self.wait_hint: WaitHint | None = None
        self._owns_engine = owns_engine
        self._closed = False
        self._close_lock = threading.Lock()

    def now(self) -> int:
        """The plane clock's reading; :class:`InvalidInputError` unless it is a non-negative safe integer."""
        return v.timestamp(self.clock(), "plane clock reading")

    def run(self, work: Callable[[Tx], T], *, read_only: bool = False, gate: Gate | None = None) -> T:
        """Run ``work`` in one unit of work (see :func:`admission_plane.store.unit_of_work.run`; ``gate``: how a
        PostgreSQL unit takes the plane's advisory lock, :class:`~admission_plane.store.unit_of_work.Gate`)."""
        if self._closed:
            raise AdmissionStateError("admission plane is closed")
        return run(self.engine, work, read_only=read_only, gate=gate)

    def run_sent(self, sent: Callable[[Tx], T], work: Callable[[Tx], T], *, gate: Gate) -> T:
        """Run ``sent``, a unit that sends all it writes with its commit, checked on the server (one round trip),
        where the connection holds the session functions, and ``work`` in its place elsewhere (SQLite, a pooler);
        if the server found the database otherwise than ``sent`` assumed, nothing was committed: run ``work``,
        which reads first, and so answers exactly (with the operation's own refusal where there is one).
        ``sent`` may still run ``work`` itself when what it assumes is not known to hold."""
        try:
            return self.run(lambda tx: sent(tx) if tx.functions else work(tx), gate=gate)
        except SentUnitRefused:
            return self.run(work, gate=gate)

    def take_wait_hint(self, request_id: str, owner_instance_id: str) -> WaitHint | None:
        """The last enqueue's wait hint if it is for ``request_id`` and ``owner_instance_id`` (it is taken either
        way: a hint serves one wait, right after its enqueue)."""
        hint, self.wait_hint = self.wait_hint, None
        if hint is None or (hint.request_id, hint.owner_instance_id) != (request_id, owner_instance_id):
            return None
        return hint

    def close(self) -> None:
        """Wipe the keys, stop the doorbell and release the engine if the plane created it. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self.keys.wipe()
        if self.doorbell is not None:
            self.doorbell.close()
        if self._owns_engine:
            self.engine.dispose()
