"""Known byte vectors shared with the original connector: payload sealing, content, policy and event HMACs,
key derivation, and a payload sealed the original connector's way opened by a real plane.
"""

from __future__ import annotations

import struct

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from dbutil import execute, query
from planes import PlaneFactory, enqueue

from admission_plane import AdmissionPlane, Policy
from admission_plane.crypto import (
    SealedPayload,
    SecretKey,
    content_fingerprint,
    event_correlation,
    js_json,
    open_sealed,
    payload_aad,
    policy_fingerprint,
    seal,
)

VECTOR_NONCE = bytes(range(12))
VECTOR_CIPHERTEXT = bytes.fromhex("d3c3f94a4f")
VECTOR_TAG = bytes.fromhex("2475e28bb0772b3e4f2adc9fc16cc821")
CONTENT_VECTORS = [
    ("atomic", "prompt-a", "7a6e3af05ab4a90caad0f68e1280e92ad72defacd48cf5ee076f05dc4b7591ba"),
    ("r-é", "héllo", "47468d705b23d3007ec725a5e9bb60b7ca92471b54f88373f89d7fca8ed35a56"),
]
POLICY_VECTORS = [
    ((3, 1, 2_000, 1_800_000, 30_000), "8d5d973734f4523801a9ad7909e374fe12e23bae54b0fc868e0af67e083b672f"),
    ((1, 1, 2_000, 1_800_000, 30_000), "9e48df8f9b23f7831d6b56b1d988081d04378e4ba26cf1a7218dc63308668316"),
    ((8, 8, 2_000, 1_800_000, 30_000), "5a6ef0d275d41ac69b0d8bd3b01b6bc832e494f908625d57f5bc564abf9d3821"),
]
CORRELATION_VECTORS = [
    ("request-1", "dd68e8f75598f7318cac9c6a72bfd6af38522a7d047d63d7d07a6738434ff906"),
    ("policy-state", "7cecbe0bdb5ee1d3972957aa68216f8d3b87221c5ed827d93ca57cf799559d99"),
]
DERIVATION_VECTORS = [
    ("encryption", "2c3ce72fc3970287c32df9760b8c2b4daad3401c05012a3c228879ab87d9462c"),
    ("content-fingerprint", "2533b4e0d5321d60d7f8813d35127e6bbd31d42dd001cdff01653cc6106dc9b2"),
]


def key(byte: int, purpose: str = "content fingerprint") -> SecretKey:
    return SecretKey(bytes([byte]) * 32, purpose)


# --- payload sealing ----------------------------------------------------------------------------------------


def test_payload_aad_is_the_seeds_json_tuple() -> None:
    """A payload's authenticated data is the UTF-8 JSON array `["paseo-agy-acp","turn",1,<requestId>,<keyVersion>]`."""
    assert payload_aad("r1", 1) == b'["paseo-agy-acp","turn",1,"r1",1]'


def test_sealing_hello_for_r1_gives_the_seed_ciphertext_and_tag() -> None:
    """Sealing `hello` for request r1 under key 0x01 x32 with nonce 00..0b gives ciphertext d3c3f94a4f and the known
    tag."""
    sealed = seal(key(1, "encryption"), "r1", "hello", nonce=VECTOR_NONCE)
    assert (sealed.nonce, sealed.ciphertext, sealed.auth_tag, sealed.key_version) == (
        VECTOR_NONCE,
        VECTOR_CIPHERTEXT,
        VECTOR_TAG,
        1,
    )


def test_the_seed_vector_opens_to_hello() -> None:
    """The known nonce, ciphertext and tag for request r1 open to `hello` under key 0x01 x32."""
    payload = SealedPayload(VECTOR_NONCE, VECTOR_CIPHERTEXT, VECTOR_TAG, 1)
    assert open_sealed(key(1, "encryption"), "r1", payload) == "hello"


# --- HMACs -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("request_id", "text", "expected"), CONTENT_VECTORS, ids=["atomic", "non-ascii"])
def test_content_fingerprint_vectors(request_id: str, text: str, expected: str) -> None:
    """The content fingerprint under key 0x02 x32 matches the known vectors, a non-ASCII request id and text
    included."""
    assert content_fingerprint(key(2), request_id, text) == expected


@pytest.mark.parametrize(("policy", "expected"), POLICY_VECTORS, ids=["3-seats", "1-seat", "8-seats"])
def test_policy_fingerprint_vectors(policy: tuple[int, ...], expected: str) -> None:
    """The policy fingerprint of each of three policies under key 0x2a x32 matches its known vector, from a tuple or a
    Policy."""
    assert policy_fingerprint(key(0x2A), policy) == expected
    assert policy_fingerprint(key(0x2A), Policy(*policy).as_tuple()) == expected


@pytest.mark.parametrize(("request_id", "expected"), CORRELATION_VECTORS, ids=["request-1", "policy-state"])
def test_event_correlation_vectors(request_id: str, expected: str) -> None:
    """The event correlation of `request-1` and of `policy-state` under key 0x02 x32 matches the known vectors."""
    assert event_correlation(key(2), request_id) == expected


def test_json_is_compact_and_keeps_non_ascii_raw() -> None:
    """JSON is serialised as JavaScript's JSON.stringify does: no spaces, non-ASCII raw, controls escaped, `/` and DEL
    unescaped."""
    assert js_json(["r-é", 1, "a/b\x7f", "\n\x01\u2028"]) == '["r-é",1,"a/b\x7f","\\n\\u0001\u2028"]'


def test_key_derivation_recipe_gives_the_peer_vectors() -> None:
    """HKDF-SHA256 with the length-framed salt and info turns master key 0x07 x32 into the known encryption and
    content-fingerprint keys."""

    def frame(*parts: str | bytes) -> bytes:
        encoded = [part.encode() if isinstance(part, str) else part for part in parts]
        return b"".join(struct.pack(">I", len(part)) + part for part in encoded)

    namespace, version = "paseo-agy-acp/admission/key-derivation", struct.pack(">I", 1)
    salt = frame(namespace, "hkdf-sha256", "salt", version)
    derived = {
        purpose: HKDF(hashes.SHA256(), 32, salt, frame(namespace, "hkdf-sha256", "subkey", version, purpose))
        .derive(bytes([7]) * 32)
        .hex()
        for purpose, _ in DERIVATION_VECTORS
    }
    assert derived == dict(DERIVATION_VECTORS)


# --- through a real plane ------------------------------------------------------------------------------------------


def test_a_payload_sealed_by_the_seed_opens_through_a_real_plane(make_plane: PlaneFactory, database_url: str) -> None:
    """A turn_payloads row holding the known nonce, ciphertext and tag, as the original connector wrote it, reads back
    as `hello` through a plane."""
    plane = make_plane(encryption_key=bytes([1]) * 32, content_fingerprint_key=bytes([2]) * 32)
    execute(
        database_url,
        "INSERT INTO turn_requests (request_id, session_id, agent_id, fingerprint, provider, model, state,"
        " enqueued_at, deadline_at) VALUES ('r1', 's', 'a', 'f', 'antigravity', 'model-test', 'queued', 0, 1800000)",
    )
    execute(
        database_url,
        "INSERT INTO turn_payloads (request_id, nonce, ciphertext, auth_tag, key_version, content_fingerprint,"
        " expires_at, created_at) VALUES ('r1', ?, ?, ?, 1, ?, 1000, 0)",
        params=(VECTOR_NONCE, VECTOR_CIPHERTEXT, VECTOR_TAG, content_fingerprint(key(2), "r1", "hello")),
    )
    assert plane.read_payload("r1", 500) == "hello"


@pytest.mark.parametrize(("request_id", "text", "expected"), CONTENT_VECTORS, ids=["atomic", "non-ascii"])
def test_a_real_plane_stores_the_seed_content_fingerprint(
    plane: AdmissionPlane, database_url: str, request_id: str, text: str, expected: str
) -> None:
    """enqueue_with_payload stores the known content fingerprint and the plane reads its own sealed payload back."""
    enqueue(plane, request_id, now=0, plaintext=text)
    assert query(database_url, "SELECT content_fingerprint FROM turn_payloads") == [(expected,)]
    assert plane.read_payload(request_id, 1) == text


def test_a_real_plane_journals_the_seed_event_correlation(plane: AdmissionPlane, database_url: str) -> None:
    """The correlation HMAC a plane journals for `request-1` is the known vector."""
    enqueue(plane, "request-1", now=0)
    assert query(database_url, "SELECT correlation_hmac FROM events") == [(CORRELATION_VECTORS[0][1],)]
