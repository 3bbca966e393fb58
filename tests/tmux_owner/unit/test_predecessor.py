"""The SIGABRT predecessor a replacement managed owner may resume from, and the no-follow root reader it reads with."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import pytest
from gates import require
from tmux_support import SESSION, root_of

from tmux_owner import _predecessor
from tmux_owner._errors import TmuxOwnerError
from tmux_owner._generations import GenerationRecord, OwnerGenerationBaseline
from tmux_owner._predecessor import ManagedOwnerPredecessorEvidence, resolve_managed_owner_predecessor
from tmux_owner._recovery_fs import RecoveryFsRoot, RecoveryRead

GENERATION = "prior"
TOKEN = "tok-1.a_b"
COMMAND = ["gjc", "--resume"]
LINUX = os.uname().sysname == "Linux"

BASELINE = OwnerGenerationBaseline.current(
    GenerationRecord(generation=GENERATION, session_id=SESSION, published_at="2026-01-01T00:00:00.000Z")
)


def made_root(state_dir: Path) -> Path:
    """The lifecycle directory of the prior generation, created if missing."""
    root = root_of(state_dir)
    root.mkdir(parents=True, exist_ok=True)
    return root


def binding(**overrides: Any) -> dict[str, Any]:
    value = {
        "schema_version": 2,
        "generation": GENERATION,
        "session_id": SESSION,
        "run_id": "run-1",
        "endpoint_incarnation": "incarnation-1",
        "child_token": TOKEN,
        "command": COMMAND,
        "command_sha256": hashlib.sha256(json.dumps(COMMAND, separators=(",", ":")).encode()).hexdigest(),
        "supervisor_pid": 100,
        "supervisor_start_time": "5000",
        "created_at": "2026-01-01T00:00:00.000Z",
    }
    return value | overrides


def receipt(**overrides: Any) -> dict[str, Any]:
    bound = binding()
    value = {
        "schema_version": 2,
        "generation": GENERATION,
        "session_id": SESSION,
        "run_id": bound["run_id"],
        "endpoint_incarnation": bound["endpoint_incarnation"],
        "child_token": TOKEN,
        "command_sha256": bound["command_sha256"],
        "supervisor_pid": 100,
        "supervisor_start_time": "5000",
        "child_pid": 101,
        "child_start_time": "5001",
        "received_at": "2026-01-01T00:00:01.000Z",
        "exit_code": None,
        "signal": "SIGABRT",
        "signal_number": 6,
    }
    return value | overrides


def line(value: Any) -> str:
    return json.dumps(value, separators=(",", ":")) + "\n"


def write_evidence(state_dir: Path, binding_value: Any = None, receipt_value: Any = None, token: str = TOKEN) -> Path:
    root = made_root(state_dir)
    (root / f"child-{token}.binding.json").write_text(line(binding() if binding_value is None else binding_value))
    (root / f"sigabrt-{token}.receipt.json").write_text(line(receipt() if receipt_value is None else receipt_value))
    return root


def resolve(state_dir: Path) -> ManagedOwnerPredecessorEvidence | None:
    return resolve_managed_owner_predecessor(state_dir, SESSION, BASELINE)


def assert_refused(state_dir: Path, code: str) -> None:
    with pytest.raises(TmuxOwnerError) as raised:
        resolve(state_dir)
    assert str(raised.value) == f"managed_owner_replacement_evidence_{code}"


@pytest.fixture(autouse=True)
def linux_only() -> None:
    require(LINUX, "the recovery root reader is Linux-only")


def test_an_exact_sigabrt_pair_names_the_predecessor(tmp_path: Path) -> None:
    """A matching binding and SIGABRT receipt name the predecessor's generation, session, run, incarnation and token."""
    write_evidence(tmp_path)
    assert resolve(tmp_path) == ManagedOwnerPredecessorEvidence(
        generation=GENERATION,
        session_id=SESSION,
        run_id="run-1",
        incarnation="incarnation-1",
        predecessor_token=TOKEN,
    )


def test_extra_keys_in_the_evidence_are_tolerated(tmp_path: Path) -> None:
    """Evidence records may carry keys beyond the ones that are checked."""
    write_evidence(tmp_path, binding(note="x"), receipt(extra=[1, 2]))
    assert resolve(tmp_path) is not None


def test_an_absent_baseline_has_no_predecessor(tmp_path: Path) -> None:
    """With no prior generation there is no predecessor to resume."""
    assert resolve_managed_owner_predecessor(tmp_path, SESSION, OwnerGenerationBaseline.absent()) is None


def test_an_unlistable_root_makes_the_evidence_unavailable(tmp_path: Path) -> None:
    """A prior generation whose lifecycle directory cannot be listed makes the evidence unavailable, not absent."""
    assert_refused(tmp_path, "unavailable")


def test_a_root_without_evidence_entries_has_no_predecessor(tmp_path: Path) -> None:
    """A lifecycle directory without any child-* or sigabrt-* entry has no predecessor."""
    (made_root(tmp_path) / "generation.json").write_text("{}\n")
    assert resolve(tmp_path) is None


@pytest.mark.parametrize("stray", ["child-x.binding.json.tmp", "child-", "sigabrt-x.receipt", "sigabrt-.receipt.json"])
def test_a_stray_evidence_like_entry_is_untrusted(tmp_path: Path, stray: str) -> None:
    """An entry named child-* or sigabrt-* that is not exactly an evidence file name makes the evidence untrusted."""
    root = write_evidence(tmp_path)
    (root / stray).write_text("x\n")
    assert_refused(tmp_path, "untrusted")


def test_bindings_without_a_receipt_are_ambiguous(tmp_path: Path) -> None:
    """A binding without any receipt makes the evidence ambiguous, not absent."""
    (made_root(tmp_path) / f"child-{TOKEN}.binding.json").write_text(line(binding()))
    assert_refused(tmp_path, "ambiguous")


def test_two_receipts_or_an_unbound_receipt_are_ambiguous(tmp_path: Path) -> None:
    """A second receipt, or a receipt without a binding of its token, makes the evidence ambiguous."""
    root = write_evidence(tmp_path)
    (root / "sigabrt-other.receipt.json").write_text(line(receipt(child_token="other")))
    assert_refused(tmp_path, "ambiguous")
    other = tmp_path / "other"
    (made_root(other) / "sigabrt-lonely.receipt.json").write_text(line(receipt()))
    with pytest.raises(TmuxOwnerError, match=r"_ambiguous$"):
        resolve(other)


def test_a_token_outside_the_safe_alphabet_is_untrusted(tmp_path: Path) -> None:
    """A matched token outside [A-Za-z0-9._-]+ makes the evidence untrusted."""
    write_evidence(tmp_path, binding(child_token="a b"), receipt(child_token="a b"), token="a b")
    assert_refused(tmp_path, "untrusted")


@pytest.mark.parametrize(
    "content",
    [line(binding()).rstrip("\n"), line(binding()) + "\n", "{\n}\n", ""],
    ids=["no-newline", "two", "split", "empty"],
)
def test_evidence_that_is_not_exactly_one_line_is_untrusted(tmp_path: Path, content: str) -> None:
    """An evidence file that is not exactly one line ending in one newline is untrusted."""
    root = write_evidence(tmp_path)
    (root / f"child-{TOKEN}.binding.json").write_text(content)
    assert_refused(tmp_path, "untrusted")


def test_invalid_evidence_json_raises_a_parse_error(tmp_path: Path) -> None:
    """Malformed JSON in an evidence file propagates as a JSON ValueError, not as an evidence code."""
    root = write_evidence(tmp_path)
    (root / f"sigabrt-{TOKEN}.receipt.json").write_text("{not json\n")
    with pytest.raises(ValueError) as raised:
        resolve(tmp_path)
    assert not isinstance(raised.value, TmuxOwnerError)


def test_evidence_that_cannot_be_read_safely_is_unavailable(tmp_path: Path) -> None:
    """A symlinked, hard-linked or oversized evidence file fails its first read and makes the evidence unavailable."""
    root = write_evidence(tmp_path)
    target = root / f"child-{TOKEN}.binding.json"
    planted = tmp_path / "planted.json"
    planted.write_text(line(binding()))
    target.unlink()
    target.symlink_to(planted)
    assert_refused(tmp_path, "unavailable")
    target.unlink()
    os.link(planted, target)
    assert_refused(tmp_path, "unavailable")
    target.unlink()
    target.write_text(line(binding(padding="x" * (64 * 1024))))
    assert_refused(tmp_path, "unavailable")


def test_evidence_that_changes_between_reads_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Evidence whose second read returns other bytes is refused as changed."""
    write_evidence(tmp_path)
    real_read = RecoveryFsRoot.read
    reads: list[str] = []

    def drifting_read(self: RecoveryFsRoot, name: str, max_bytes: int = 1 << 20) -> RecoveryRead:
        result = real_read(self, name, max_bytes)
        reads.append(name)
        if reads.count(name) == 2 and result.data is not None:
            return RecoveryRead(ok=True, identity=result.identity, data=result.data.replace(b"run-1", b"run-2"))
        return result

    monkeypatch.setattr(_predecessor.RecoveryFsRoot, "read", drifting_read)
    assert_refused(tmp_path, "changed")


@pytest.mark.parametrize(
    ("which", "overrides"),
    [
        ("binding", {"schema_version": 1}),
        ("binding", {"generation": "other"}),
        ("binding", {"session_id": "other"}),
        ("binding", {"run_id": ""}),
        ("binding", {"endpoint_incarnation": 7}),
        ("binding", {"command": []}),
        ("binding", {"command": ["gjc", ""]}),
        ("binding", {"command_sha256": "0" * 64}),
        ("binding", {"supervisor_pid": 0}),
        ("binding", {"supervisor_pid": True}),
        ("binding", {"supervisor_start_time": 5000}),
        ("binding", {"created_at": None}),
        ("receipt", {"schema_version": 2.5}),
        ("receipt", {"run_id": "run-2"}),
        ("receipt", {"endpoint_incarnation": "incarnation-2"}),
        ("receipt", {"command_sha256": "x"}),
        ("receipt", {"supervisor_pid": 101}),
        ("receipt", {"supervisor_start_time": "5001"}),
        ("receipt", {"child_pid": -1}),
        ("receipt", {"child_pid": True}),
        ("receipt", {"child_start_time": 1}),
        ("receipt", {"received_at": None}),
        ("receipt", {"exit_code": "1"}),
        ("receipt", {"signal": "SIGKILL"}),
        ("receipt", {"signal_number": 9}),
        ("receipt", {"signal_number": True}),
    ],
)
def test_any_mismatch_between_binding_and_receipt_is_untrusted(
    tmp_path: Path, which: str, overrides: dict[str, Any]
) -> None:
    """Any binding or receipt field that does not match exactly, booleans for numbers included, makes the evidence
    untrusted.
    """
    if which == "binding":
        write_evidence(tmp_path, binding_value=binding(**overrides))
    else:
        write_evidence(tmp_path, receipt_value=receipt(**overrides))
    assert_refused(tmp_path, "untrusted")


def test_a_receipt_without_exit_code_is_untrusted_but_an_integer_one_is_fine(tmp_path: Path) -> None:
    """A receipt must carry exit_code, either null or an integer."""
    without = receipt()
    del without["exit_code"]
    write_evidence(tmp_path, receipt_value=without)
    assert_refused(tmp_path, "untrusted")
    write_evidence(tmp_path, receipt_value=receipt(exit_code=134))
    assert resolve(tmp_path) is not None


def test_a_symlinked_component_in_the_root_path_is_an_untrusted_root(tmp_path: Path) -> None:
    """A lifecycle path through a symlinked directory raises untrusted_root from the root opener."""
    real = tmp_path / "real"
    write_evidence(real)
    (tmp_path / "linked").symlink_to(real)
    with pytest.raises(TmuxOwnerError, match=r"^untrusted_root$"):
        resolve(tmp_path / "linked")


def test_the_root_reader_refuses_bad_paths_and_odd_files(tmp_path: Path) -> None:
    """The root reader refuses bad names, missing files, symlinks, non-regular files, hard links and oversized files,
    each with its code, and proves a good file's identity.
    """
    (tmp_path / "file").write_text("data\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "inner").write_text("inner\n")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    (tmp_path / "dirlink").symlink_to(tmp_path / "dir")
    os.mkfifo(tmp_path / "fifo")
    os.link(tmp_path / "dir" / "inner", tmp_path / "twin")
    with RecoveryFsRoot.open(tmp_path) as root:
        for bad in ["", "/file", "../file", "./file", "dir/../file", "a\0b", "dir//inner"]:
            assert root.read(bad).code == "invalid_path", bad
        assert root.read("missing").code == "not_found"
        assert root.read("link").code == "reparse_point"
        assert root.read("dirlink/inner").code == "reparse_point"
        assert root.read("dir").code == "not_regular_file"
        assert root.read("fifo").code == "not_regular_file"
        assert root.read("twin").code == "hard_link"
        assert root.read("file", 4).code == "content_too_large"
        result = root.read("file")
    assert result.ok
    assert result.data == b"data\n"
    info = (tmp_path / "file").stat()
    assert result.identity is not None
    assert (result.identity.dev, result.identity.ino, result.identity.size) == (
        str(info.st_dev),
        str(info.st_ino),
        "5",
    )
    assert result.identity.sha256 == hashlib.sha256(b"data\n").hexdigest()


def test_the_root_descriptor_survives_renaming_the_path(tmp_path: Path) -> None:
    """Reads go through the held root descriptor, so renaming and replacing the path cannot redirect them, and a closed
    root refuses reads.
    """
    original = tmp_path / "root"
    original.mkdir()
    (original / "evidence").write_text("original\n")
    root = RecoveryFsRoot.open(original)
    try:
        original.rename(tmp_path / "moved")
        original.mkdir()
        (original / "evidence").write_text("impostor\n")
        assert root.read("evidence").data == b"original\n"
    finally:
        root.close()
    assert root.read("evidence").code == "closed"


def test_the_root_opener_requires_an_absolute_directory(tmp_path: Path) -> None:
    """The root opener refuses a relative path as invalid_path and a file or missing component as untrusted_root."""
    with pytest.raises(TmuxOwnerError, match=r"^invalid_path$"):
        RecoveryFsRoot.open("relative/path")
    (tmp_path / "file").write_text("x")
    for path in (tmp_path / "file", tmp_path / "missing"):
        with pytest.raises(TmuxOwnerError, match=r"^untrusted_root$"):
            RecoveryFsRoot.open(path)
