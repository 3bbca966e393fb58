"""Process evidence with injected /proc readers: identities, capture, observe, group residue."""

from __future__ import annotations

import errno
import re
from collections.abc import Iterator

import attrs
import pytest
from fake_proc import BOOT, NS, OTHER_BOOT, PID, START, FakeProc, os_error, stat_line
from fake_proc import OWNER_A as OWNER
from hypothesis import given
from hypothesis import strategies as st
from planes import UUID_V4

from admission_plane.errors import InvalidInputError, ProcessGoneError, ProcessUnverifiableError
from admission_plane.evidence import (
    BOOT_ID_PATH,
    ConnectorIdentity,
    GroupResidue,
    Observation,
    ProcessIdentity,
    capture,
    format_created_at,
    inspect_process_group,
    observe,
    parse_stat,
    read_boot_id,
    read_process_ids,
)

ZERO_BOOT = "00000000-0000-0000-0000-000000000000"
OTHER_NS = 4026532001
UUID4 = re.compile(UUID_V4)


def identity(**overrides: object) -> ProcessIdentity:
    """The identity that ``FakeProc().add()`` describes, with ``overrides``."""
    fields: dict[str, object] = {
        "boot_id": BOOT,
        "pid": PID,
        "start_time_ticks": START,
        "pid_namespace_inode": NS,
        "ppid": 1,
        "pgrp": PID,
        "session": PID,
    }
    return ProcessIdentity(**(fields | overrides))  # type: ignore[arg-type]


def seed_mapping(**overrides: object) -> dict[str, object]:
    mapping: dict[str, object] = {
        "ownerInstanceId": OWNER,
        "createdAt": "2024-02-29T23:59:59.999Z",
        **identity().to_mapping(),
    }
    return mapping | overrides


# --- ProcessIdentity and ConnectorIdentity validation ---------------------------------------


def test_process_identity_round_trips_through_the_seed_mapping() -> None:
    """A valid seven-key camelCase mapping builds an identity that maps back to the same dict, in seed key order."""
    mapping = identity().to_mapping()
    assert list(mapping) == ["bootId", "pid", "startTimeTicks", "pidNamespaceInode", "ppid", "pgrp", "session"]
    assert ProcessIdentity.from_mapping(mapping) == identity()
    assert ProcessIdentity.from_mapping(mapping).to_mapping() == mapping


def test_process_identity_accepts_every_range_boundary() -> None:
    """The largest pid, namespace inode and start tick count are valid identity values."""
    top = identity(
        pid=2**31 - 1,
        start_time_ticks=str(2**64 - 1),
        pid_namespace_inode=2**32 - 1,
        ppid=2**31 - 1,
        pgrp=1,
        session=2**31 - 1,
    )
    assert top.start_time_ticks == "18446744073709551615"


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("boot_id", BOOT.upper(), "process boot ID is invalid"),
        ("boot_id", ZERO_BOOT, "process boot ID is invalid"),
        ("boot_id", BOOT + "\n", "process boot ID is invalid"),
        ("boot_id", BOOT[:-1], "process boot ID is invalid"),
        ("boot_id", BOOT.replace("-", ""), "process boot ID is invalid"),
        ("pid", True, "process PID must be a positive safe integer"),
        ("pid", 0, "process PID must be a positive safe integer"),
        ("pid", -1, "process PID must be a positive safe integer"),
        ("pid", 2**31, "process PID must be a positive safe integer"),
        ("pid", 12.0, "process PID must be a positive safe integer"),
        ("pid", "12", "process PID must be a positive safe integer"),
        ("start_time_ticks", "0", "process start time is invalid"),
        ("start_time_ticks", "0123", "process start time is invalid"),
        ("start_time_ticks", str(2**64), "process start time is invalid"),
        ("start_time_ticks", "12a", "process start time is invalid"),
        ("start_time_ticks", "12\n", "process start time is invalid"),
        ("start_time_ticks", "\u0661\u0662", "process start time is invalid"),
        ("start_time_ticks", 12, "process start time is invalid"),
        ("start_time_ticks", "9" * 5000, "process start time is invalid"),
        ("pid_namespace_inode", 0, "PID namespace inode must be a positive safe integer"),
        ("pid_namespace_inode", 2**32, "PID namespace inode must be a positive safe integer"),
        ("ppid", False, "process parent PID must be a non-negative safe integer"),
        ("ppid", -1, "process parent PID must be a non-negative safe integer"),
        ("pgrp", -1, "process group must be a non-negative safe integer"),
        ("pgrp", 1.0, "process group must be a non-negative safe integer"),
        ("session", 2**31, "process session must be a non-negative safe integer"),
        ("session", "7", "process session must be a non-negative safe integer"),
    ],
)
def test_process_identity_rejects_invalid_field(field: str, value: object, message: str) -> None:
    """Each out-of-format identity field raises InvalidInputError with the seed's message (bool is not an int)."""
    with pytest.raises(InvalidInputError, match=f"^{re.escape(message)}$"):
        identity(**{field: value})


@pytest.mark.parametrize(
    "mapping",
    [
        {key: value for key, value in identity().to_mapping().items() if key != "session"},
        identity().to_mapping() | {"comm": "sleep"},
        {
            "boot_id": BOOT,
            "pid": PID,
            "start_time_ticks": START,
            "pid_namespace_inode": NS,
            "ppid": 1,
            "pgrp": 1,
            "session": 1,
        },
        list(identity().to_mapping().items()),
        None,
    ],
    ids=["missing-key", "extra-key", "snake-case-keys", "not-a-mapping", "none"],
)
def test_process_identity_from_mapping_requires_exactly_the_seven_seed_keys(mapping: object) -> None:
    """A mapping with a missing, extra or differently spelled key (or no mapping) is rejected."""
    with pytest.raises(InvalidInputError, match=r"^process identity is invalid$"):
        ProcessIdentity.from_mapping(mapping)


def test_connector_identity_round_trips_through_the_flat_nine_key_mapping() -> None:
    """The seed's flat connector shape builds a connector identity and maps back unchanged."""
    connector = ConnectorIdentity.from_mapping(seed_mapping())
    assert connector.process == identity()
    assert connector.owner_instance_id == OWNER
    assert connector.to_mapping() == seed_mapping()
    assert list(connector.to_mapping())[:2] == ["ownerInstanceId", "createdAt"]


@pytest.mark.parametrize(
    "mapping",
    [identity().to_mapping(), seed_mapping() | {"process": identity().to_mapping()}, {"ownerInstanceId": OWNER}],
    ids=["process-keys-only", "extra-key", "owner-only"],
)
def test_connector_identity_from_mapping_requires_exactly_the_nine_seed_keys(mapping: object) -> None:
    """A connector mapping without exactly the nine seed keys is rejected as a whole."""
    with pytest.raises(InvalidInputError, match=r"^connector identity is invalid$"):
        ConnectorIdentity.from_mapping(mapping)


@pytest.mark.parametrize(
    "owner",
    [
        OWNER.upper(),
        "3f2b8c1e-9a4d-1e7f-b6c5-0123456789ab",  # version 1
        "3f2b8c1e-9a4d-4e7f-c6c5-0123456789ab",  # variant bits
        OWNER + "\n",
        "{" + OWNER + "}",
        OWNER.replace("-", ""),
        7,
    ],
)
def test_connector_identity_requires_canonical_lowercase_uuid4_owner(owner: object) -> None:
    """An owner instance id that is not a canonical lowercase UUID v4 raises InvalidInputError."""
    with pytest.raises(InvalidInputError, match="owner instance ID must be a canonical UUID v4"):
        ConnectorIdentity.from_mapping(seed_mapping(ownerInstanceId=owner))


@pytest.mark.parametrize(
    ("created_at", "message"),
    [
        ("2024-01-01T00:00:00.000+00:00", "must be canonical UTC"),
        ("2024-01-01T00:00:00Z", "must be canonical UTC"),
        ("2024-01-01 00:00:00.000Z", "must be canonical UTC"),
        ("2024-01-01T00:00:00.000Z\n", "must be canonical UTC"),
        ("2024-01-01T00:00:00.000000Z", "must be canonical UTC"),
        ("\u0662024-01-01T00:00:00.000Z", "must be canonical UTC"),
        (1704067200000, "must be canonical UTC"),
        ("2024-02-30T00:00:00.000Z", "is invalid"),
        ("2023-02-29T00:00:00.000Z", "is invalid"),
        ("1900-02-29T00:00:00.000Z", "is invalid"),
        ("2024-04-31T00:00:00.000Z", "is invalid"),
        ("2024-13-01T00:00:00.000Z", "is invalid"),
        ("2024-00-10T00:00:00.000Z", "is invalid"),
        ("2024-01-00T00:00:00.000Z", "is invalid"),
        ("2024-01-01T24:00:00.000Z", "is invalid"),
        ("2024-01-01T23:60:00.000Z", "is invalid"),
        ("2024-12-31T23:59:60.000Z", "is invalid"),
    ],
)
def test_connector_identity_rejects_non_canonical_created_at(created_at: object, message: str) -> None:
    """createdAt must be exactly YYYY-MM-DDTHH:MM:SS.mmmZ and a real instant that JavaScript would not roll over."""
    with pytest.raises(InvalidInputError, match=f"connector creation timestamp {message}"):
        ConnectorIdentity.from_mapping(seed_mapping(createdAt=created_at))


@pytest.mark.parametrize(
    "created_at", ["2024-02-29T23:59:59.999Z", "2000-02-29T00:00:00.000Z", "0000-01-01T00:00:00.000Z"]
)
def test_connector_identity_accepts_real_leap_days_and_year_zero(created_at: str) -> None:
    """Leap days of leap years and JavaScript's year 0000 are valid creation timestamps."""
    assert ConnectorIdentity.from_mapping(seed_mapping(createdAt=created_at)).created_at == created_at


def test_connector_identity_reports_owner_before_process_fields() -> None:
    """With both the owner and a process field invalid, the owner's error is the one raised, as in the seed."""
    with pytest.raises(InvalidInputError, match="owner instance ID"):
        ConnectorIdentity.from_mapping(seed_mapping(ownerInstanceId="nope", pid=0))


def test_connector_identity_requires_a_process_identity() -> None:
    """A connector identity built with a raw mapping instead of a ProcessIdentity is rejected."""
    with pytest.raises(InvalidInputError, match="connector identity is invalid"):
        ConnectorIdentity(
            owner_instance_id=OWNER,
            created_at="2024-01-01T00:00:00.000Z",
            process=identity().to_mapping(),  # type: ignore[arg-type]
        )


@pytest.mark.parametrize(
    ("epoch_ms", "expected"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (1_700_000_000_123, "2023-11-14T22:13:20.123Z"),
        (1_709_251_199_999, "2024-02-29T23:59:59.999Z"),
        (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
    ],
)
def test_format_created_at_matches_javascript_to_iso_string(epoch_ms: int, expected: str) -> None:
    """Epoch milliseconds format with a Z suffix and exactly three fraction digits, never +00:00."""
    assert format_created_at(epoch_ms) == expected


@pytest.mark.parametrize("epoch_ms", [-1, True, 1.5, 253_402_300_800_000, 10**30])
def test_format_created_at_rejects_times_outside_the_canonical_range(epoch_ms: object) -> None:
    """Negative, non-integer and post-9999 times have no canonical createdAt."""
    with pytest.raises(InvalidInputError, match="connector creation time"):
        format_created_at(epoch_ms)  # type: ignore[arg-type]


def test_connector_capture_uses_the_given_pid_readers_owner_and_time() -> None:
    """ConnectorIdentity.capture combines the captured process with the given owner id and formatted time."""
    connector = ConnectorIdentity.capture(pid=PID, readers=FakeProc().add(), owner_instance_id=OWNER, now=0)
    assert connector == ConnectorIdentity(
        owner_instance_id=OWNER, created_at="1970-01-01T00:00:00.000Z", process=identity()
    )


def test_connector_capture_mints_a_fresh_uuid4_owner_each_time() -> None:
    """Without an owner id, each capture gets a new canonical lowercase UUID v4."""
    readers = FakeProc().add()
    first = ConnectorIdentity.capture(pid=PID, readers=readers, now=0)
    second = ConnectorIdentity.capture(pid=PID, readers=readers, now=0)
    assert UUID4.fullmatch(first.owner_instance_id)
    assert first.owner_instance_id != second.owner_instance_id


def test_connector_capture_rejects_an_invalid_owner_id() -> None:
    """A caller-supplied owner id is validated like a stored one."""
    with pytest.raises(InvalidInputError, match="canonical UUID v4"):
        ConnectorIdentity.capture(pid=PID, readers=FakeProc().add(), owner_instance_id=OWNER.upper(), now=0)


# --- read_boot_id -------------------------------------------------------------------------


@pytest.mark.parametrize("text", [BOOT, BOOT + "\n", BOOT.upper() + "\n"])
def test_read_boot_id_lowercases_and_strips_one_trailing_newline(text: str) -> None:
    """The kernel's boot id text is lower-cased and loses exactly one trailing newline."""
    assert read_boot_id(FakeProc(boot_id=text)) == BOOT


@pytest.mark.parametrize(
    "text", [BOOT + "\n\n", BOOT + "\r\n", " " + BOOT, ZERO_BOOT + "\n", "", "\n", BOOT[:-2] + "zz"]
)
def test_read_boot_id_rejects_malformed_or_all_zero_text(text: str) -> None:
    """Two newlines, surrounding whitespace, an all-zero id or non-hex text are unverifiable."""
    with pytest.raises(ProcessUnverifiableError, match="boot id is malformed"):
        read_boot_id(FakeProc(boot_id=text))


@pytest.mark.parametrize("code", [errno.ENOENT, errno.EACCES])
def test_read_boot_id_failure_is_unverifiable_even_when_absent(code: int) -> None:
    """A missing boot id file is host evidence missing, not a gone process, so even ENOENT is unverifiable."""
    with pytest.raises(ProcessUnverifiableError) as caught:
        read_boot_id(FakeProc(boot_id=os_error(code, BOOT_ID_PATH)))
    assert not isinstance(caught.value, ProcessGoneError)
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == code


# --- parse_stat ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "comm", ["sleep", "tmux: server", "(a) b (c)", "x) Z 1 2 3 4", "a)", ")", "", "two\nlines", "\udcff bytes"]
)
def test_parse_stat_splits_after_the_last_closing_parenthesis(comm: str) -> None:
    """A comm with spaces, parentheses, a fake field list or a newline does not shift the fields after it."""
    stat = parse_stat(stat_line(PID, comm=comm, state="R", ppid=7, pgrp=8, session=9, start="123456"))
    assert (stat.pid, stat.state, stat.ppid, stat.pgrp, stat.session) == (PID, "R", 7, 8, 9)
    assert stat.start_time_ticks == "123456"


@given(comm=st.text(), start=st.integers(min_value=0, max_value=2**64 - 1))
def test_parse_stat_reads_field_22_for_any_comm(comm: str, start: int) -> None:
    """Whatever the process name, field 22 is the start time, kept as its decimal string."""
    assert parse_stat(stat_line(PID, comm=comm, start=str(start))).start_time_ticks == str(start)


@pytest.mark.parametrize("state", list("RSDZTtWXxKPI"))
def test_parse_stat_accepts_every_documented_process_state(state: str) -> None:
    """Each state letter of proc(5) parses."""
    assert parse_stat(stat_line(PID, state=state)).state == state


def test_parse_stat_accepts_init_with_zero_parent_group_and_session() -> None:
    """pid 1's stat (ppid, pgrp and session 0, start ticks 0) parses; capture validates the values afterwards."""
    stat = parse_stat(stat_line(1, comm="init", ppid=0, pgrp=0, session=0, start="0"))
    assert (stat.ppid, stat.pgrp, stat.session, stat.start_time_ticks) == (0, 0, 0, "0")


GOOD = stat_line(PID).removesuffix("\n")


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n",
        GOOD.replace(" (worker) ", " worker "),  # no comm delimiters
        GOOD.replace("(worker) ", "(worker)"),  # no space after the comm
        GOOD.replace(f"{PID} (", f"0{PID} ("),  # pid with a leading zero
        GOOD.replace(f"{PID} (", "x ("),  # pid not a number
        GOOD.replace(f"{PID} (", "("),  # no pid at all
        GOOD.replace(") S ", ") Q "),  # unknown state
        " ".join(GOOD.split(" ")[:21]),  # stops before field 22
        GOOD.replace(" 110 ", " 1x0 "),  # a non-numeric field
        GOOD.replace(" 110 ", "  110 "),  # a doubled separator
        GOOD.replace(f") S 1 {PID}", f") S -1 {PID}"),  # negative ppid
        GOOD.replace(f" {START} ", f" 0{START} "),  # start time with a leading zero
        GOOD.replace(f" {START} ", f" {2**64 * 10} "),  # start time beyond 20 digits
        GOOD + "\n\n",  # two trailing newlines
        GOOD.replace(f") S 1 {PID} {PID}", f") S 1 {PID} 99999999999"),  # session beyond ten digits
    ],
)
def test_parse_stat_reports_malformed_lines_as_unverifiable(text: str) -> None:
    """Every malformed stat line raises ProcessUnverifiableError rather than guessing a field."""
    with pytest.raises(ProcessUnverifiableError):
        parse_stat(text)


def test_parse_stat_rejects_non_text() -> None:
    """Bytes are not a stat record."""
    with pytest.raises(ProcessUnverifiableError):
        parse_stat(stat_line(PID).encode())


# --- capture ------------------------------------------------------------------------------


def test_capture_reads_boot_id_stat_and_namespace_link() -> None:
    """capture builds the identity from the boot id, stat fields 4/5/6/22 and the pid:[N] link."""
    readers = FakeProc().add(PID, ppid=77, pgrp=78, session=79, ns=OTHER_NS, comm="(a) b (c)")
    assert capture(PID, readers) == identity(ppid=77, pgrp=78, session=79, pid_namespace_inode=OTHER_NS)


@pytest.mark.parametrize("where", ["stats", "links"])
def test_capture_raises_gone_when_stat_or_namespace_is_enoent(where: str) -> None:
    """ENOENT on /proc/<pid>/stat or /proc/<pid>/ns/pid means the process is gone, with the errno kept as cause."""
    readers = FakeProc().add()
    getattr(readers, where)[PID] = os_error(errno.ENOENT)
    with pytest.raises(ProcessGoneError) as caught:
        capture(PID, readers)
    assert isinstance(caught.value.__cause__, OSError)
    assert caught.value.__cause__.errno == errno.ENOENT


@pytest.mark.parametrize("where", ["stats", "links"])
@pytest.mark.parametrize(
    "failure",
    [os_error(errno.EACCES), os_error(errno.ESRCH), FileNotFoundError("no errno"), RuntimeError("reader bug")],
    ids=["EACCES", "ESRCH", "FileNotFoundError-without-errno", "RuntimeError"],
)
def test_capture_raises_unverifiable_for_any_other_read_failure(where: str, failure: BaseException) -> None:
    """Only errno ENOENT proves absence: other errnos, errno-less errors and reader bugs are unverifiable."""
    readers = FakeProc().add()
    getattr(readers, where)[PID] = failure
    with pytest.raises(ProcessUnverifiableError) as caught:
        capture(PID, readers)
    assert caught.value.__cause__ is failure


@pytest.mark.parametrize("link", ["mnt:[4026531840]", "pid:[0]", f"pid:[{2**32}]", "pid:[12]\n", "pid:[ 12]", "12"])
def test_capture_rejects_a_malformed_namespace_link(link: str) -> None:
    """A namespace link other than pid:[N] with N in 1..2^32-1 is unverifiable."""
    readers = FakeProc().add()
    readers.links[PID] = link
    with pytest.raises(ProcessUnverifiableError, match="pid namespace link is malformed"):
        capture(PID, readers)


def test_capture_rejects_a_stat_line_for_another_pid() -> None:
    """A stat file that names another pid is not evidence for the requested one."""
    readers = FakeProc().add()
    readers.stats[PID] = stat_line(PID + 1)
    with pytest.raises(ProcessUnverifiableError, match="another pid"):
        capture(PID, readers)


def test_capture_rejects_a_reader_that_returns_non_text() -> None:
    """A reader returning bytes instead of text is unverifiable."""
    readers = FakeProc().add()
    readers.stats[PID] = stat_line(PID).encode()  # type: ignore[assignment]
    with pytest.raises(ProcessUnverifiableError, match="did not read as text"):
        capture(PID, readers)


def test_capture_accepts_a_container_init_whose_parent_group_and_session_are_outside_its_namespace() -> None:
    """A container's pid 1, whose ppid, pgrp and session read 0, has a valid identity, because the kernel's 0 is real
    there."""
    readers = FakeProc().add(1, ppid=0, pgrp=0, session=0)
    assert capture(1, readers) == identity(pid=1, ppid=0, pgrp=0, session=0)


def test_capture_accepts_a_process_whose_session_leader_is_outside_its_namespace() -> None:
    """A job under a runner that started it in a new pid namespace sees session 0 (how CI runs us)."""
    readers = FakeProc().add(PID, ppid=7, pgrp=PID, session=0)
    assert capture(PID, readers) == identity(ppid=7, session=0)


def test_connector_identity_with_session_zero_round_trips_through_the_seed_mapping() -> None:
    """A captured session-0 connector survives the seed's camelCase mapping unchanged."""
    connector = ConnectorIdentity.capture(pid=PID, readers=FakeProc().add(session=0), owner_instance_id=OWNER, now=0)
    assert connector.process.session == 0
    assert ConnectorIdentity.from_mapping(connector.to_mapping()) == connector


def test_capture_reports_an_unreadable_boot_id_as_unverifiable() -> None:
    """Without a boot id no identity can be captured, whatever the process files say."""
    readers = FakeProc(boot_id=os_error(errno.ENOENT)).add()
    with pytest.raises(ProcessUnverifiableError):
        capture(PID, readers)


@pytest.mark.parametrize("pid", [0, True, 2**31, 12.0, "12"])
def test_capture_rejects_an_invalid_pid_argument(pid: object) -> None:
    """A pid argument outside 1..2^31-1 (or not an int) is a caller error, not evidence."""
    with pytest.raises(InvalidInputError, match="process PID"):
        capture(pid, FakeProc().add())  # type: ignore[arg-type]


# --- observe ------------------------------------------------------------------------------


def test_observe_reports_the_recorded_live_process_as_same() -> None:
    """Same boot id, pid, start ticks and pid namespace is the same process."""
    assert observe(identity(), FakeProc().add()) is Observation.SAME


def test_observe_accepts_a_connector_identity() -> None:
    """A connector identity is observed through its process identity."""
    connector = ConnectorIdentity(owner_instance_id=OWNER, created_at="2024-01-01T00:00:00.000Z", process=identity())
    assert observe(connector, FakeProc().add()) is Observation.SAME


@pytest.mark.parametrize("where", ["stats", "links"])
def test_observe_reports_enoent_on_stat_or_namespace_as_gone(where: str) -> None:
    """ENOENT on /proc/<pid>/stat or /proc/<pid>/ns/pid is gone."""
    readers = FakeProc().add()
    getattr(readers, where)[PID] = os_error(errno.ENOENT)
    assert observe(identity(), readers) is Observation.GONE


def test_observe_reports_a_pid_missing_from_proc_as_gone() -> None:
    """A pid with no /proc entry at all is gone."""
    assert observe(identity(), FakeProc()) is Observation.GONE


@pytest.mark.parametrize("where", ["stats", "links"])
@pytest.mark.parametrize("code", [errno.EACCES, errno.EIO, errno.ESRCH])
def test_observe_reports_other_read_errors_as_unverifiable(where: str, code: int) -> None:
    """A stat or namespace read failing with any errno other than ENOENT is unverifiable."""
    readers = FakeProc().add()
    getattr(readers, where)[PID] = os_error(code)
    assert observe(identity(), readers) is Observation.UNVERIFIABLE


@pytest.mark.parametrize("boot_id", [os_error(errno.ENOENT), os_error(errno.EACCES), "garbage\n"])
def test_observe_reports_an_unreadable_boot_id_as_unverifiable(boot_id: str | OSError) -> None:
    """Without a readable boot id nothing is known, not even a reboot."""
    assert observe(identity(), FakeProc(boot_id=boot_id).add()) is Observation.UNVERIFIABLE


@pytest.mark.parametrize(
    "stat", [stat_line(PID).replace(") S ", ") Q "), "", stat_line(PID + 1), f"{PID} (worker) S 1 2 3\n"]
)
def test_observe_reports_a_malformed_stat_as_unverifiable(stat: str) -> None:
    """A stat line that does not parse, or describes another pid, is unverifiable."""
    readers = FakeProc().add()
    readers.stats[PID] = stat
    assert observe(identity(), readers) is Observation.UNVERIFIABLE


def test_observe_reports_a_malformed_namespace_link_as_unverifiable() -> None:
    """A namespace link that is not pid:[N] is unverifiable."""
    readers = FakeProc().add()
    readers.links[PID] = "pid:[]"
    assert observe(identity(), readers) is Observation.UNVERIFIABLE


def test_observe_reports_same_pid_with_other_start_ticks_as_pid_reused() -> None:
    """A live process at the recorded pid that started at another tick is a reused pid."""
    assert observe(identity(), FakeProc().add(start="999999")) is Observation.PID_REUSED


def test_observe_reports_same_pid_in_another_namespace_as_pid_reused() -> None:
    """A live process at the recorded pid in another pid namespace is not the recorded process."""
    assert observe(identity(), FakeProc().add(ns=OTHER_NS)) is Observation.PID_REUSED


def test_observe_reports_a_reboot_as_gone_without_reading_the_pid() -> None:
    """Another boot id means this host rebooted: the process is gone even if its pid and ticks recur."""
    readers = FakeProc(boot_id=OTHER_BOOT).add()
    assert observe(identity(), readers) is Observation.GONE
    assert readers.reads == [BOOT_ID_PATH]


def test_observe_reports_a_zombie_as_same() -> None:
    """A zombie keeps its start time and counts as alive: the conservative answer."""
    assert observe(identity(), FakeProc().add(state="Z")) is Observation.SAME


def test_observe_reports_reparented_live_process_as_same() -> None:
    """A live process whose parent died, so that its ppid changed, is still the same process."""
    assert observe(identity(ppid=1234), FakeProc().add(ppid=1)) is Observation.SAME


def test_observe_reports_a_process_that_changed_its_session_as_same() -> None:
    """pgrp and session are not identity: a process that called setsid is still the same process."""
    assert observe(identity(), FakeProc().add(pgrp=5000, session=5000)) is Observation.SAME


def test_observe_rejects_a_mapping_instead_of_an_identity() -> None:
    """observe takes validated identities, not raw mappings."""
    with pytest.raises(InvalidInputError):
        observe(identity().to_mapping(), FakeProc().add())  # type: ignore[arg-type]


# --- inspect_process_group ----------------------------------------------------------------


def group_member(readers: FakeProc, pid: int, **stat: object) -> FakeProc:
    """Add a process in the child's process group and session."""
    return readers.add(pid, pgrp=PID, session=PID, **stat)


def test_group_is_present_when_a_descendant_shares_group_session_boot_and_namespace() -> None:
    """A listed process with the child's pgrp, session, boot id and namespace is residue."""
    readers = group_member(FakeProc().add(100, pgrp=100, session=100), 5000, ppid=PID)
    assert inspect_process_group(identity(), [100, 5000], readers) is GroupResidue.PRESENT


def test_group_is_present_when_the_child_itself_is_listed() -> None:
    """The child is a member of its own group."""
    assert inspect_process_group(identity(), [PID], FakeProc().add()) is GroupResidue.PRESENT


def test_group_is_present_for_a_zombie_member() -> None:
    """A zombie still holds its group and session, so it counts as residue."""
    assert inspect_process_group(identity(), [PID], FakeProc().add(state="Z")) is GroupResidue.PRESENT


def test_group_is_empty_when_no_listed_process_matches() -> None:
    """No listed process in the child's group and session is an empty group."""
    readers = FakeProc().add(100, pgrp=100, session=100).add(101, pgrp=PID, session=101)
    assert inspect_process_group(identity(), [100, 101], readers) is GroupResidue.EMPTY


def test_group_is_empty_for_an_empty_pid_list_without_reading_anything() -> None:
    """An empty inventory proves an empty group, even if the boot id could not be read."""
    readers = FakeProc(boot_id=os_error(errno.EACCES))
    assert inspect_process_group(identity(), [], readers) is GroupResidue.EMPTY
    assert readers.reads == []


def test_group_skips_listed_pids_that_exited() -> None:
    """ENOENT for a listed pid means it exited between listing and reading: skipped, not unverifiable."""
    readers = FakeProc().add(100, pgrp=100, session=100)
    readers.stats[200] = os_error(errno.ENOENT)
    group_member(readers, 300).links[300] = os_error(errno.ENOENT)
    assert inspect_process_group(identity(), [100, 200, 300], readers) is GroupResidue.EMPTY


@pytest.mark.parametrize("where", ["stats", "links"])
def test_group_is_unverifiable_when_a_listed_pid_cannot_be_read_and_none_matched(where: str) -> None:
    """A non-ENOENT failure on a possible member, with no match elsewhere, is unverifiable."""
    readers = group_member(FakeProc().add(100, pgrp=100, session=100), 300)
    getattr(readers, where)[300] = os_error(errno.EACCES)
    assert inspect_process_group(identity(), [100, 300], readers) is GroupResidue.UNVERIFIABLE


def test_group_is_present_even_when_another_pid_cannot_be_read() -> None:
    """One verified member proves residue, whatever other pids say."""
    readers = group_member(FakeProc(), 300)
    readers.stats[200] = os_error(errno.EACCES)
    assert inspect_process_group(identity(), [200, 300], readers) is GroupResidue.PRESENT


def test_group_reads_namespace_links_only_of_processes_in_the_group() -> None:
    """Another user's process (EACCES on its namespace link) outside the group cannot make the answer unverifiable."""
    readers = FakeProc().add(100, pgrp=100, session=100)
    readers.links[100] = os_error(errno.EACCES)
    assert inspect_process_group(identity(), [100], readers) is GroupResidue.EMPTY
    assert "/proc/100/ns/pid" not in readers.reads


def test_group_ignores_a_process_with_the_same_group_in_another_namespace() -> None:
    """pgrp and session numbers from another pid namespace are other processes."""
    readers = group_member(FakeProc(), 300, ns=OTHER_NS)
    assert inspect_process_group(identity(), [300], readers) is GroupResidue.EMPTY


def test_group_with_a_leader_outside_the_namespace_is_unverifiable_without_reading() -> None:
    """pgrp 0: members on the other side of the namespace are invisible, so the group can never be proved empty."""
    readers = FakeProc().add(300, pgrp=0, session=0)
    assert inspect_process_group(identity(pgrp=0, session=0), [], readers) is GroupResidue.UNVERIFIABLE
    assert inspect_process_group(identity(pgrp=0, session=0), [300], readers) is GroupResidue.UNVERIFIABLE
    assert readers.reads == []


def test_group_in_a_session_led_from_outside_the_namespace_is_still_inspected() -> None:
    """Session 0 with a visible pgrp is an ordinary group: matched on pgrp and session 0, empty when none is left."""
    readers = FakeProc().add(300, pgrp=PID, session=0).add(301, pgrp=301, session=0)
    assert inspect_process_group(identity(session=0), [300, 301], readers) is GroupResidue.PRESENT
    assert inspect_process_group(identity(session=0), [301], readers) is GroupResidue.EMPTY


def test_group_ignores_a_process_with_the_same_group_but_another_session() -> None:
    """A matching pgrp alone is not membership; the session must match too."""
    readers = FakeProc().add(300, pgrp=PID, session=301)
    assert inspect_process_group(identity(), [300], readers) is GroupResidue.EMPTY


def test_group_is_empty_after_a_reboot() -> None:
    """A process group cannot outlive a reboot: another boot id is empty without reading any pid."""
    readers = group_member(FakeProc(boot_id=OTHER_BOOT), 300)
    assert inspect_process_group(identity(), [300], readers) is GroupResidue.EMPTY
    assert readers.reads == [BOOT_ID_PATH]


def test_group_is_unverifiable_when_the_boot_id_cannot_be_read() -> None:
    """With pids to inspect, an unreadable boot id leaves the residue unverifiable."""
    readers = group_member(FakeProc(boot_id=os_error(errno.EACCES)), 300)
    assert inspect_process_group(identity(), [300], readers) is GroupResidue.UNVERIFIABLE


def test_group_reading_init_and_kernel_threads_is_not_unverifiable() -> None:
    """pid 1 and kernel threads (ppid, pgrp, session 0) are readable non-members, not failures."""
    readers = FakeProc().add(1, ppid=0, pgrp=0, session=0).add(2, comm="kthreadd", ppid=0, pgrp=0, session=0)
    assert inspect_process_group(identity(), [1, 2], readers) is GroupResidue.EMPTY


@pytest.mark.parametrize("bad", [0, -1, True, 2**31, 3.0, "300"])
def test_group_is_unverifiable_when_the_list_holds_a_non_pid(bad: object) -> None:
    """A listed value that is not a pid cannot be inspected, so an unmatched scan is unverifiable."""
    readers = FakeProc().add(100, pgrp=100, session=100)
    assert inspect_process_group(identity(), [100, bad], readers) is GroupResidue.UNVERIFIABLE  # type: ignore[list-item]


def test_group_is_unverifiable_for_a_non_iterable_pid_list() -> None:
    """A pid list that cannot be iterated is no inventory."""
    assert inspect_process_group(identity(), None, FakeProc()) is GroupResidue.UNVERIFIABLE  # type: ignore[arg-type]


# --- read_process_ids ---------------------------------------------------------------------


def test_read_process_ids_returns_sorted_unique_pids() -> None:
    """The inventory is sorted and de-duplicated; the pid limit 2^31-1 is accepted."""
    readers = FakeProc(pids=[30, 2**31 - 1, 1, 30, 7])
    assert read_process_ids(readers) == (1, 7, 30, 2**31 - 1)


def test_read_process_ids_accepts_an_empty_inventory_and_any_iterable() -> None:
    """An empty list is a valid (empty) inventory; a generator or set of pids is accepted too."""
    assert read_process_ids(FakeProc(pids=[])) == ()
    assert read_process_ids(FakeProc(pids=(pid for pid in (3, 2)))) == (2, 3)
    assert read_process_ids(FakeProc(pids={5})) == (5,)


def test_read_process_ids_is_none_without_a_list_process_ids_reader() -> None:
    """Readers with no callable list_process_ids give no inventory."""

    @attrs.define
    class NoInventory:
        list_process_ids: object = None

    assert read_process_ids(object()) is None
    assert read_process_ids(None) is None
    assert read_process_ids(NoInventory()) is None


@pytest.mark.parametrize("failure", [os_error(errno.EACCES), RuntimeError("boom")])
def test_read_process_ids_is_none_when_the_reader_raises(failure: BaseException) -> None:
    """A listing that raises gives no inventory."""
    assert read_process_ids(FakeProc(pids=failure)) is None


def test_read_process_ids_is_none_when_iteration_fails_midway() -> None:
    """A listing that fails while being iterated gives no inventory, not a partial one."""

    def broken() -> Iterator[int]:
        yield 1
        raise os_error(errno.EIO)

    assert read_process_ids(FakeProc(pids=broken())) is None


@attrs.frozen
class Listing:
    """Readers whose only ability is to list whatever ``value`` is."""

    value: object

    def list_process_ids(self) -> object:
        return self.value


@pytest.mark.parametrize("value", [None, 5, 3.5])
def test_read_process_ids_is_none_for_a_non_iterable(value: object) -> None:
    """A listing that returns something not iterable gives no inventory."""
    assert read_process_ids(Listing(value)) is None


@pytest.mark.parametrize("bad", [True, False, 0, -1, 2**31, 3.0, "5", None])
def test_read_process_ids_is_none_when_any_entry_is_not_a_pid(bad: object) -> None:
    """One bool, 0, negative, 2^31, float, string or None entry voids the whole inventory."""
    assert read_process_ids(FakeProc(pids=[1, bad, 3])) is None
