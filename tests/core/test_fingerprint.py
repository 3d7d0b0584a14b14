"""§4.4: the canonical preimage and the fingerprint."""

from __future__ import annotations

import hashlib

import pytest

from reference.core import FingerprintInput, MetaError, body_hash, canonical_preimage, meta_canonical, parse_send
from reference.core.fingerprint import fingerprint_prefix, request_fingerprint


def test_preimage_layout_matches_section_4_4():
    item = FingerprintInput("dm", "ab" * 32, "01REPLY", "now", {"z": 1, "a": [True, None]}, "héllo")
    expected = b"\x00".join([
        b"1", b"dm", ("ab" * 32).encode(), b"01REPLY", b"now", b'{"a":[true,null],"z":1}',
        hashlib.sha256("héllo".encode()).hexdigest().encode(),
    ])
    assert canonical_preimage(item) == expected
    assert request_fingerprint(item) == hashlib.sha256(expected).digest()
    assert fingerprint_prefix(request_fingerprint(item)) == hashlib.sha256(expected).hexdigest()[:16]


def test_body_hash_is_hex_of_utf8():
    assert body_hash("€") == hashlib.sha256("€".encode()).hexdigest()


def test_meta_is_rfc8785():
    assert meta_canonical({"b": 1.0, "a": "\u20ac", "\u00e9": 1e21}) == '{"a":"€","b":1,"é":1e+21}'.encode()


def test_empty_meta_forms_are_equal():
    bodies = [
        b'{"to":"#t","message":"m"}',
        b'{"to":"#t","message":"m","meta":null}',
        b'{"to":"#t","message":"m","meta":{}}',
    ]
    prints = {parse_send(body).fingerprint() for body in bodies}
    assert len(prints) == 1
    assert meta_canonical(None) == meta_canonical({}) == b""


def test_defaults_apply_before_hashing():
    plain = parse_send(b'{"to":"#t","message":"m"}').fingerprint()
    explicit = parse_send(b'{"to":"#t","message":"m","priority":"next","reply_to_id":""}').fingerprint()
    null_reply = parse_send(b'{"to":"#t","message":"m","reply_to_id":null}').fingerprint()
    assert plain == explicit == null_reply
    assert parse_send(b'{"to":"#t","message":"m","priority":"now"}').fingerprint() != plain


@pytest.mark.parametrize("meta", [{"n": 2**53}, {"s": "\ud800"}, {"f": float("inf")}])
def test_unrepresentable_meta_raises(meta):
    with pytest.raises(MetaError):
        meta_canonical(meta)


def test_lone_surrogate_body_raises():
    with pytest.raises(MetaError):
        body_hash("\udc00")


def test_lone_surrogate_in_a_meta_key_raises():
    with pytest.raises(MetaError):
        meta_canonical({"\udc00": 1})
