"""Cgroup classification: which ``/proc/<pid>/cgroup`` texts prove an owned scope, a service, or nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tmux_owner._cgroup import CgroupInfo, classify_cgroup

USER_MANAGER = "/user.slice/user-1000.slice/user@1000.service"
VTE = f"{USER_MANAGER}/app.slice/app-org.gnome.Terminal.slice/vte-spawn-4006c3d1-0f5c-4ddb-b522-7b73d1f1fb59.scope"
OUR_MACHINES = """9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/75c32c7a8bb86cce824df100468fd327
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
"""

SAFE = [
    ("0::/", "/"),  # the root alone
    ("0::/app.slice/app-demo.scope", "/app.slice/app-demo.scope"),
    ("0::/user.slice/user-1000.slice/session-3.scope", "/user.slice/user-1000.slice/session-3.scope"),
    ("0::/user.slice/user-1000.slice/session-3.scope\r\n", "/user.slice/user-1000.slice/session-3.scope"),
    (f"0::{USER_MANAGER}/app.slice/app-demo.scope", f"{USER_MANAGER}/app.slice/app-demo.scope"),
    (f"0::{VTE}", VTE),  # a terminal's scope under its own user's manager
    ("0::/gjc-owner-abc.scope", "/gjc-owner-abc.scope"),  # a bootstrap's transient scope
    (f"0::{USER_MANAGER}/app.slice/gjc-owner-tok.scope", f"{USER_MANAGER}/app.slice/gjc-owner-tok.scope"),
    ("0::/gjc-owner-abc.scope/extra", "/gjc-owner-abc.scope/extra"),  # below an owned scope
    ("0::/init.scope", "/init.scope"),
    ("0::/sessionx.scope", "/sessionx.scope"),
    (
        "12:pids:/user.slice\n0::/user.slice/user-1000.slice/session-2.scope",
        "/user.slice/user-1000.slice/session-2.scope",
    ),  # a v1 controller line beside the unified one
    ("9:name=systemd:/\n8:pids:/\n0::/\n", "/"),  # every hierarchy at the root
]

UNVERIFIABLE = [
    (None, "cgroup_metadata_missing"),
    ("", "cgroup_metadata_missing"),
    ("   \n", "cgroup_metadata_missing"),
    ("\n\n", "cgroup_metadata_missing"),
    ("broken", "cgroup_metadata_malformed"),
    ("0::relative/path", "cgroup_metadata_malformed"),
    ("0::", "cgroup_metadata_malformed"),
    ("0::/a:b", "cgroup_metadata_malformed"),  # the path is what follows the last colon
    (
        "0::/user.slice/user-1001.slice/user@1000.service/app.slice/vte-spawn-4006c3d1.scope",
        "cgroup_ownership_unproven",
    ),
    ("0::/system.slice/vte-spawn-4006c3d1.scope", "cgroup_ownership_unproven"),  # a terminal scope outside a user
    ("0::/myuser.scope", "cgroup_ownership_unproven"),  # the prefix must start the name
    ("0::/system.slice/docker-abc.scope", "cgroup_ownership_unproven"),
    ("0::/docker/abc", "cgroup_ownership_unproven"),
    (f"0::{USER_MANAGER}", "cgroup_ownership_unproven"),
    (f"0::{USER_MANAGER}/tmux-spawn-1.scope", "cgroup_ownership_unproven"),
    (OUR_MACHINES, "cgroup_ownership_unproven"),  # a memory controller below the root
]

UNSAFE_SERVICE = [
    "0::/x.service",
    "0::/system.slice/tmux.service",
    "0::/unit.service",
    "0::/caller.service",
    f"0::{USER_MANAGER}/app.slice/snap.foo.service",  # a service below the user manager
    # a service on any line wins over a scope on another
    "0::/user.slice/user-1000.slice/session-2.scope\n1:name=systemd:/system.slice/cron.service",
]


@pytest.mark.parametrize("text", [None, "", "0::/x.service", OUR_MACHINES])
def test_non_linux_cgroups_are_not_applicable(text: str | None) -> None:
    """Off Linux every cgroup text, or none, is not_applicable."""
    assert classify_cgroup("darwin", text) == CgroupInfo("not_applicable")


@pytest.mark.parametrize(("text", "scope"), SAFE)
def test_owned_scopes_and_the_root_classify_as_safe_with_the_whole_path(text: str, scope: str) -> None:
    """A cgroup in an owned scope, or only at the root, is safe and names that whole path as its scope."""
    assert classify_cgroup("linux", text) == CgroupInfo("safe", scope=scope)


@pytest.mark.parametrize(("text", "diagnostic"), UNVERIFIABLE)
def test_missing_malformed_or_unowned_cgroups_are_unverifiable(text: str | None, diagnostic: str) -> None:
    """Missing, malformed or unowned cgroup text is unverifiable, with the reason as diagnostic."""
    assert classify_cgroup("linux", text) == CgroupInfo("unverifiable", diagnostic=diagnostic)


@pytest.mark.parametrize("text", UNSAFE_SERVICE)
def test_a_service_component_anywhere_wins_over_every_scope(text: str) -> None:
    """Any `.service` path component other than `user@N.service` makes the cgroup unsafe_service, whatever scope is also
    listed.
    """
    assert classify_cgroup("linux", text) == CgroupInfo("unsafe_service", diagnostic="service_cgroup_inheritance")


def test_the_cgroup_of_this_machine_is_unverifiable_when_it_has_a_process_api_memory_line() -> None:
    """On a machine whose own /proc/self/cgroup has a `memory:/process_api/<hex>` line, that cgroup is unverifiable."""
    text = Path("/proc/self/cgroup").read_text(encoding="utf-8")
    if ":/process_api/" not in text:
        pytest.skip("this machine's cgroup has no process_api line")
    assert classify_cgroup("linux", text) == CgroupInfo("unverifiable", diagnostic="cgroup_ownership_unproven")


def test_cgroup_info_round_trips_through_json_in_the_seed_key_order() -> None:
    """CgroupInfo serialises to the seed's object and back, omitting absent fields."""
    info = CgroupInfo("safe", scope="/")
    assert info.to_json() == {"classification": "safe", "scope": "/"}
    assert list(CgroupInfo("unverifiable", diagnostic="x").to_json()) == ["classification", "diagnostic"]
    assert CgroupInfo.from_json(info.to_json()) == info


@pytest.mark.parametrize(
    "value",
    [None, [], {"classification": "odd"}, {"classification": "safe", "scope": 1}, {"classification": "safe", "x": 1}],
)
def test_cgroup_info_refuses_any_other_json_shape(value: object) -> None:
    """CgroupInfo.from_json rejects unknown classifications, extra keys and mistyped fields."""
    with pytest.raises(ValueError):
        CgroupInfo.from_json(value)
