"""``DispatchRecord.for_lease``: a dispatch record built from the lease it dispatches, so that its request,
lease, generation and owner cannot be mixed up with another turn's."""

from __future__ import annotations

import attrs
import pytest
from fake_proc import OWNER_A, OWNER_B, PID, START, connector, process
from hostile import NESTED, OTHER_TYPES
from hypothesis import given
from hypothesis import strategies as st

from admission_plane import AdmittedLease, DispatchRecord, PromptChannel
from admission_plane.errors import InvalidInputError

CHILD = process(PID + 1, start=START, ppid=PID)
CONNECTOR = connector(PID, OWNER_A)
LEASE = AdmittedLease("lease-1", "turn-1", 3, OWNER_A)

IDS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,40}", fullmatch=True)


@given(request_id=IDS, lease_id=IDS, generation=st.integers(1, 2**53 - 1), starting=st.booleans())
def test_for_lease_is_the_record_written_out_field_by_field(
    request_id: str, lease_id: str, generation: int, starting: bool
) -> None:
    """Whatever the lease (and whether its admission also started it), the record names that lease's request, lease,
    generation and owner, beside the connector, the child and the prompt channel given."""
    lease = AdmittedLease(lease_id, request_id, generation, OWNER_A, starting=starting)
    record = DispatchRecord.for_lease(lease, CONNECTOR, CHILD, prompt_channel="pty")
    assert record == DispatchRecord(
        request_id=request_id,
        lease_id=lease_id,
        generation=generation,
        owner_instance_id=OWNER_A,
        connector=CONNECTOR,
        child=CHILD,
        prompt_channel=PromptChannel.PTY,
    )
    assert record.fence == lease.fence


def test_a_connector_that_does_not_own_the_lease_is_refused() -> None:
    """A lease admitted by another plane (another owner instance) is not this connector's to dispatch."""
    with pytest.raises(InvalidInputError, match="connector owner does not match the lease owner"):
        DispatchRecord.for_lease(LEASE, connector(PID, OWNER_B), CHILD, prompt_channel="stdin")


@given(not_a_lease=st.one_of(OTHER_TYPES, NESTED, st.just(LEASE.fence), st.just(attrs.asdict(LEASE))))
def test_anything_but_an_admitted_lease_is_refused(not_a_lease: object) -> None:
    """A fence, the lease's fields as a mapping, or anything else: the record needs the lease itself."""
    assert not isinstance(not_a_lease, AdmittedLease)
    with pytest.raises(InvalidInputError, match="needs the AdmittedLease"):
        DispatchRecord.for_lease(not_a_lease, CONNECTOR, CHILD, prompt_channel="stdin")  # type: ignore[arg-type]


@pytest.mark.parametrize("channel", ["", "STDIN", "tty", None, 0])
def test_an_unknown_prompt_channel_is_refused(channel: object) -> None:
    with pytest.raises(InvalidInputError, match="prompt channel must be stdin or pty"):
        DispatchRecord.for_lease(LEASE, CONNECTOR, CHILD, prompt_channel=channel)  # type: ignore[arg-type]


@pytest.mark.parametrize(("connector_arg", "child_arg"), [(CHILD, CHILD), (CONNECTOR, CONNECTOR), (None, CHILD)])
def test_the_connector_and_the_child_are_checked_as_given(connector_arg: object, child_arg: object) -> None:
    with pytest.raises(InvalidInputError, match="needs a ConnectorIdentity and a ProcessIdentity"):
        DispatchRecord.for_lease(LEASE, connector_arg, child_arg, prompt_channel="stdin")  # type: ignore[arg-type]
