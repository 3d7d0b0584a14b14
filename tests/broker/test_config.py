"""The reference broker's settings hold to spec/tables/features.yaml: what it may be told, and what it advertises."""

from __future__ import annotations

import pytest

from reference.broker.config import BrokerConfig, BrokerConfigError, supported_features
from reference.core import negotiate
from spec import load_table

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
