"""Validation phase A (§4.5.1 step 1, E-01, E-02, E-04, E-19): every refusal raises before any decision."""

from __future__ import annotations

import json

import pytest

from reference.core import RequestError, is_client_message_id, parse_send, validate_send
from reference.core.request import load_payload

GOOD = {"to": "#general", "message": "hello"}

INVALID = [
    (b"\xff\xfe", "invalid_json"),
    (b"{not json", "invalid_json"),
    (b'{"to":"#a","to":"#b","message":"m"}', "invalid_json"),
    (b'{"to":"#a","message":"m","meta":{"x":NaN}}', "invalid_json"),
    (b"[1,2]", "invalid_request"),
    (b'{"to":"#a","message":"m","extra":1}', "invalid_request"),
    (b'{"message":"m"}', "invalid_request"),
    (b'{"to":"","message":"m"}', "invalid_request"),
    (b'{"to":"#a"}', "invalid_request"),
    (b'{"to":"#a","message":""}', "invalid_request"),
    (b'{"to":"#a","message":5}', "invalid_request"),
    (b'{"to":"#a","message":"m","priority":"urgent"}', "invalid_request"),
    (b'{"to":"#a","message":"m","meta":[1]}', "invalid_request"),
    (b'{"to":"#a","message":"m","reply_to_id":5}', "invalid_request"),
    (b'{"to":"#a","message":"m","reply_to_id":"has space"}', "invalid_request"),
    (b'{"to":"#a","message":"m","client_message_id":"has space"}', "invalid_client_message_id"),
    (b'{"to":"@group","message":"m"}', "destination_unresolvable"),
    (b'{"to":"#a","message":"m","meta":{"n":9007199254740992}}', "meta_not_canonicalizable"),
    (b'{"to":"#a","message":"m","meta":{"s":"\\ud800"}}', "meta_not_canonicalizable"),
    (b'{"to":"#a","message":"\\ud800"}', "invalid_request"),
    (b"[" * 100_000 + b"]" * 100_000, "limit_exceeded"),
    (b'{"to":"#a","message":"m","meta":' + b'{"a":' * 480 + b"1" + b"}" * 481, "limit_exceeded"),
    (b'{"to":"#a","message":"m","meta":{"n":' + b"7" * 4301 + b"}}", "limit_exceeded"),
    (b'{"to":"#a","message":"m","meta":{"n":-' + b"7" * 101 + b"}}", "limit_exceeded"),
]


@pytest.mark.parametrize(("body", "code"), INVALID, ids=[c for _, c in INVALID])
def test_invalid_requests_raise_before_any_decision(body, code):
    with pytest.raises(RequestError) as caught:
        parse_send(body)
    assert caught.value.code == code
    assert caught.value.detail


def test_header_wins_over_body_id():
    body = json.dumps({**GOOD, "client_message_id": "from-body"}).encode()
    assert parse_send(body, "from-header").client_message_id == "from-header"
    assert parse_send(body).client_message_id == "from-body"
    assert parse_send(json.dumps(GOOD).encode()).client_message_id is None


def test_bad_body_id_is_refused_even_with_a_header():
    body = json.dumps({**GOOD, "client_message_id": "bad id"}).encode()
    with pytest.raises(RequestError) as caught:
        parse_send(body, "good-id")
    assert caught.value.code == "invalid_client_message_id"


@pytest.mark.parametrize(("value", "ok"), [
    ("a", True), ("01HQXYZ", True), ("cmid_01HQX", True), ("550e8400-e29b-41d4-a716-446655440000", True),
    ("a" * 128, True), ("a" * 129, False), ("", False), ("-lead", False), ("has space", False), ("a/b", False),
    ("é", False), (5, False),
])
def test_id_grammar(value, ok):
    assert is_client_message_id(value) is ok
    if isinstance(value, str):
        if ok:
            assert validate_send(GOOD, value).client_message_id == value
        else:
            with pytest.raises(RequestError):
                validate_send(GOOD, value)


def test_meta_outside_jcs_domain_is_refused():
    with pytest.raises(RequestError) as caught:
        validate_send({**GOOD, "meta": {"big": 2**53}})
    assert caught.value.code == "meta_not_canonicalizable"
    assert caught.value.invalid_params == (("meta", caught.value.invalid_params[0][1]),)


def test_payload_round_trips():
    request = parse_send(b'{"to":"dm:' + b"AB" * 32 + b'","message":"hi","meta":{"k":"v"},"reply_to_id":"01R"}')
    payload = load_payload(request.payload())
    assert payload["destination_ref"] == "ab" * 32
    assert payload["meta"] == {"k": "v"}
    assert payload["reply_to_id"] == "01R"
    assert load_payload(parse_send(b'{"to":"#t","message":"m"}').payload())["meta"] is None
