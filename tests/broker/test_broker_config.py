"""The reference broker's settings hold to spec/tables/features.yaml (what it may be told, and what it advertises),
and what it reads or echoes holds to the schemas (a --pubkey, an error frame's requestId)."""

from __future__ import annotations

import argparse

import pytest

from reference.broker._frames import error_frame
from reference.broker.cli import _pubkey
from reference.broker.config import BrokerConfig, BrokerConfigError, supported_features
from reference.core import negotiate
from spec import load_table, validator

BITS = load_table("features")["bits"]
EVERY_BIT = list(BITS)


@pytest.mark.parametrize("policy", BITS["concurrent_connection_policy"]["optional"]["default_policy"]["enum"])
@pytest.mark.parametrize(("mode", "days"), [("retention_scoped", 3), ("retention_scoped", 30), ("permanent", None)])
def test_what_the_broker_advertises_negotiates_every_bit(policy, mode, days):
    """BRK-ADVERTISE: for every policy and dedupe mode the broker may be set to, a daemon requiring every bit of the
    table accepts the advertisement, each bit at version 1."""
    supported = supported_features(BrokerConfig(store_url="sqlite:///unused.db", connection_policy=policy), mode, days)
    result = negotiate({"type": "feature_negotiation_response", "supported": supported}, EVERY_BIT)
    assert (result.ok, sorted(result.accepted)) == (True, sorted(EVERY_BIT))
    assert {bit: supported[bit]["params"]["version"] for bit in EVERY_BIT} == {bit: 1 for bit in EVERY_BIT}


@pytest.mark.parametrize(("setting", "message"), [
    ({"retention_days": 2}, "retention days must be at least 3"),
    ({"inline_bytes": 1023}, "payload limits must be at least 1024 bytes"),
    ({"blob_bytes": 1023}, "payload limits must be at least 1024 bytes"),
    ({"connection_policy": "prefer_loudest"}, "connection policy must be one of"),
    ({"dedupe_mode": "forever"}, "dedupe mode must be one of"),
])
def test_a_setting_no_daemon_would_accept_is_refused(setting, message):
    """A broker is never started advertising what the daemon's negotiation refuses: a window below the E-06 floor,
    a max_payload below its minimum, a policy or dedupe mode the table does not name."""
    with pytest.raises(BrokerConfigError, match=message):
        BrokerConfig(store_url="sqlite:///unused.db", **setting)


@pytest.mark.parametrize(("value", "taken"), [
    ("ab" * 32, "ab" * 32), ("AB" * 32, "ab" * 32), ("ab" * 31, None), ("ab" * 32 + "\n", None), ("xy" * 32, None)])
def test_a_pubkey_argument_is_the_defs_pubkey_hex(value, taken):
    """meshd broker add-member --pubkey takes what common/defs pubkey_hex takes (upper case is lowered first)."""
    assert validator("common/defs#/$defs/pubkey_hex").is_valid(value) == (value == taken)
    if taken is None:
        with pytest.raises(argparse.ArgumentTypeError):
            _pubkey(value)
    else:
        assert _pubkey(value) == taken


@pytest.mark.parametrize(("request_id", "echoed"), [("r", True), ("r" * 128, True), ("r" * 129, False), ("", False),
                                                    (7, False), (None, False)])
def test_an_error_frame_echoes_a_request_id_the_schema_allows(request_id, echoed):
    frame = error_frame("invalid_frame", "no", request_id)
    assert ("requestId" in frame) == echoed
    assert validator("broker/error").is_valid(frame)
    assert validator("broker/list_peers#/$defs/request_id").is_valid(request_id) == echoed
