"""``admission-plane serve`` (the web extra), ``reap --dry-run`` and ``--version``."""

from __future__ import annotations

import argparse
import ipaddress
import sys
from importlib import metadata

import attrs

from ..reaper import reap
from ._commands import cmd_reap
from ._common import EXIT_OK, CommandFailed, emit, now_ms, open_plane, shown

WEB_EXTRA_HINT = "the web extra is not installed: pip install 'admission-plane[web]'"


def package_version() -> str:
    """The installed distribution's version (``unknown`` when run from a tree that was never installed)."""
    try:
        return metadata.version("admission-plane")
    except metadata.PackageNotFoundError:
        return "unknown"


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve ``/metrics``, the dashboard and (with the operator token) its actions until SIGINT or SIGTERM."""
    try:
        from ..web import create_app, load_operator_token, run
    except ImportError as error:  # the extra's libraries are missing
        raise CommandFailed(f"{WEB_EXTRA_HINT} ({error})") from None
    token = load_operator_token(args.token_file)
    plane = open_plane(args, keys=token is not None)  # actions journal, which needs the keys
    try:
        app = create_app(plane, token=token, tick_seconds=args.tick)
        mode = "operator actions need the token" if token is not None else "read-only: no operator token"

        def announce(host: str, port: int) -> None:
            name = f"[{host}]" if ":" in host else host
            print(
                f"serving {shown(plane.engine.url)} on http://{name}:{port}/ ({mode}); /metrics for Prometheus; "
                "Ctrl-C stops",
                file=sys.stderr,
                flush=True,
            )

        if not _is_loopback(args.host):
            print(
                f"warning: listening on {args.host}, beyond this machine, without TLS: put a TLS proxy in front",
                file=sys.stderr,
                flush=True,
            )
        run(app, args.host, args.port, announce)
    finally:
        plane.close()
    return EXIT_OK


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_reap_or_dry_run(args: argparse.Namespace) -> int:
    """``reap``; with ``--dry-run``, what the pass would do, changing nothing."""
    if not args.dry_run:
        return cmd_reap(args)
    plane = open_plane(args)  # a dry run writes nothing, so it needs no keys
    try:
        summary = reap(plane, now_ms(), dry_run=True)
    finally:
        plane.close()
    data = {"dry_run": True, **attrs.asdict(summary)}
    text = "reaper dry run, nothing was changed; the pass would count: " + ", ".join(
        f"{name.replace('_', ' ')} {value}" for name, value in attrs.asdict(summary).items()
    )
    if summary.untrusted:
        text += f"\n{summary.untrusted} recovery row(s) could not be trusted and would be journalled and left alone"
    emit(args, data, text)
    return EXIT_OK
