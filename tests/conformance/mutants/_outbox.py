"""Mutants of the outbox lifecycle, the broker link and feature negotiation (broker_link, outbox_store, create_app).

A ``broker_link`` mutant subclasses ``BrokerLink`` and overrides one method: ``_on_acks`` (what an ack means),
``_send_many`` (the frames on the wire), ``_perform`` (a transition's effects), ``_expect``/``_send`` (the handshake),
``_refuse`` or ``_apply_max_age``. An ``outbox_store`` mutant subclasses ``OutboxStore``: its retry policy, its crash
recovery, its requeue, its max age.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace

from . import mutant


def _acks(change):
    """A BrokerLink whose incoming acks pass through ``change(link, frames) -> frames`` before they are applied."""
    from reference.daemon.link import BrokerLink

    class Link(BrokerLink):
        def _on_acks(self, frames):
            return super()._on_acks(change(self, frames))

    return Link


def _status(frame) -> int | None:
    status = frame.get("status")
    return status if isinstance(status, int) and not isinstance(status, bool) else None


# --- broker outcomes (E-10, E-17) --------------------------------------------------------------------------------


@mutant("ignores-409-from-broker", "a 409 ack is treated like a 5xx: the row is retried instead of going dead",
        kills=("OBX-BROKER-OUTCOMES",), select=("outbox.broker_outcome",), seam="broker_link", est_s=45)
def _ignores_409():
    return _acks(lambda link, frames: [{**f, "status": 503} if _status(f) == 409 else f for f in frames])


@mutant("permanent-4xx-retried", "a 4xx ack other than 409 (404, 413) is retried instead of going dead",
        kills=("OBX-BROKER-OUTCOMES",), select=("outbox.broker_outcome",), seam="broker_link", est_s=45)
def _permanent_4xx_retried():
    return _acks(lambda link, frames: [{**f, "status": 503} if 400 <= (_status(f) or 0) < 500 and _status(f) != 409
                                       else f for f in frames])


@mutant("status-less-ack-is-success", "an ack without a status (schema-invalid) is taken as 201 created",
        kills=("WS-ACK-STATUS",), select=("outbox.transient_failures",), seam="broker_link", est_s=20)
def _status_less_ack_is_success():
    return _acks(lambda link, frames: [f if "status" in f else
                                       {**{k: v for k, v in f.items() if k != "_invalid"}, "status": 201}
                                       for f in frames])


def _late(link, frame) -> bool:
    return (frame.get("client_message_id") or frame.get("id")) not in link._deadlines


@mutant("late-ack-ignored", "an ack for a row no longer awaiting one (it timed out back to pending) is dropped",
        kills=("OBX-LATE-ACK",), select=("outbox.late_ack",), seam="broker_link", est_s=25)
def _late_ack_ignored():
    return _acks(lambda link, frames: [f for f in frames if not _late(link, f)])


@mutant("late-non-201-ack-ignored",
        "a late ack is applied only when it is a success: a late 409 or other 4xx leaves the row pending",
        kills=("OBX-LATE-ACK",), select=("outbox.late_ack",), seam="broker_link", est_s=25)
def _late_non_201_ack_ignored():
    return _acks(lambda link, frames: [f for f in frames if not _late(link, f) or _status(f) in (200, 201)])


@mutant("retry-rederives-request",
        "a retry re-derives the send frame with priority escalated to `now` (and a fingerprint to match) instead of "
        "re-sending the stored bytes", kills=("WS-SEND-SAME-BYTES",), select=("outbox.transient_failures",),
        seam="broker_link", est_s=20)
def _retry_rederives_request():
    from reference.core.fingerprint import FingerprintInput, request_fingerprint
    from reference.daemon.link import BrokerLink

    class Link(BrokerLink):
        def _send_many(self, ws, texts):
            changed = []
            for text in texts:
                frame = json.loads(text)
                row = self.outbox.get_by_client_message_id(frame["client_message_id"])
                if row is not None and row.attempts >= 2:
                    item = FingerprintInput(frame["destination_kind"], frame["destination_ref"],
                                            frame["reply_to_id"] or "", "now", frame["meta"], frame["body"])
                    frame = {**frame, "priority": "now", "request_fingerprint": request_fingerprint(item).hex()}
                    text = json.dumps(frame, separators=(",", ":"), ensure_ascii=False)
                changed.append(text)
            return super()._send_many(ws, changed)

    return Link


@mutant("no-dead-event", "a row going dead is not announced with an outbox_dead SSE event",
        kills=("OBX-DEAD-EVENT",), select=("outbox.dead_event",), seam="broker_link", est_s=15)
def _no_dead_event():
    from reference.daemon.link import BrokerLink

    class Link(BrokerLink):
        def _perform(self, result):
            return super()._perform(replace(result, effects=tuple(e for e in result.effects
                                                                  if e != "emit_outbox_dead")))

    return Link


# --- retries (E-14) ----------------------------------------------------------------------------------------------


def _policy(change):
    """An OutboxStore whose retry policy is ``change(configured policy)``."""
    from reference.daemon.store import OutboxStore

    class Store(OutboxStore):
        def __init__(self, path, policy, *args, **kwargs):
            super().__init__(path, change(policy), *args, **kwargs)

    return Store


@mutant("backoff-non-growing", "every retry waits the base delay: the backoff never grows",
        kills=("OBX-BACKOFF",), select=("outbox.backoff",), seam="outbox_store", est_s=20)
def _backoff_non_growing():
    return _policy(lambda policy: replace(policy, retry_max_ms=policy.retry_base_ms))


@mutant("backoff-no-cap", "the backoff doubles without bound: retry_max_ms is never applied",
        kills=("OBX-BACKOFF",), select=("outbox.backoff",), seam="outbox_store", est_s=30)
def _backoff_no_cap():
    return _policy(lambda policy: replace(policy, retry_max_ms=2**31))


@mutant("backoff-wrong-base",
        "the exponent starts at 1: after the n-th failure a row waits min(max, base·2^n), twice the schedule",
        kills=("OBX-BACKOFF",), select=("outbox.backoff",), seam="outbox_store", est_s=20)
def _backoff_wrong_base():
    return _policy(lambda policy: replace(policy, retry_base_ms=policy.retry_base_ms * 2))


# --- max age (§4.9, E-05, E-14) ----------------------------------------------------------------------------------


@mutant("no-max-age", "rows never age out: no max_age_at is set and the negotiated max age is not applied",
        kills=("OBX-MAX-AGE-DEAD",), select=("outbox.max_age",), seam="outbox_store", est_s=45)
def _no_max_age():
    from reference.daemon.store import OutboxStore

    class Store(OutboxStore):
        def __init__(self, path, policy, *args, **kwargs):
            super().__init__(path, replace(policy, max_age_hours=None), *args, **kwargs)

        def cap_max_age(self, max_age_hours):
            return 0

    return Store


@mutant("max-age-without-margin",
        "in retention_scoped mode the max age is the whole dedupe window (days·24 h), without E-05's safety margin",
        kills=("MAXAGE-DERIVATION", "MAXAGE-INSIDE-WINDOW"), select=("outbox.max_age",), seam="broker_link", est_s=45)
def _max_age_without_margin():
    from reference.daemon.link import BrokerLink

    class Link(BrokerLink):
        def _apply_max_age(self):
            dedupe = self.state.negotiated.get("client_message_id_dedupe", {})
            if dedupe.get("mode") != "retention_scoped":
                return super()._apply_max_age()
            hours = int(dedupe["dedupe_retention_days"]) * 24
            self.state.max_age_hours = hours
            self.outbox.cap_max_age(hours)
            return None

    return Link


# --- crash recovery (§4.11, E-16) --------------------------------------------------------------------------------


@mutant("inflight-never-recovered", "crash recovery leaves inflight rows inflight (recover() does nothing)",
        kills=("REC-INFLIGHT-TO-PENDING",), select=("recovery.kill9_inflight",), seam="outbox_store", est_s=45)
def _inflight_never_recovered():
    from reference.daemon.store import OutboxStore

    class Store(OutboxStore):
        def recover(self, now_ms):
            return []

    return Store


@mutant("recovery-first-row-only", "crash recovery returns only the oldest inflight row to pending",
        kills=("REC-INFLIGHT-TO-PENDING",), select=("recovery.kill9_inflight",), seam="outbox_store", est_s=45)
def _recovery_first_row_only():
    from reference.core import OutboxEvent
    from reference.daemon.store import OutboxStore

    class Store(OutboxStore):
        def recover(self, now_ms):
            taken: list = []
            return self._apply_each("status = 'inflight'", (), OutboxEvent("crash_recovery", now_ms),
                                    keep=lambda row: not taken and not taken.append(row))

    return Store


@mutant("recovery-increments-attempts", "crash recovery counts an attempt: each recovered row's attempts grows by one",
        kills=("REC-ATTEMPTS-UNCHANGED",), select=("recovery.kill9_inflight",), seam="outbox_store", est_s=45)
def _recovery_increments_attempts():
    from reference.daemon.store import OutboxStore

    class Store(OutboxStore):
        def recover(self, now_ms):
            results = super().recover(now_ms)
            with self._transaction() as conn:
                for result in results:
                    if result.outcome == "transition":
                        conn.execute("UPDATE outbox SET attempts = attempts + 1 WHERE id = ?", (result.after.id,))
            return results

    return Store


# --- requeue (§4.5.3, E-09) --------------------------------------------------------------------------------------


@mutant("requeue-frees-id", "requeue deletes the old row instead of marking it aborted: its id is free again",
        kills=("REQUEUE-NEVER-FREES", "ID-CONSUMED-NEVER-FREED"), select=("outbox.requeue",), seam="outbox_store",
        est_s=20)
def _requeue_frees_id():
    from reference.daemon.store import OutboxStore

    class Store(OutboxStore):
        def requeue(self, outbox_id, *args, **kwargs):
            result = super().requeue(outbox_id, *args, **kwargs)
            if result.outcome == "transition":
                with self._transaction() as conn:
                    conn.execute("DELETE FROM outbox WHERE id = ?", (outbox_id,))
            return result

    return Store


@mutant("requeue-done-allowed", "a done row can be requeued (it is aborted and sent again under a new id)",
        kills=("REQUEUE-STATES-REFUSED",), select=("outbox.requeue",), seam="outbox_store", est_s=20)
def _requeue_done_allowed():
    from reference.core import apply
    from reference.core.outbox import replace as replace_row
    from reference.daemon.store import OutboxStore

    class Store(OutboxStore):
        def transition(self, key, event, *, by=None):
            if event.name != "requeue":
                return super().transition(key, event, by=by)
            traced: list = []
            with self._transaction(traced) as conn:
                row = self._resolve(conn, key, by)
                if row.status == "done":
                    row = replace_row(row, status="dead")  # requeued as if it had failed
                result = apply(row, event, self.policy)
                if result.outcome == "transition":
                    self._persist(conn, result)
                traced.append(result)
            return result

    return Store


@mutant("requeue-minted-uuid", "a requeue without new_client_message_id mints a UUIDv4 for the successor, not a ULID",
        kills=("REQUEUE-FRESH-ID",), select=("outbox.requeue",), seam="create_app", est_s=20)
def _requeue_minted_uuid():
    from reference.daemon.app import create_app

    def build(ctx, requeue):
        def requeue_with_uuid(outbox_id, new_client_message_id, actor):
            return requeue(outbox_id, new_client_message_id or str(uuid.uuid4()), actor)

        return create_app(ctx, requeue_with_uuid)

    return build


# --- feature negotiation (§15, E-06, E-07, E-08) -----------------------------------------------------------------


def _negotiation(change):
    """A BrokerLink that judges ``change(feature_negotiation_response)`` instead of what the broker sent."""
    from reference.daemon.link import BrokerLink

    class Link(BrokerLink):
        def _expect(self, ws, kind):
            frame = super()._expect(ws, kind)
            return change(frame) if kind == "feature_negotiation_response" else frame

    return Link


def _dedupe_params(response) -> dict:
    return ((response.get("supported") or {}).get("client_message_id_dedupe") or {}).get("params") or {}


@mutant("retention-floor-ignored", "a dedupe_retention_days below the daemon's floor (3) is taken as the floor",
        kills=("NEG-PARAM-VALIDATION", "NEG-CLOSE-4010"), select=("negotiation.refused",), seam="broker_link", est_s=60)
def _retention_floor_ignored():
    def change(response):
        params = _dedupe_params(response)
        days = params.get("dedupe_retention_days")
        if isinstance(days, int) and not isinstance(days, bool) and 1 <= days < 3:
            params["dedupe_retention_days"] = 3
        return response

    return _negotiation(change)


@mutant("integer-param-as-string-accepted", "dedupe_retention_days sent as a string of digits (\"7\") is accepted",
        kills=("NEG-PARAM-KINDS", "NEG-CLOSE-4010"), select=("negotiation.refused",), seam="broker_link",
        est_s=60)
def _integer_param_as_string_accepted():
    def change(response):
        params = _dedupe_params(response)
        days = params.get("dedupe_retention_days")
        if isinstance(days, str) and days.isdigit():
            params["dedupe_retention_days"] = int(days)
        return response

    return _negotiation(change)


@mutant("required-bit-missing-accepted",
        "a required bit other than client_message_id_dedupe that the broker lacks is treated as optional",
        kills=("NEG-CLOSE-4010",), select=("negotiation.refused",), seam="broker_link", est_s=60)
def _required_bit_missing_accepted():
    def change(response):
        supported = response.setdefault("supported", {})
        for bit in ("concurrent_connection_policy",):
            if bit not in supported:
                supported[bit] = {"params": {"version": 1}}
        response["missing_required"] = [b for b in response.get("missing_required") or []
                                         if b == "client_message_id_dedupe"]
        return response

    return _negotiation(change)


@mutant("negotiation-close-1000", "a failed negotiation closes the socket with 1000 instead of 4010",
        kills=("NEG-CLOSE-4010",), select=("negotiation.refused",), seam="broker_link", est_s=60)
def _negotiation_close_1000():
    from reference.daemon import link

    class Link(link.BrokerLink):
        def _refuse(self, ws, reason, negotiation):
            link._close_quietly(ws, 1000, reason.close_payload())
            raise link.Fatal("feature_negotiation_failed",
                             f"feature negotiation failed: {reason.kind} {reason.feature}")

    return Link


ASSUMED = {  # what a daemon that never asks assumes the broker grants
    "type": "feature_negotiation_response",
    "supported": {"client_message_id_dedupe": {"params": {"version": 1, "mode": "permanent",
                                                          "request_fingerprint": True}},
                  "concurrent_connection_policy": {"params": {"version": 1}}},
    "missing_required": [],
}


@mutant("negotiation-skipped",
        "no feature_negotiation_request is ever sent: after hello_ack the daemon assumes the broker grants what it "
        "requires and starts sending", kills=("NEG-ORDER", "NEG-CLOSE-4010"),
        select=("negotiation.order", "negotiation.refused"), seam="broker_link", est_s=90)
def _negotiation_skipped():
    import copy

    from reference.daemon.link import BrokerLink

    class Link(BrokerLink):
        def _send(self, ws, frame):
            if frame.get("type") != "feature_negotiation_request":
                super()._send(ws, frame)

        def _expect(self, ws, kind):
            return copy.deepcopy(ASSUMED) if kind == "feature_negotiation_response" else super()._expect(ws, kind)

    return Link
