"""§15.1 / §15.5 with E-06, E-07: negotiation validation and the close reason."""

from __future__ import annotations

import json

import pytest

from reference.core import CloseReason, negotiate
from reference.core.features import always_required, required_bits
from spec import load_table

REQUIRE = ["client_message_id_dedupe", "concurrent_connection_policy"]
OPTIONAL = ["member_keypair_rotated_event", "key_epoch", "max_payload"]


def dedupe(**params):
    base = {"version": 1, "mode": "retention_scoped", "dedupe_retention_days": 7, "request_fingerprint": True}
    return {"params": {**base, **params}}


def response(**overrides):
    supported = {
        "client_message_id_dedupe": dedupe(),
        "concurrent_connection_policy": {"params": {"version": 1, "default_policy": "prefer_newest"}},
        "max_payload": {"params": {"version": 1, "inline_bytes": 65536, "blob_bytes": 524288000}},
    }
    supported.update(overrides)
    return {"type": "feature_negotiation_response", "supported": supported, "missing_required": []}


def test_accepts_a_good_response():
    result = negotiate(response(), REQUIRE, OPTIONAL)
    assert result.ok
    assert result.accepted["max_payload"]["inline_bytes"] == 65536
    assert set(result.accepted) == {"client_message_id_dedupe", "concurrent_connection_policy", "max_payload"}


@pytest.mark.parametrize(("params", "kind"), [
    ({"dedupe_retention_days": 2}, "feature_param_below_floor"),
    ({"dedupe_retention_days": 0}, "feature_param_invalid"),
    ({"dedupe_retention_days": "7"}, "feature_param_invalid"),
    ({"dedupe_retention_days": True}, "feature_param_invalid"),
    ({"mode": "forever"}, "feature_param_invalid"),
    ({"request_fingerprint": False}, "feature_param_invalid"),
    ({"version": 2}, "feature_param_invalid"),
    ({"version": "1"}, "feature_param_invalid"),
])
def test_dedupe_feature_rules(params, kind):
    result = negotiate(response(client_message_id_dedupe=dedupe(**params)), REQUIRE, OPTIONAL)
    assert not result.ok
    assert result.failure.kind == kind
    assert result.failure.feature == "client_message_id_dedupe"


def test_missing_required_params_and_bits():
    no_fp = {"params": {"version": 1, "mode": "permanent"}}
    assert negotiate(response(client_message_id_dedupe=no_fp), REQUIRE).failure.kind == "feature_param_invalid"
    scoped = {"params": {"version": 1, "mode": "retention_scoped", "request_fingerprint": True}}
    assert negotiate(response(client_message_id_dedupe=scoped), REQUIRE).failure.kind == "feature_param_invalid"
    permanent = {"params": {"version": 1, "mode": "permanent", "request_fingerprint": True}}
    assert negotiate(response(client_message_id_dedupe=permanent), REQUIRE).ok
    gone = response()
    del gone["supported"]["concurrent_connection_policy"]
    assert negotiate(gone, REQUIRE).failure.kind == "feature_unavailable"
    listed = {**response(), "missing_required": ["client_message_id_dedupe"]}
    assert negotiate(listed, REQUIRE).failure.kind == "feature_unavailable"
    assert negotiate({"supported": "nonsense"}, REQUIRE).failure.kind == "feature_unavailable"
    assert negotiate(response(client_message_id_dedupe={"params": []}), REQUIRE).failure.kind == "feature_param_invalid"
    with pytest.raises(ValueError):
        negotiate(response(), ["no_such_bit"])


@pytest.mark.parametrize("require", [[], ["concurrent_connection_policy"]])
def test_dedupe_is_required_whatever_the_caller_requires(require):
    """NEG-REQUIRE-DEDUPE: a require list without client_message_id_dedupe still fails against a broker without it,
    or with it below the floor, with the structured reason."""
    gone = response()
    del gone["supported"]["client_message_id_dedupe"]
    assert negotiate(gone, require, OPTIONAL).failure == CloseReason(
        "feature_unavailable", "client_message_id_dedupe", "client_message_id_dedupe not in supported")
    low = negotiate(response(client_message_id_dedupe=dedupe(dedupe_retention_days=2)), require)
    assert low.failure == CloseReason("feature_param_below_floor", "client_message_id_dedupe",
                                      "dedupe_retention_days=2 is below the daemon floor 3")
    assert set(negotiate(response(), require).accepted) == {"client_message_id_dedupe", *require}


def test_required_bits_put_the_always_required_first_once():
    assert always_required() == ("client_message_id_dedupe",)
    assert required_bits([]) == ("client_message_id_dedupe",)
    assert required_bits(["concurrent_connection_policy", "client_message_id_dedupe"]) == (
        "client_message_id_dedupe", "concurrent_connection_policy")


def test_always_required_bits_are_known_and_in_the_daemon_defaults():
    table = load_table("features")
    assert set(table["always_required"]) <= set(table["bits"])
    assert set(table["always_required"]) <= set(table["daemon_defaults"]["require"])


def test_optional_problems_only_warn():
    bad_optional_param = response(
        concurrent_connection_policy={"params": {"version": 1, "default_policy": "whatever"}},
        max_payload={"params": {"version": 1, "inline_bytes": 10, "blob_bytes": 2048}},
        key_epoch={"params": {"version": 1, "max_concurrent_epochs": 2}},
        unknown_bit={"params": {"version": 9}},
    )
    result = negotiate(bad_optional_param, REQUIRE, [*OPTIONAL, "unknown_bit"])
    assert result.ok
    assert "max_payload" not in result.accepted
    assert result.accepted["key_epoch"]["max_concurrent_epochs"] == 2
    assert "default_policy" not in result.accepted["concurrent_connection_policy"]
    assert len(result.warnings) == 2


def test_close_payload_fits_123_bytes():
    reason = CloseReason("feature_param_below_floor", "client_message_id_dedupe", "détail " * 50)
    payload = reason.close_payload()
    assert len(payload.encode()) <= 123
    decoded = json.loads(payload)
    assert decoded["kind"] == "feature_param_below_floor"
    assert decoded["feature"] == "client_message_id_dedupe"
    assert reason.as_dict()["detail"].startswith(decoded["detail"])
    short = CloseReason("feature_unavailable", "max_payload", "gone")
    assert json.loads(short.close_payload()) == short.as_dict()
    huge = CloseReason("feature_unavailable", "x" * 200, "")
    assert json.loads(huge.close_payload()) == {"kind": "feature_unavailable", "feature": "x" * 200}


def test_conditional_param_ignored_when_not_required():
    permanent = {"params": {"version": 1, "mode": "permanent", "request_fingerprint": True,
                            "dedupe_retention_days": "ignored in permanent mode"}}
    result = negotiate(response(client_message_id_dedupe=permanent), REQUIRE)
    assert result.ok
    assert "dedupe_retention_days" not in result.accepted["client_message_id_dedupe"]


def test_unknown_rule_type_is_a_table_error():
    from reference.core.features import _type_ok

    with pytest.raises(ValueError, match="unknown parameter type"):
        _type_ok(1, "float")
