"""spec/tables/limits.yaml (E-40) and the core's JSON parsing held to it; transient acks (E-42).

The end-to-end property the table exists for is checked here with hypothesis: whatever send the IPC accepts, its
send frame, and the push frame a broker builds from it, fit in one link frame.
"""

from __future__ import annotations

import inspect
import json
import string

import pytest
from core_builders import make_row
from hypothesis import given, settings
from hypothesis import strategies as st

from reference.core import OutboxEvent, OutboxPolicy, RequestError, apply, backoff_ms, parse_send
from reference.core.ack import ack_event
from reference.core.limits import LimitExceeded, Unparsable, depth, limit, limits, loads
from spec import load_table

TABLE = load_table("limits")["limits"]


def _nested(levels: int) -> str:
    return "[" * levels + "]" * levels


def test_loads_holds_documents_to_the_json_limits():
    """LIMIT-JSON: exactly json_max_depth levels parse; one more is LimitExceeded with the document attached (so a
    broker can still answer a send by its id); far deeper has no document; integer literals likewise by digits."""
    assert depth(loads(_nested(32))) == 32
    with pytest.raises(LimitExceeded) as deeper:
        loads(_nested(33))
    assert deeper.value.limit == "json_max_depth" and deeper.value.document is not None
    with pytest.raises(LimitExceeded) as far:
        loads(_nested(200_000))
    assert far.value.limit == "json_max_depth" and far.value.document is None
    assert loads("-" + "9" * 100) == -int("9" * 100)
    with pytest.raises(LimitExceeded) as digits:
        loads('{"type": "send", "n": ' + "9" * 101 + "}")
    assert digits.value.limit == "json_max_integer_digits" and digits.value.document["type"] == "send"
    with pytest.raises(LimitExceeded):
        loads("7" * 5000)  # past Python's own int-conversion limit: never a bare ValueError
    for text in ("NaN", '{"a": Infinity}', "{", b"\xff", ""):
        with pytest.raises(Unparsable):
            loads(text)
    assert loads('{"a": 1e400}') == {"a": float("inf")}  # a float literal is not an integer literal
    assert depth(3) == 0 and depth({}) == 1 and depth({"a": [[]]}) == 3


def test_the_limits_table_is_consistent_end_to_end():
    """LIMIT-TABLE: the numbers agree with each other and with what the reference loads from them."""
    from reference.broker._presence import MAX_OUTBOUND_BYTES
    from reference.broker.config import BrokerConfig
    from reference.daemon import guard
    from reference.daemon.config import KEYS
    from reference.daemon.link import QUARANTINE_PREFIX_BYTES, _BoundedFrames
    from reference.daemon.server import LingeringCloser
    from reference.daemon.store import InboxStore
    from reference.daemon.store._cursor import MAX_CURSOR_CHARS

    values = limits()
    assert values["ipc_send_body_bytes"] <= values["send_payload_max_bytes"]
    assert values["send_payload_max_bytes"] + 16 * 1024 == values["link_frame_max_bytes"]
    assert values["ipc_threads_per_transport"] > (values["ipc_inflight_per_transport"]
                                                 + values["ipc_streams_per_transport"])
    assert values["ipc_drain_s"] <= values["ipc_body_read_s"] and values["ipc_drain_idle_s"] <= values["ipc_drain_s"]
    for name, entry in TABLE.items():
        if "config" in entry:
            section, key = entry["config"].split(".")
            assert KEYS[section][key][0] == entry["value"], name
    config = BrokerConfig(store_url="sqlite:///unused.db")
    assert (config.handshake_timeout_s, config.max_inflight_per_connection, config.max_connections) == (
        values["broker_handshake_s"], values["broker_inflight_per_connection"], values["broker_connections"])
    assert (config.hello_skew_s, config.rate_per_s, config.rate_burst) == (
        values["broker_hello_skew_s"], values["broker_send_rate_per_s"], values["broker_send_burst"])
    assert values["broker_outbound_bytes"] == MAX_OUTBOUND_BYTES
    assert LingeringCloser(linger_s=1.0, drain_bytes=1).max_sockets == values["ipc_lingering_connections"]
    assert values["ipc_cursor_chars"] == MAX_CURSOR_CHARS
    assert values["quarantine_frame_prefix_bytes"] == QUARANTINE_PREFIX_BYTES
    assert inspect.signature(InboxStore.quarantine).parameters["max_rows"].default == values["quarantine_max_rows"]
    assert values["quarantine_frame_prefix_bytes"] < values["link_frame_max_bytes"]
    drain = (guard.DRAIN_MAX_BYTES, guard.DRAIN_MAX_S, guard.DRAIN_IDLE_S)
    assert drain == (values["ipc_drain_bytes"], values["ipc_drain_s"], values["ipc_drain_idle_s"])
    assert _BoundedFrames(lambda n: b"", True).limit == values["link_frame_max_bytes"]
    assert set(TABLE) == set(values) and all(limit(name) == values[name] for name in TABLE)


# --- every accepted send fits in one frame -------------------------------------------------------------------------

ids = st.text(string.ascii_letters + string.digits + "._:-", min_size=1, max_size=127).map(lambda s: "q" + s)
destinations = st.one_of(
    st.text(string.ascii_lowercase + string.digits + "._-", min_size=1, max_size=63).map(lambda s: "#a" + s[:62]),
    st.text("0123456789abcdef", min_size=64, max_size=64).map(lambda s: f"dm:{s}"),
    ids.map(lambda s: f"queue:{s}"),
)
meta_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(st.characters(blacklist_categories=("Cs",))),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=5), children, max_size=5),
    max_leaves=30,
)
messages = st.one_of(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=300),
                     st.integers(1, 400_000).map(lambda n: "\u00e9\x01\"" * n))


@settings(max_examples=150, deadline=None)
@given(to=destinations, message=messages, meta=st.dictionaries(st.text(max_size=10), meta_values, max_size=8),
       cmid=ids, reply=st.one_of(st.just(""), ids), priority=st.sampled_from(["now", "next", "low"]))
def test_every_accepted_send_fits_in_one_frame(to, message, meta, cmid, reply, priority):
    """LIMIT-CARRIABLE: a send whose stored payload is within send_payload_max_bytes (what the IPC accepts) makes a
    send frame, and a push frame at the broker, within link_frame_max_bytes: the 16 KiB reserve covers the members a
    frame adds to the payload (ids twice, the fingerprint, a sender name of 256 characters...)."""
    from reference.broker._delivery import push_frame
    from reference.broker.store import Delivery
    from reference.core.fingerprint import meta_canonical
    from reference.daemon.link import send_frame

    body = json.dumps({"to": to, "message": message, "meta": meta or None, "reply_to_id": reply or None,
                       "priority": priority}).encode()
    try:
        request = parse_send(body, cmid)
    except RequestError as exc:
        assert exc.code in ("meta_not_canonicalizable", "limit_exceeded"), exc.detail
        return
    payload = request.payload()
    reserve = limit("link_frame_max_bytes") - limit("send_payload_max_bytes")
    row = make_row("inflight", fingerprint=request.fingerprint(), payload=payload, client_message_id=cmid)
    frame = json.dumps(send_frame(row), separators=(",", ":"), ensure_ascii=False).encode()
    assert len(frame) <= len(payload) + reserve
    stored_meta = meta_canonical(request.meta).decode() or None
    delivery = Delivery(delivery_id=2**63 - 1, mesh_id="m" * 64, recipient_pubkey="ab" * 32, attempt=2**31,
                        lease_until_ms=0, broker_message_id="B" * 128, client_message_id=cmid, history_id="h" * 128,
                        sender_pubkey="cd" * 32, destination_kind=request.destination_kind,
                        destination_ref=request.destination_ref, priority=request.priority,
                        reply_to_id=request.reply_to_id, meta=json.loads(stored_meta) if stored_meta else None,
                        body=request.message, created_at_ms=2**41)
    push = json.dumps(push_frame(delivery, "n" * 256), separators=(",", ":"), ensure_ascii=False).encode()
    assert len(push) <= len(payload) + reserve


# --- transient acks (E-42) -----------------------------------------------------------------------------------------

POLICY = OutboxPolicy(retry_base_ms=500, retry_max_ms=30_000, jitter=0.25)


@pytest.mark.parametrize(("retry_after_ms", "expected"), [
    (None, 500), (5_000, 5_000), (10**9, 300_000), (10, 500), (-5, 500)])
def test_a_transient_ack_waits_at_least_retry_after(retry_after_ms, expected):
    """OBX-RETRY-LATER: ack_retry_later returns an inflight row to pending after the longer of its backoff and the
    ack's retry_after_ms (cut to retry_after_max_ms); a late one changes a pending row not at all; a 5xx's
    retry_after_ms is honoured by ack_failed too. The ack_events table maps 429, 408 and 425 to it and nothing else."""
    row = make_row("inflight", attempts=1)
    event = OutboxEvent("ack_retry_later", now=1_000, error="429 rate_limited", retry_after_ms=retry_after_ms)
    result = apply(row, event, POLICY)
    assert (result.table_row, result.after.status, result.after.last_error) == (
        "OB-INFLIGHT-RETRY-LATER", "pending", "429 rate_limited")
    assert result.after.next_attempt_at - 1_000 == max(expected, backoff_ms(1, POLICY))
    assert apply(make_row("pending"), event, POLICY).outcome == "ignore"
    failed = apply(row, OutboxEvent("ack_failed", now=1_000, retry_after_ms=retry_after_ms), POLICY)
    assert failed.after.next_attempt_at - 1_000 == max(expected, backoff_ms(1, POLICY))
    for status, kind in ((429, "ack_retry_later"), (408, "ack_retry_later"), (425, "ack_retry_later"),
                         (404, "ack_rejected"), (413, "ack_rejected"), (503, "ack_failed")):
        assert ack_event({"status": status, "error": "e"}).event == kind, status
