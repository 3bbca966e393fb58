"""Every command and example of the README runs, so the README cannot rot.

Each fenced ``sh`` block runs in ``bash -euo pipefail`` in a fresh directory (outside the
source tree, with ``alembic.ini`` and ``migrations/`` linked in, as in a checkout), with the
virtual environment's ``bin`` first on ``PATH``, a private state directory and no keys in
the environment. Each fenced ``python`` block runs as a script the same way.

Not run here: ``make demo``, ``make test`` and ``make bench``. CI runs ``make test`` itself
(``.ci/run``); ``make demo`` is the same ``admission-plane demo`` that ``tests/end_to_end/test_demo.py``
and the command-line block below run in shortened form; ``make bench`` takes minutes and is
its own job. The PostgreSQL block runs against a fresh database from the
``postgres_url`` fixture, substituted for the README's example URL.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[2]
README = REPOSITORY / "README.md"
POSTGRES_EXAMPLE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/admission"
MAKE_TARGETS_RUN_ELSEWHERE = {"make demo", "make test", "make bench"}
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    """The README's fenced blocks of ``language``, in order."""
    return [body for lang, body in FENCE.findall(README.read_text(encoding="utf-8")) if lang == language]


def is_make_only(block: str) -> bool:
    """Whether every command of ``block`` is a ``make`` target."""
    return all(line.strip().startswith("make ") for line in block.splitlines() if line.strip())


SHELL_BLOCKS = [block for block in blocks("sh") if not is_make_only(block)]
SQLITE_SHELL_BLOCKS = [block for block in SHELL_BLOCKS if POSTGRES_EXAMPLE_URL not in block]
POSTGRES_SHELL_BLOCKS = [block for block in SHELL_BLOCKS if POSTGRES_EXAMPLE_URL in block]
PYTHON_BLOCKS = blocks("python")


def block_id(block: str) -> str:
    """The block's first line, as a test id."""
    return block.strip().splitlines()[0][:60]


@pytest.fixture
def checkout_like(tmp_path: Path) -> Path:
    """A fresh directory that looks like a checkout to Alembic (``alembic.ini`` and ``migrations/`` linked)."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "alembic.ini").symlink_to(REPOSITORY / "alembic.ini")
    (workdir / "migrations").symlink_to(REPOSITORY / "migrations")
    return workdir


def environment(tmp_path: Path) -> dict[str, str]:
    """The venv's ``bin`` first on PATH, a private state directory, and no admission-plane variables."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("ADMISSION_PLANE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    return env


def run_shell(block: str, workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run ``block`` with ``bash -euo pipefail``, echoing each command (``-x``) for the failure message."""
    return subprocess.run(
        ["bash", "-euxo", "pipefail", "-c", block],
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def test_readme_has_the_two_set_up_commands_and_only_known_make_targets() -> None:
    """The README starts users with exactly ``make demo`` and ``make test``; other make lines are known targets."""
    make_lines = {
        line.strip() for block in blocks("sh") if is_make_only(block) for line in block.splitlines() if line.strip()
    }
    assert make_lines <= MAKE_TARGETS_RUN_ELSEWHERE
    assert blocks("sh")[0].split() == ["make", "demo", "make", "test"]


@pytest.mark.slow
@pytest.mark.parametrize("block", SQLITE_SHELL_BLOCKS, ids=block_id)
def test_readme_shell_block_runs(block: str, checkout_like: Path, tmp_path: Path) -> None:
    """The shell block exits 0 from a fresh directory and never prints a key."""
    result = run_shell(block, checkout_like, environment(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    key_file = checkout_like / "my-keys" / "keys"
    if key_file.exists():
        for line in key_file.read_text().splitlines():
            assert line.split("=", 1)[1] not in result.stdout + result.stderr


@pytest.mark.postgres
@pytest.mark.parametrize("block", POSTGRES_SHELL_BLOCKS, ids=block_id)
def test_readme_postgres_block_runs(block: str, postgres_url: str, checkout_like: Path, tmp_path: Path) -> None:
    """The PostgreSQL block runs against a fresh database substituted for the README's example URL."""
    result = run_shell(block.replace(POSTGRES_EXAMPLE_URL, postgres_url), checkout_like, environment(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr


#: ``print(...)  # what it prints`` in a Python block: the comment is the output the README promises.
PROMISED_OUTPUT = re.compile(r"^\s*print\(.*\)  # (.+?)(?: \.\.\.)?$", re.MULTILINE)


def promised_outputs(block: str) -> list[str]:
    """What ``block`` says its ``print`` calls print (a trailing `` ...`` means "and more")."""
    return PROMISED_OUTPUT.findall(block)


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=block_id)
def test_readme_python_example_runs(block: str, tmp_path: Path) -> None:
    """The library example runs as a script and prints what its comments promise."""
    script = tmp_path / "example.py"
    script.write_text(block, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=environment(tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    promised = promised_outputs(block)
    assert promised, "every Python example shows what it prints"
    for output in promised:
        assert output in result.stdout, (output, result.stdout)


def test_readme_covers_every_command_line_command() -> None:
    """Each command of ``admission-plane`` appears in a shell block that the tests run."""
    text = "\n".join(SHELL_BLOCKS)
    for command in (
        "db upgrade",
        "db downgrade",
        "db current",
        "db check",
        "keys init",
        "status",
        "events",
        "reap",
        "release",
        "policy set",
        "policy show",
        "policy history",
        "pause",
        "resume",
        "demo",
    ):
        assert f"admission-plane {command}" in text, command
