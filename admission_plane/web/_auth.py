"""The operator token, the operator's session and the CSRF token of every action.

The token comes from ``ADMISSION_PLANE_OPERATOR_TOKEN``, else from a token file held to the
key file's rules (a regular file of ours, not a link, mode 0600, in a directory only we may
use; default ``operator-token`` in the state directory beside the key file). Without one
the server is read-only.

A browser proves the token once (``POST /login``) and receives a session cookie
(``HttpOnly``, ``SameSite=Strict``, signed with a key that lives and dies with the server
process, expiring after :data:`SESSION_SECONDS`). Every action must carry that session
*and* the session's CSRF token (an HMAC of the session under the same key, given to the
page, never in a cookie), and a browser's ``Origin``, when it sends one, must be this
server. The token itself is never stored, logged or sent back.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import MissingKeyError
from ..keys import read_private_file, state_directory

OPERATOR_TOKEN_VARIABLE = "ADMISSION_PLANE_OPERATOR_TOKEN"  # noqa: S105 (a variable name, not a secret)
TOKEN_FILE_NAME = "operator-token"  # noqa: S105 (a file name, not a secret)
MIN_TOKEN_LENGTH = 16
SESSION_COOKIE = "admission_plane_operator"
SESSION_SECONDS = 8 * 3600
_MAX_TOKEN_FILE_BYTES = 4096


def default_token_file() -> Path:
    """``operator-token`` in the state directory (beside the default key file)."""
    return state_directory() / TOKEN_FILE_NAME


def load_operator_token(token_file: str | os.PathLike[str] | None = None) -> str | None:
    """The operator token from the environment, else from ``token_file`` (default :func:`default_token_file`,
    used only if it exists); ``None``: no token, read-only. An unsafe or malformed source raises
    :class:`~admission_plane.errors.MissingKeyError` naming the source, never the token."""
    value = os.environ.get(OPERATOR_TOKEN_VARIABLE)
    if value is not None:
        return _checked(value, OPERATOR_TOKEN_VARIABLE)
    path = Path(token_file) if token_file is not None else default_token_file()
    if token_file is None and not os.path.lexists(path):
        return None
    return _checked(_read_token_file(path), f"token file {path}")


def _checked(value: str, source: str) -> str:
    token = value.strip()
    if len(token) < MIN_TOKEN_LENGTH or not token.isascii() or not token.isprintable() or " " in token:
        raise MissingKeyError(
            f"the operator token in {source} must be at least {MIN_TOKEN_LENGTH} printable ASCII characters "
            "without spaces"
        )
    return token


def _read_token_file(path: Path) -> str:
    try:
        return read_private_file(path, "token", _MAX_TOKEN_FILE_BYTES)
    except FileNotFoundError:
        raise MissingKeyError(f"token file {path} does not exist") from None


class Guard:
    """Checks the token, issues and verifies sessions, derives and checks CSRF tokens."""

    def __init__(self, token: str | None, *, clock: Callable[[], float] = time.time) -> None:
        self._digest = None if token is None else hashlib.sha256(token.encode()).digest()
        self._key = secrets.token_bytes(32)
        self._clock = clock

    @property
    def enabled(self) -> bool:
        """Whether actions are possible at all (a token is configured)."""
        return self._digest is not None

    def _now(self) -> int:
        return int(self._clock())

    def token_matches(self, presented: str | None) -> bool:
        """Whether ``presented`` is the operator token (constant time; always ``False`` when read-only)."""
        if self._digest is None or not presented:
            return False
        return hmac.compare_digest(hashlib.sha256(presented.encode()).digest(), self._digest)

    def issue_session(self) -> str:
        """A new session cookie value: ``<nonce>.<expiry>.<mac>``."""
        nonce = secrets.token_urlsafe(18)
        expiry = self._now() + SESSION_SECONDS
        return f"{nonce}.{expiry}.{self._mac('session', f'{nonce}.{expiry}')}"

    def session(self, cookie: str | None) -> str | None:
        """The session of a valid, unexpired cookie value, else ``None``."""
        if self._digest is None or not cookie or cookie.count(".") != 2:
            return None
        nonce, expiry, mac = cookie.split(".")
        if not hmac.compare_digest(mac, self._mac("session", f"{nonce}.{expiry}")):
            return None
        if not expiry.isdigit() or int(expiry) < self._now():
            return None
        return f"{nonce}.{expiry}"

    def csrf_token(self, session: str) -> str:
        """The CSRF token of ``session``."""
        return self._mac("csrf", session)

    def csrf_matches(self, session: str, presented: str | None) -> bool:
        """Whether ``presented`` is ``session``'s CSRF token."""
        return bool(presented) and hmac.compare_digest(self.csrf_token(session), presented or "")

    def _mac(self, purpose: str, value: str) -> str:
        return hmac.new(self._key, f"{purpose}:{value}".encode(), hashlib.sha256).hexdigest()
