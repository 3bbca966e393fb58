"""SQLAlchemy 2.0 entities for every table of the seed's v3 schema.

Column names, order, declared SQLite types, NOT NULL, defaults, foreign keys and index
names match the seed byte for byte (a database written by the original connector is
adopted as-is). Integer columns are ``INTEGER`` on SQLite and ``BIGINT`` on PostgreSQL:
millisecond timestamps, generations and namespace inodes overflow a 32-bit integer.
The Alembic history in ``migrations/`` is the source of the physical schema; these
entities describe the same schema for queries and for ``alembic check``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    ForeignKey,
    Identity,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    PrimaryKeyConstraint,
    Text,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

#: ``INTEGER`` on SQLite (the seed's declared type, and a rowid alias where it is the key),
#: ``BIGINT`` elsewhere.
Int64 = BigInteger().with_variant(Integer(), "sqlite")

#: Tables owned by the admission plane (the seed's list for the "unversioned tables" refusal).
ADMISSION_TABLES = (
    "turn_requests",
    "leases",
    "cooldowns",
    "turn_payloads",
    "lease_process_identities",
    "start_history",
    "sessions",
    "events",
    "policy_state",
    "queued_owner_instances",
    # Revision 0006 (policy v2):
    "policy_revisions",
    "admission_pauses",
    "lane_credits",
    "queue_entries",
    "queue_sessions",
    "queue_agents",
    "queue_keys",
    # Revision 0007 (budgets):
    "budget_charges",
    "turn_estimates",
)


class Base(DeclarativeBase):
    """Declarative base holding the admission metadata."""

    metadata = MetaData()


class SchemaMigration(Base):
    """The seed's migration ledger: one row per applied seed version (1, 2, 3)."""

    __tablename__ = "schema_migrations"

    version: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=False)
    name: Mapped[str] = mapped_column(Text, nullable=False)
    applied_at: Mapped[int] = mapped_column(Int64, nullable=False)


class TurnRequest(Base):
    """One agent turn, from ``queued`` to a terminal state or ``recovery_required``."""

    __tablename__ = "turn_requests"
    __table_args__ = (
        Index("turn_requests_queue", "state", "enqueued_at"),
        Index(
            "turn_requests_queued_owner",
            "queued_owner_instance_id",
            sqlite_where=text("queued_owner_instance_id IS NOT NULL"),
            postgresql_where=text("queued_owner_instance_id IS NOT NULL"),
        ),
        # Revision 0005: the queue-timeout sweep reads only the rows that expire.
        Index("turn_requests_state_deadline", "state", "deadline_at"),
        # Revision 0006: a session's requests, for its limit at enqueue.
        Index("turn_requests_session_state", "session_id", "state"),
    )

    request_id: Mapped[str] = mapped_column(Text, primary_key=True)
    session_id: Mapped[str] = mapped_column(Text, nullable=False)
    agent_id: Mapped[str] = mapped_column(Text, nullable=False)
    fingerprint: Mapped[str] = mapped_column(Text, nullable=False)
    provider: Mapped[str] = mapped_column(Text, nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    state: Mapped[str] = mapped_column(Text, nullable=False)
    enqueued_at: Mapped[int] = mapped_column(Int64, nullable=False)
    deadline_at: Mapped[int] = mapped_column(Int64, nullable=False)
    lease_generation: Mapped[int] = mapped_column(Int64, nullable=False, server_default=text("0"))
    terminal_at: Mapped[int | None] = mapped_column(Int64)
    queued_owner_instance_id: Mapped[str | None] = mapped_column(Text)
    queued_owner_recorded_at: Mapped[int | None] = mapped_column(Int64)
    #: The priority lane (revision 0006; requests written before it are in ``default``).
    lane: Mapped[str] = mapped_column(Text, nullable=False, server_default=text("'default'"))

    lease: Mapped[Lease | None] = relationship(back_populates="request", uselist=False)
    payload: Mapped[TurnPayload | None] = relationship(back_populates="request", uselist=False)


class Lease(Base):
    """A seat held by one admitted request, fenced by (lease id, generation, owner)."""

    __tablename__ = "leases"
    __table_args__ = (
        Index("leases_phase", "phase"),
        CheckConstraint(
            "suspect_reason IS NULL OR suspect_reason IN ('heartbeat_expired', 'identity_unverifiable')",
            name="leases_suspect_reason_check",
        ),
    )

    lease_id: Mapped[str] = mapped_column(Text, primary_key=True)
    request_id: Mapped[str] = mapped_column(Text, ForeignKey("turn_requests.request_id"), nullable=False, unique=True)
    generation: Mapped[int] = mapped_column(Int64, nullable=False)
    owner_instance_id: Mapped[str] = mapped_column(Text, nullable=False)
    phase: Mapped[str] = mapped_column(Text, nullable=False)
    acquired_at: Mapped[int] = mapped_column(Int64, nullable=False)
    heartbeat_at: Mapped[int] = mapped_column(Int64, nullable=False)
    suspect_since: Mapped[int | None] = mapped_column(Int64)
    suspect_reason: Mapped[str | None] = mapped_column(Text)

    request: Mapped[TurnRequest] = relationship(back_populates="lease")
    process_identity: Mapped[LeaseProcessIdentity | None] = relationship(
        back_populates="lease", uselist=False, passive_deletes=True
    )


class Cooldown(Base):
    """A provider/model that may not be admitted before ``not_before`` (after a capacity failure)."""

    __tablename__ = "cooldowns"
    __table_args__ = (PrimaryKeyConstraint("provider", "model"),)

    provider: Mapped[str] = mapped_column(Text, nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    not_before: Mapped[int] = mapped_column(Int64, nullable=False)
    updated_at: Mapped[int] = mapped_column(Int64, nullable=False)


class TurnPayload(Base):
    """A prompt sealed with AES-256-GCM; deleted at ``active`` and on every terminal path."""

    __tablename__ = "turn_payloads"

    request_id: Mapped[str] = mapped_column(
        Text, ForeignKey("turn_requests.request_id", ondelete="CASCADE"), primary_key=True
    )
    nonce: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    ciphertext: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    auth_tag: Mapped[bytes] = mapped_column(LargeBinary, nullable=False)
    key_version: Mapped[int] = mapped_column(Int64, nullable=False)
    content_fingerprint: Mapped[str] = mapped_column(Text, nullable=False)
    expires_at: Mapped[int] = mapped_column(Int64, nullable=False)
    created_at: Mapped[int] = mapped_column(Int64, nullable=False)

    request: Mapped[TurnRequest] = relationship(back_populates="payload")


class LeaseProcessIdentity(Base):
    """Linux process evidence of the connector and the dispatch child, recorded with the dispatch intent."""

    __tablename__ = "lease_process_identities"
    __table_args__ = (Index("lease_process_identities_request", "request_id", unique=True),)

    lease_id: Mapped[str] = mapped_column(Text, ForeignKey("leases.lease_id", ondelete="CASCADE"), primary_key=True)
    request_id: Mapped[str] = mapped_column(Text, ForeignKey("turn_requests.request_id"), nullable=False)
    lease_generation: Mapped[int] = mapped_column(Int64, nullable=False)
    owner_instance_id: Mapped[str] = mapped_column(Text, nullable=False)
    prompt_channel: Mapped[str] = mapped_column(Text, nullable=False)
    connector_owner_instance_id: Mapped[str] = mapped_column(Text, nullable=False)
    connector_created_at: Mapped[str] = mapped_column(Text, nullable=False)
    connector_boot_id: Mapped[str] = mapped_column(Text, nullable=False)
    connector_pid: Mapped[int] = mapped_column(Int64, nullable=False)
    connector_start_time_ticks: Mapped[str] = mapped_column(Text, nullable=False)
    connector_pid_namespace_inode: Mapped[int] = mapped_column(Int64, nullable=False)
    connector_ppid: Mapped[int] = mapped_column(Int64, nullable=False)
    connector_pgrp: Mapped[int] = mapped_column(Int64, nullable=False)
    connector_session: Mapped[int] = mapped_column(Int64, nullable=False)
    child_boot_id: Mapped[str] = mapped_column(Text, nullable=False)
    child_pid: Mapped[int] = mapped_column(Int64, nullable=False)
    child_start_time_ticks: Mapped[str] = mapped_column(Text, nullable=False)
    child_pid_namespace_inode: Mapped[int] = mapped_column(Int64, nullable=False)
    child_ppid: Mapped[int] = mapped_column(Int64, nullable=False)
    child_pgrp: Mapped[int] = mapped_column(Int64, nullable=False)
    child_session: Mapped[int] = mapped_column(Int64, nullable=False)
    recorded_at: Mapped[int] = mapped_column(Int64, nullable=False)
    #: The host that captured this evidence (revision 0004; NULL = before it, treated as local).
    host_id: Mapped[str | None] = mapped_column(Text)

    lease: Mapped[Lease] = relationship(back_populates="process_identity")


class StartHistory(Base):
    """Recent starts, for the minimum interval between starts."""

    __tablename__ = "start_history"
    __table_args__ = (Index("start_history_started", "started_at"),)

    lease_id: Mapped[str] = mapped_column(Text, primary_key=True)
    started_at: Mapped[int] = mapped_column(Int64, nullable=False)


class SessionRecord(Base):
    """The connector's session table (kept by the seed's schema; not used by admission)."""

    __tablename__ = "sessions"

    session_id: Mapped[str] = mapped_column(Text, primary_key=True)
    conversation_id: Mapped[str | None] = mapped_column(Text)
    conversation_cursor: Mapped[int] = mapped_column(Int64, nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    effort: Mapped[str] = mapped_column(Text, nullable=False)
    mode: Mapped[str] = mapped_column(Text, nullable=False)
    cwd: Mapped[str] = mapped_column(Text, nullable=False)
    roots_json: Mapped[str] = mapped_column(Text, nullable=False)
    v2_user_message_ids_json: Mapped[str] = mapped_column(Text, nullable=False)
    updated_at: Mapped[int] = mapped_column(Int64, nullable=False)


# Declared on the table's columns (not as text) so that DESC is a column sort that
# `alembic check` compares with the database instead of an expression it cannot.
Index(
    "sessions_updated_at_session_id",
    SessionRecord.__table__.c.updated_at.desc(),
    SessionRecord.__table__.c.session_id,
)
Index(
    "sessions_cwd_updated_at_session_id",
    SessionRecord.__table__.c.cwd,
    SessionRecord.__table__.c.updated_at.desc(),
    SessionRecord.__table__.c.session_id,
)


class Event(Base):
    """The append-only, identifier-free audit journal (HMAC correlation only)."""

    __tablename__ = "events"
    __table_args__ = (Index("events_occurred", "occurred_at", "event_seq"), {"sqlite_autoincrement": True})

    event_seq: Mapped[int] = mapped_column(Int64, Identity(always=False), primary_key=True)
    kind: Mapped[str] = mapped_column(Text, nullable=False)
    from_state: Mapped[str] = mapped_column(Text, nullable=False)
    to_state: Mapped[str] = mapped_column(Text, nullable=False)
    occurred_at: Mapped[int] = mapped_column(Int64, nullable=False)
    correlation_hmac: Mapped[str] = mapped_column(Text, nullable=False)


class PolicyState(Base):
    """The single durable policy row (``id = 1``) shared by every opener, and its soft-drain state."""

    __tablename__ = "policy_state"
    __table_args__ = (
        CheckConstraint("id = 1", name="policy_state_id_check"),
        CheckConstraint("max_active_turns >= 1", name="policy_state_max_active_turns_check"),
        CheckConstraint("max_concurrent_starts >= 1", name="policy_state_max_concurrent_starts_check"),
        CheckConstraint("min_start_interval_ms >= 2000", name="policy_state_min_start_interval_ms_check"),
        CheckConstraint(
            "queue_timeout_ms > 0 AND queue_timeout_ms <= 1800000", name="policy_state_queue_timeout_ms_check"
        ),
        CheckConstraint("capacity_cooldown_ms >= 30000", name="policy_state_capacity_cooldown_ms_check"),
        CheckConstraint("drain_state IN ('steady', 'soft_draining_to_1')", name="policy_state_drain_state_check"),
    )

    id: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=False)
    max_active_turns: Mapped[int] = mapped_column(Int64, nullable=False)
    max_concurrent_starts: Mapped[int] = mapped_column(Int64, nullable=False)
    min_start_interval_ms: Mapped[int] = mapped_column(Int64, nullable=False)
    queue_timeout_ms: Mapped[int] = mapped_column(Int64, nullable=False)
    capacity_cooldown_ms: Mapped[int] = mapped_column(Int64, nullable=False)
    drain_state: Mapped[str] = mapped_column(Text, nullable=False)
    policy_fingerprint: Mapped[str] = mapped_column(Text, nullable=False)
    updated_at: Mapped[int] = mapped_column(Int64, nullable=False)
    updated_by_owner_instance_id: Mapped[str] = mapped_column(Text, nullable=False)
    #: The live policy revision in force (revision 0006; 0: the claimed seed-shaped policy only).
    revision: Mapped[int] = mapped_column(Int64, nullable=False, server_default=text("0"))


class PolicyRevision(Base):
    """Every live policy revision: when it was set and the whole policy as JSON (no identifiers)."""

    __tablename__ = "policy_revisions"

    revision: Mapped[int] = mapped_column(Int64, primary_key=True, autoincrement=False)
    created_at: Mapped[int] = mapped_column(Int64, nullable=False)
    document: Mapped[str] = mapped_column(Text, nullable=False)


class AdmissionPause(Base):
    """A paused part of the plane: ``('', '', '')`` everything, ``(lane, '', '')`` a lane,
    ``('', provider, model)`` a provider/model key."""

    __tablename__ = "admission_pauses"
    __table_args__ = (PrimaryKeyConstraint("lane", "provider", "model"),)

    lane: Mapped[str] = mapped_column(Text, nullable=False)
    provider: Mapped[str] = mapped_column(Text, nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    since: Mapped[int] = mapped_column(Int64, nullable=False)


class LaneCredit(Base):
    """What each lane may still take in the current round of the weighted share between lanes."""

    __tablename__ = "lane_credits"

    lane: Mapped[str] = mapped_column(Text, primary_key=True)
    credits: Mapped[int] = mapped_column(Int64, nullable=False)


# --- the admission index (revision 0006) ---------------------------------------------------------
# Queued requests with a payload, and the head (oldest entry) of every group they form:
# lane > provider/model key > agent > session. Admission walks heads, skipping whole groups
# that are ineligible, so its cost follows the number of ineligible *groups* it meets (a
# few: they hold seats, cool down or are paused), never the number of queued requests.


class QueueEntry(Base):
    """A queued request that has its payload: admissible, subject to the policy."""

    __tablename__ = "queue_entries"
    __table_args__ = (
        Index(
            "queue_entries_group", "lane", "provider", "model", "agent_id", "session_id", "enqueued_at", "request_id"
        ),
    )

    request_id: Mapped[str] = mapped_column(Text, primary_key=True)
    lane: Mapped[str] = mapped_column(Text, nullable=False)
    provider: Mapped[str] = mapped_column(Text, nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    agent_id: Mapped[str] = mapped_column(Text, nullable=False)
    session_id: Mapped[str] = mapped_column(Text, nullable=False)
    enqueued_at: Mapped[int] = mapped_column(Int64, nullable=False)


class QueueSession(Base):
    """The oldest entry of one (lane, provider, model, agent, session) group."""

    __tablename__ = "queue_sessions"
    __table_args__ = (
        PrimaryKeyConstraint("lane", "provider", "model", "agent_id", "session_id"),
        Index("queue_sessions_order", "lane", "provider", "model", "agent_id", "head_enqueued_at", "head_request_id"),
    )

    lane: Mapped[str] = mapped_column(Text, nullable=False)
    provider: Mapped[str] = mapped_column(Text, nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    agent_id: Mapped[str] = mapped_column(Text, nullable=False)
    session_id: Mapped[str] = mapped_column(Text, nullable=False)
    head_enqueued_at: Mapped[int] = mapped_column(Int64, nullable=False)
    head_request_id: Mapped[str] = mapped_column(Text, nullable=False)


class QueueAgent(Base):
    """The oldest entry of one (lane, provider, model, agent) group."""

    __tablename__ = "queue_agents"
    __table_args__ = (
        PrimaryKeyConstraint("lane", "provider", "model", "agent_id"),
        Index("queue_agents_order", "lane", "provider", "model", "head_enqueued_at", "head_request_id"),
    )

    lane: Mapped[str] = mapped_column(Text, nullable=False)
    provider: Mapped[str] = mapped_column(Text, nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    agent_id: Mapped[str] = mapped_column(Text, nullable=False)
    head_enqueued_at: Mapped[int] = mapped_column(Int64, nullable=False)
    head_request_id: Mapped[str] = mapped_column(Text, nullable=False)


class QueueKey(Base):
    """The oldest entry of one (lane, provider, model) group."""

    __tablename__ = "queue_keys"
    __table_args__ = (
        PrimaryKeyConstraint("lane", "provider", "model"),
        Index("queue_keys_order", "lane", "head_enqueued_at", "head_request_id"),
    )

    lane: Mapped[str] = mapped_column(Text, nullable=False)
    provider: Mapped[str] = mapped_column(Text, nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    head_enqueued_at: Mapped[int] = mapped_column(Int64, nullable=False)
    head_request_id: Mapped[str] = mapped_column(Text, nullable=False)


class BudgetCharge(Base):
    """What counts against the budgets of a provider/model key (revision 0007).

    A turn's charge (``charge_id`` is its request id) is written at admission: one request
    and its estimated tokens (``reserved_tokens``); ``used_tokens`` is NULL while the turn has
    not settled (or is retained in ``recovery_required``), and what it used once it has.
    Usage recorded outside the plane and the provider's corrections are charges too
    (``charge_id`` ``usage-<uuid>``). ``model`` is ``''`` for a provider-wide correction.
    """

    __tablename__ = "budget_charges"
    __table_args__ = (
        Index("budget_charges_key", "provider", "model", "charged_at"),
        Index("budget_charges_provider", "provider", "charged_at"),
    )

    charge_id: Mapped[str] = mapped_column(Text, primary_key=True)
    provider: Mapped[str] = mapped_column(Text, nullable=False)
    model: Mapped[str] = mapped_column(Text, nullable=False)
    charged_at: Mapped[int] = mapped_column(Int64, nullable=False)
    requests: Mapped[int] = mapped_column(Int64, nullable=False)
    reserved_tokens: Mapped[int] = mapped_column(Int64, nullable=False)
    used_tokens: Mapped[int | None] = mapped_column(Int64)
    state: Mapped[str] = mapped_column(Text, nullable=False)
    #: A correction counts only in the windows of this length (the one it corrects); NULL: in every window.
    window_ms: Mapped[int | None] = mapped_column(Int64)


class TurnEstimate(Base):
    """A request's estimated token cost, given at enqueue (revision 0007; absent: no estimate)."""

    __tablename__ = "turn_estimates"

    request_id: Mapped[str] = mapped_column(Text, primary_key=True)
    tokens: Mapped[int] = mapped_column(Int64, nullable=False)


class QueuedOwnerInstance(Base):
    """The process identity of a connector that enqueued requests (to settle them when it dies)."""

    __tablename__ = "queued_owner_instances"

    owner_instance_id: Mapped[str] = mapped_column(Text, primary_key=True)
    created_at: Mapped[str] = mapped_column(Text, nullable=False)
    boot_id: Mapped[str] = mapped_column(Text, nullable=False)
    pid: Mapped[int] = mapped_column(Int64, nullable=False)
    start_time_ticks: Mapped[str] = mapped_column(Text, nullable=False)
    pid_namespace_inode: Mapped[int] = mapped_column(Int64, nullable=False)
    ppid: Mapped[int] = mapped_column(Int64, nullable=False)
    pgrp: Mapped[int] = mapped_column(Int64, nullable=False)
    session: Mapped[int] = mapped_column(Int64, nullable=False)
    recorded_at: Mapped[int] = mapped_column(Int64, nullable=False)
    #: The host that captured this evidence (revision 0004; NULL = before it, treated as local).
    host_id: Mapped[str | None] = mapped_column(Text)


metadata = Base.metadata

__all__ = [
    "ADMISSION_TABLES",
    "AdmissionPause",
    "Base",
    "BudgetCharge",
    "Cooldown",
    "Event",
    "Int64",
    "LaneCredit",
    "Lease",
    "LeaseProcessIdentity",
    "PolicyRevision",
    "PolicyState",
    "QueueAgent",
    "QueueEntry",
    "QueueKey",
    "QueueSession",
    "QueuedOwnerInstance",
    "SchemaMigration",
    "SessionRecord",
    "StartHistory",
    "TurnEstimate",
    "TurnPayload",
    "TurnRequest",
    "metadata",
]
