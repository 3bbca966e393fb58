"""Payload sealing and the HMACs, byte-compatible with the original connector.

* Payloads: AES-256-GCM, 12-byte random nonce, 16-byte tag stored apart, AAD =
  ``["paseo-agy-acp","turn",1,<request_id>,<key_version>]``.
* Content fingerprint, policy fingerprint and event correlation: hex HMAC-SHA256 over a
  JSON domain tuple, a 0x00 byte, and the UTF-8 message.

"JSON" is JavaScript's ``JSON.stringify``: compact, non-ASCII raw.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Sequence
from typing import Any

import attrs
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import InvalidInputError

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
PAYLOAD_KEY_VERSION = 1
_NAMESPACE = "paseo-agy-acp"


#: ``json.dumps`` with these options would make an encoder per call (it reuses one only for its defaults).
_JS_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def js_json(value: Any) -> str:
    """JavaScript ``JSON.stringify`` of plain data."""
    return _JS_JSON.encode(value)


class SecretKey:
    """A 32-byte key held in a private, zeroable buffer; never printed.

    The caller's bytes are copied, so :meth:`wipe` (called by ``AdmissionPlane.close``)
    zero-fills only our copy.
    """

    __slots__ = ("_buffer", "_purpose")

    def __init__(self, key: bytes | bytearray | memoryview, purpose: str) -> None:
        given: object = key  # checked as given: callers without type checking may pass anything
        if not isinstance(given, bytes | bytearray | memoryview) or len(given) != KEY_BYTES:
            raise InvalidInputError(f"admission {purpose} key must be exactly {KEY_BYTES} bytes")
        self._buffer = bytearray(key)
        self._purpose = purpose

    def __repr__(self) -> str:
        return f"<SecretKey {self._purpose}>"

    @property
    def purpose(self) -> str:
        return self._purpose

    def material(self) -> bytes:
        """The key bytes (a short-lived copy for one cryptographic call)."""
        return bytes(self._buffer)

    def wipe(self) -> None:
        """Overwrite the key material with zeros."""
        for index in range(len(self._buffer)):
            self._buffer[index] = 0


@attrs.frozen(repr=False)
class SealedPayload:
    """The at-rest form of a prompt (nonce, ciphertext and tag are stored in separate columns)."""

    nonce: bytes
    ciphertext: bytes
    auth_tag: bytes
    key_version: int = PAYLOAD_KEY_VERSION

    def __repr__(self) -> str:
        return f"<SealedPayload {len(self.ciphertext)} bytes, key version {self.key_version}>"


def payload_aad(request_id: str, key_version: int) -> bytes:
    """The AAD binding a sealed payload to its request and key version."""
    return js_json([_NAMESPACE, "turn", 1, request_id, key_version]).encode("utf-8")


def seal(
    key: SecretKey,
    request_id: str,
    plaintext: str,
    *,
    key_version: int = PAYLOAD_KEY_VERSION,
    nonce: bytes | None = None,
) -> SealedPayload:
    """Encrypt ``plaintext`` for ``request_id``; ``nonce`` is random unless given (tests only)."""
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
    if len(nonce) != NONCE_BYTES:
        raise InvalidInputError(f"payload nonce must be exactly {NONCE_BYTES} bytes")
    sealed = AESGCM(key.material()).encrypt(nonce, plaintext.encode("utf-8"), payload_aad(request_id, key_version))
    return SealedPayload(
        nonce=nonce, ciphertext=sealed[:-TAG_BYTES], auth_tag=sealed[-TAG_BYTES:], key_version=key_version
    )


def open_sealed(key: SecretKey, request_id: str, payload: SealedPayload) -> str:
    """Decrypt and authenticate a sealed payload; raises ``cryptography``'s ``InvalidTag`` on tampering."""
    data = AESGCM(key.material()).decrypt(
        payload.nonce, payload.ciphertext + payload.auth_tag, payload_aad(request_id, payload.key_version)
    )
    return data.decode("utf-8")


def _domain_hmac(key: SecretKey, domain: Sequence[Any], message: str) -> str:
    # One call of the C library's HMAC over domain, zero byte, message (the same bytes as updating in turn).
    text = js_json(list(domain)).encode("utf-8") + b"\x00" + message.encode("utf-8")
    return hmac.digest(key.material(), text, "sha256").hex()


class EventCorrelator:
    """:func:`event_correlation` with the keyed domain prefix computed once (hot path: every event).

    Holds HMAC state derived from the key until :meth:`forget`; the plane forgets it on close.
    """

    __slots__ = ("_last", "_prefix")

    def __init__(self, key: SecretKey) -> None:
        #: The last request's correlation (a turn journals about six events of one request in a row).
        self._last: tuple[str, str] | None = None
        prefix = hmac.new(
            key.material(), js_json([_NAMESPACE, "admission-event-correlation", 1]).encode("utf-8"), hashlib.sha256
        )
        prefix.update(b"\x00")
        self._prefix: hmac.HMAC | None = prefix

    def __call__(self, request_id: str) -> str:
        prefix = self._prefix
        if prefix is None:  # as before: a forgotten correlator fails with AttributeError
            raise AttributeError("the event correlator was forgotten")
        last = self._last  # one read: another thread may replace it meanwhile
        if last is not None and last[0] == request_id:
            return last[1]
        mac = prefix.copy()
        mac.update(request_id.encode("utf-8"))
        correlation = mac.hexdigest()
        self._last = (request_id, correlation)
        return correlation

    def forget(self) -> None:
        self._prefix = None
        self._last = None


def content_fingerprint(key: SecretKey, request_id: str, plaintext: str, domain: str = "turn") -> str:
    """HMAC identifying a payload's content without revealing it."""
    return _domain_hmac(key, [_NAMESPACE, domain, "content", 1, request_id], plaintext)


def policy_fingerprint(key: SecretKey, policy_tuple: Sequence[int]) -> str:
    """HMAC of the normalized policy tuple (stored in ``policy_state``)."""
    return _domain_hmac(key, [_NAMESPACE, "admission-policy", 1], js_json(list(policy_tuple)))


def event_correlation(key: SecretKey, request_id: str) -> str:
    """HMAC correlating a request's journal events without storing its id."""
    return _domain_hmac(key, [_NAMESPACE, "admission-event-correlation", 1], request_id)


__all__ = [
    "EventCorrelator",
    "InvalidTag",
    "SealedPayload",
    "SecretKey",
    "content_fingerprint",
    "event_correlation",
    "open_sealed",
    "payload_aad",
    "policy_fingerprint",
    "seal",
]
