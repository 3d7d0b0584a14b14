"""A hypothesis state machine: the target and a model built from spec/tables, side by side.

Rules send requests (new ids, retries with the same request and with a different one, each first send answered by
the scripted broker with 201, 409 or another 4xx) and requeue rows. The model predicts every answer with the core's
§4.5.1 decision and every row's settled state with the outbox table; invariants compare the target's whole outbox
with the model after every step: same status per id, the fingerprint frozen, no id ever freed.
"""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, multiple, rule

from conformance.cases._support import outbox_rows, unique, wait_row
from conformance.peer import conflict, reject
from conformance.registry import case
from reference.core import OutboxEvent, OutboxPolicy, apply, decide_send, new_row, parse_send
from reference.core.outbox import TransitionError

BODIES = {"A": {"to": "#general", "message": "variant A"}, "B": {"to": "#general", "message": "variant B"}}
PRINTS = {v: parse_send(json.dumps(b).encode()).fingerprint() for v, b in BODIES.items()}
OUTCOMES = {"created": None, "conflict": conflict(), "reject": reject(404, "destination_not_found")}
ACK_EVENT = {"created": "ack_created", "conflict": "ack_conflict", "reject": "ack_rejected"}
POLICY = OutboxPolicy()


class LookupMachine(RuleBasedStateMachine):
    """Bound to a live target by ``run_machine``."""

    api = None
    broker = None
    keys = Bundle("keys")

    def __init__(self):
        super().__init__()
        self.model: dict[str, object] = {}  # cmid -> the model's OutboxRow
        self.daemon_ids: dict[str, str] = {}  # cmid -> the target's row id
        self.prints: dict[str, str] = {}

    @initialize(target=keys)
    def first_key(self):
        return unique("sm")

    @rule(target=keys)
    def new_key(self):
        return unique("sm")

    @rule(key=keys, variant=st.sampled_from(["A", "B"]), outcome=st.sampled_from(sorted(OUTCOMES)))
    def send(self, key, variant, outcome):
        existing = self.model.get(key)
        expected = decide_send(existing, PRINTS[variant], key)
        if existing is None and OUTCOMES[outcome] is not None:
            self.broker.answer(key, OUTCOMES[outcome])
        response = self.api.post("/v1/send", json=BODIES[variant], headers={"Idempotency-Key": key})
        assert response.status_code == expected.http_status, (expected.table_row, response.text)
        body = response.json()
        if expected.is_conflict:
            assert body["conflict"] == expected.body["conflict"], expected.table_row
            return
        assert body["duplicate"] is (not expected.insert)
        if expected.insert:
            row = new_row("model", key, PRINTS[variant], b"", int(time.time() * 1000), POLICY)
            dispatched = apply(row, OutboxEvent("dispatch", now=1), POLICY).after
            settled = apply(dispatched, OutboxEvent(ACK_EVENT[outcome], now=2, broker_message_id="b"), POLICY).after
            self.model[key] = settled
            self.prints[key] = PRINTS[variant].hex()
            found = wait_row(self.api, key, settled.status)
            self.daemon_ids[key] = found["id"]

    @rule(target=keys, key=consumes(keys))
    def requeue(self, key):
        existing = self.model.get(key)
        if existing is None:
            return multiple(key)
        fresh = unique("sm-requeued")
        try:
            event = OutboxEvent("requeue", now=3, successor_id="s", successor_client_message_id=fresh)
            predicted = apply(existing, event, POLICY)
        except TransitionError:
            return multiple(key)
        response = self.api.post("/v1/outbox/requeue", json={"id": self.daemon_ids[key],
                                                              "new_client_message_id": fresh})
        if predicted.outcome == "reject":
            assert (response.status_code, response.json()["error"]) == (409, predicted.error)
            return multiple(key)
        assert response.status_code == 200, response.text
        self.model[key] = predicted.after
        successor = predicted.successor
        dispatched = apply(successor, OutboxEvent("dispatch", now=4), POLICY).after
        self.model[fresh] = apply(dispatched, OutboxEvent("ack_created", now=5, broker_message_id="b"), POLICY).after
        self.prints[fresh] = self.prints[key]
        self.daemon_ids[fresh] = wait_row(self.api, fresh, "done")["id"]
        return multiple(key, fresh)

    @invariant()
    def outbox_matches_model(self):
        if not self.model:
            return
        rows = {r["client_message_id"]: r for r in outbox_rows(self.api) if r["client_message_id"] in self.model}
        assert set(rows) == set(self.model), "an id the target had consumed is gone"
        for cmid, row in rows.items():
            assert row["status"] == self.model[cmid].status, (cmid, row["status"], self.model[cmid].status)
            assert row["request_fingerprint"] == self.prints[cmid], f"{cmid}: fingerprint changed"


@case("ipc.state_machine", "IPC-CONFLICT-NO-MUTATION", "IPC-NEW-ROW", "IPC-DONE-MATCH", "IPC-DEAD-MATCH",
      "OBX-BROKER-OUTCOMES", "REQUEUE-STATES", "REQUEUE-NEVER-FREES", "FP-FROZEN", "ID-CONSUMED-NEVER-FREED")
def test_state_machine(api, broker):
    machine = type("BoundLookupMachine", (LookupMachine,), {"api": api, "broker": broker})
    test = machine.TestCase
    test.settings = settings(max_examples=6, stateful_step_count=10, deadline=None,
                             suppress_health_check=list(HealthCheck))
    runner = test("runTest")
    result = runner.defaultTestResult()
    runner.run(result)
    problems = result.failures + result.errors
    if problems:
        pytest.fail(problems[0][1], pytrace=False)
