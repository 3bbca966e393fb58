"""The operator surface: ``/metrics``, a live dashboard and audited actions (the ``web`` extra).

``admission-plane serve`` runs :func:`create_app` with uvicorn. Everything is read from the
database at request time, so one server shows every process and host that shares the
plane. Actions need the operator token (see :mod:`admission_plane.web._auth`); without
one the server is read-only. This package sits beside the command line at the top of
the layers: it uses the plane, and nothing below imports it.
"""

from __future__ import annotations

from ._app import ACTIONS, create_app
from ._auth import OPERATOR_TOKEN_VARIABLE, TOKEN_FILE_NAME, default_token_file, load_operator_token
from ._serve import run

__all__ = [
    "ACTIONS",
    "OPERATOR_TOKEN_VARIABLE",
    "TOKEN_FILE_NAME",
    "create_app",
    "default_token_file",
    "load_operator_token",
    "run",
]
