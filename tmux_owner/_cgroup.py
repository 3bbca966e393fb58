"""Cgroup classification: is a process confined to a scope we may own, or to a service?

Only public cgroup path metadata is read; anything malformed on Linux fails closed.
"""

from __future__ import annotations

import re
from typing import Any, Literal, Self, get_args

import attrs

from ._errors import InvalidRecordError
from ._jscompat import js_trim
from ._validators import has_only_keys, is_record, one_of, validate_optional_str

CgroupClassification = Literal["not_applicable", "safe", "unsafe_service", "unverifiable"]
CLASSIFICATIONS: frozenset[str] = frozenset(get_args(CgroupClassification))

_USER_MANAGER = re.compile(r"user@[0-9]+\.service")
_OWNED_SCOPE = re.compile(r"(?:^|/)(?:user|session|app|init|gjc)[^/]*\.scope(?:/|\Z)")
_VTE_SCOPE = re.compile(
    r"/user\.slice/user-([0-9]+)\.slice/user@\1\.service(?:/[^/]+)*/vte-spawn-[A-Za-z0-9_.-]+\.scope"
)


@attrs.frozen
class CgroupInfo:
    """The classification of one process's cgroup membership, with the scope or the reason."""

    classification: CgroupClassification = attrs.field(validator=one_of(CLASSIFICATIONS))
    scope: str | None = attrs.field(default=None, validator=validate_optional_str)
    diagnostic: str | None = attrs.field(default=None, validator=validate_optional_str)

    @classmethod
    def from_json(cls, value: object) -> Self:
        """Build from a parsed JSON object; ``InvalidRecordError`` for any other shape."""
        if not is_record(value) or not has_only_keys(value, ("classification", "scope", "diagnostic")):
            raise InvalidRecordError("CgroupInfo")
        if value.get("classification") not in CLASSIFICATIONS:
            raise InvalidRecordError("CgroupInfo.classification")
        for key in ("scope", "diagnostic"):
            if key in value and not isinstance(value[key], str):
                raise InvalidRecordError(f"CgroupInfo.{key}")
        return cls(value["classification"], value.get("scope"), value.get("diagnostic"))

    def to_json(self) -> dict[str, Any]:
        """The seed's object: ``classification``, then ``scope`` and ``diagnostic`` when present."""
        record: dict[str, Any] = {"classification": self.classification}
        if self.scope is not None:
            record["scope"] = self.scope
        if self.diagnostic is not None:
            record["diagnostic"] = self.diagnostic
        return record


NOT_APPLICABLE = CgroupInfo("not_applicable")


def _unverifiable(diagnostic: str) -> CgroupInfo:
    return CgroupInfo("unverifiable", diagnostic=diagnostic)


def _is_unrelated_service(component: str) -> bool:
    return component.endswith(".service") and _USER_MANAGER.fullmatch(component) is None


def classify_cgroup(platform: str, cgroup_text: str | None) -> CgroupInfo:
    """Classify the text of a ``/proc/<pid>/cgroup`` file (the seed's ``classifyCgroup``).

    Non-Linux platforms are ``not_applicable``. On Linux, a service anywhere wins over
    every scope, and anything that proves neither a scope nor the root is unverifiable.
    """
    if platform != "linux":
        return NOT_APPLICABLE
    # Beyond the seed: anything but text (a caller outside the type checker) reads as no metadata.
    text = js_trim(cgroup_text) if isinstance(cgroup_text, str) else ""
    if not text:
        return _unverifiable("cgroup_metadata_missing")
    paths = [path for path in (js_trim(line.split(":")[-1]) for line in text.split("\n")) if path]
    if not paths or any(not path.startswith("/") for path in paths):
        return _unverifiable("cgroup_metadata_malformed")
    if any(_is_unrelated_service(component) for path in paths for component in path.split("/")):
        return CgroupInfo("unsafe_service", diagnostic="service_cgroup_inheritance")
    scope = next((path for path in paths if _OWNED_SCOPE.search(path)), None)
    if scope is None:
        scope = next((path for path in paths if _VTE_SCOPE.fullmatch(path)), None)
    if scope is not None:
        return CgroupInfo("safe", scope=scope)
    if all(path == "/" for path in paths):
        return CgroupInfo("safe", scope="/")
    return _unverifiable("cgroup_ownership_unproven")
