"""The distribution ships every package of the source tree."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _declared() -> set[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return set(config["tool"]["setuptools"]["packages"])


def _on_disk() -> set[str]:
    found = set()
    for top in ("admission_plane", "tmux_owner"):
        for init in (ROOT / top).rglob("__init__.py"):
            found.add(".".join(init.parent.relative_to(ROOT).parts))
    for init in (ROOT / "migrations").rglob("*.py"):
        if init.parent.name == "versions":
            found.add("admission_plane.migrations.versions")
    found.add("admission_plane.migrations")
    return found


def test_every_package_of_the_tree_is_declared_for_the_wheel() -> None:
    """pyproject.toml lists exactly the packages of the tree, so a built wheel misses none of them."""
    assert _declared() == _on_disk()
