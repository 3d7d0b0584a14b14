"""The reference broker's settings and what it advertises in feature negotiation (§15.1).

Rules of this file: every knob of ``meshd broker serve`` is a field of ``BrokerConfig`` with its default here, and
the CLI only fills them in. ``supported_features`` builds the ``supported`` map of a feature_negotiation_response
from the config and the mesh's own dedupe policy; an ``advertise`` map (``--advertise FILE.json``) replaces it
verbatim, so a test can make the broker offer missing or out-of-range parameters.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reference.broker._presence import MAX_OUTBOUND_BYTES
from reference.broker.store import DEDUPE_MODES
from reference.core.limits import limit
from spec import SPEC_VERSION, load_table

#: what a broker may advertise (spec/tables/features.yaml): its bits' versions and parameter rules
_BITS = load_table("features")["bits"]
CONNECTION_POLICIES = tuple(_BITS["concurrent_connection_policy"]["optional"]["default_policy"]["enum"])
#: the shortest dedupe window a daemon accepts (dedupe_retention_days' floor, E-06)
MIN_RETENTION_DAYS: int = _BITS["client_message_id_dedupe"]["required"]["dedupe_retention_days"]["floor"]
LOOPBACK_HOSTS = ("127.0.0.1", "::1", "localhost")
BROKER_VERSION = f"meshspec-broker/{SPEC_VERSION}"


class BrokerConfigError(ValueError):
    """A setting cannot be used; ``meshd broker serve`` exits 3."""


@dataclass(frozen=True)
class BrokerConfig:
    """Everything ``meshd broker serve`` can be told. Times are seconds unless the name says otherwise."""

    store_url: str
    host: str = "127.0.0.1"
    port: int = 0
    #: admit any member, create meshes and topics on first use, subscribe every member to every topic
    dev: bool = False
    #: the dedupe policy of meshes this broker creates (dev mode, ``add-mesh`` defaults)
    dedupe_mode: str = "retention_scoped"
    retention_days: int = 30
    #: replaces the whole ``supported`` map of the negotiation response when set
    advertise: dict[str, Any] | None = None
    inline_bytes: int = 65_536
    blob_bytes: int = 524_288_000
    max_concurrent_epochs: int = 2
    connection_policy: str = "prefer_newest"
    hello_skew_s: float = float(limit("broker_hello_skew_s"))
    handshake_timeout_s: float = float(limit("broker_handshake_s"))
    #: a pushed delivery not acknowledged within the lease is pushed again
    lease_s: float = 30.0
    #: per-member token bucket for sends (B1 rate_limit); 0 disables it
    rate_per_s: float = float(limit("broker_send_rate_per_s"))
    rate_burst: int = int(limit("broker_send_burst"))
    #: the periodic retention sweep; 0 disables the thread (``meshd broker retention-sweep`` still works)
    sweep_interval_s: float = 3600.0
    message_retention_days: float = 30.0
    trace_dir: Path | None = None
    trace_node: str = "broker"
    trace_strict: bool = False
    #: store calls run on this many threads, so at most this many database connections are open
    db_workers: int = 16
    max_inflight_per_connection: int = int(limit("broker_inflight_per_connection"))
    #: open WebSocket connections, authenticated or not; past this a new one is closed 1013 before its handshake
    max_connections: int = int(limit("broker_connections"))
    #: frames queued for a member that it has not read; past this the connection is closed 1013 (E-33)
    max_outbound_bytes: int = MAX_OUTBOUND_BYTES
    allow_non_loopback: bool = False

    def __post_init__(self) -> None:
        if self.dedupe_mode not in DEDUPE_MODES:
            raise BrokerConfigError(f"dedupe mode must be one of {DEDUPE_MODES}")
        if self.retention_days < MIN_RETENTION_DAYS:
            raise BrokerConfigError(f"retention days must be at least {MIN_RETENTION_DAYS} (E-06, the store's CHECK)")
        if self.connection_policy not in CONNECTION_POLICIES:
            raise BrokerConfigError(f"connection policy must be one of {CONNECTION_POLICIES}")
        if self.host not in LOOPBACK_HOSTS and not self.allow_non_loopback:
            raise BrokerConfigError(f"{self.host} is not loopback; pass --allow-non-loopback to bind it")
        payload = _BITS["max_payload"]["required"]
        if self.inline_bytes < payload["inline_bytes"]["minimum"] or self.blob_bytes < payload["blob_bytes"]["minimum"]:
            raise BrokerConfigError(f"payload limits must be at least {payload['inline_bytes']['minimum']} bytes "
                                    "(max_payload's minimum)")
        if (self.lease_s <= 0 or self.db_workers < 1 or self.max_inflight_per_connection < 1
                or self.max_outbound_bytes < 1 or self.max_connections < 1):
            raise BrokerConfigError("lease, db workers, in-flight and outbound limits must be positive")
        if self.advertise is not None and not isinstance(self.advertise, dict):
            raise BrokerConfigError("the advertised feature map must be a JSON object")

    @property
    def max_payload_bytes(self) -> int:
        """The B1 size limit: the advertised ``max_payload.inline_bytes`` when it is an integer, else ours."""
        if self.advertise is not None:
            params = (self.advertise.get("max_payload") or {}).get("params") or {}
            # req: BRK-PAYLOAD-LIMIT -- B1 holds bodies to what is advertised
            value = params.get("inline_bytes") if isinstance(params, dict) else None
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return value
        return self.inline_bytes


def load_advertise(path: Path) -> dict[str, Any]:
    """Read an ``--advertise`` file: a JSON object used verbatim as ``supported``.

    Raises:
        BrokerConfigError: unreadable, not JSON, or not an object.
    """
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BrokerConfigError(f"{path}: {exc}") from exc
    if not isinstance(document, dict):
        raise BrokerConfigError(f"{path}: the advertised feature map must be a JSON object")
    return document


def supported_features(config: BrokerConfig, dedupe_mode: str, retention_days: int | None) -> dict[str, Any]:
    """The ``supported`` map for a mesh whose dedupe policy is (``dedupe_mode``, ``retention_days``)."""
    if config.advertise is not None:
        return json.loads(json.dumps(config.advertise))
    # req: BRK-ADVERTISE, BRK-ADVERTISE-POLICY -- the mesh's own mode and retention
    dedupe: dict[str, Any] = {"mode": dedupe_mode, "request_fingerprint": True}
    if dedupe_mode == "retention_scoped":
        dedupe["dedupe_retention_days"] = retention_days
    params = {
        "client_message_id_dedupe": dedupe,
        "concurrent_connection_policy": {"default_policy": config.connection_policy},
        "member_keypair_rotated_event": {},
        "key_epoch": {"max_concurrent_epochs": config.max_concurrent_epochs},
        "max_payload": {"inline_bytes": config.inline_bytes, "blob_bytes": config.blob_bytes},
    }
    return {bit: {"params": {"version": _BITS[bit]["version"], **values}} for bit, values in params.items()}
