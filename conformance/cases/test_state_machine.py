"""A hypothesis state machine: the target and a model built from spec/tables, side by side.

Rules send requests (new ids, retries with the same request and with a different one, each first send answered by
the scripted broker with 201, 409 or another 4xx) and requeue rows. The model predicts every answer with the core's
§4.5.1 decision and every row's settled state with the outbox table; invariants compare the target's whole outbox
with the model after every step: same status per id, the fingerprint frozen, no id ever freed.

Every assertion names the requirement it checks (``[REQ] …``); the case records the first failure hypothesis shrinks
to against that requirement only.
"""

from __future__ import annotations

import json
import re
import time
from typing import ClassVar

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, multiple, rule

from conformance.cases._support import RECIPIENT, outbox_rows, unique, wait_row
from conformance.peer import conflict, reject
from conformance.registry import case
from conformance.verdict import Attributed
from conformance.wire import json_object
from reference.core import OutboxEvent, OutboxPolicy, TransitionError, apply, decide_send, new_row, parse_send
from spec import load_table

BODIES = {"A": {"to": RECIPIENT, "message": "variant A"}, "B": {"to": RECIPIENT, "message": "variant B"}}
ROW_REQUIREMENT = {row["id"]: row["requirements"][-1] for row in load_table("ipc_lookup")["rows"]}
TAGGED = re.compile(r"^\[(?P<req>[A-Z][A-Z0-9-]+)\] ")
PRINTS = {v: parse_send(json.dumps(b).encode()).fingerprint() for v, b in BODIES.items()}
OUTCOMES = {"created": None, "conflict": conflict(), "reject": reject(404, "destination_not_found")}
ACK_EVENT = {"created": "ack_created", "conflict": "ack_conflict", "reject": "ack_rejected"}
POLICY = OutboxPolicy()


class LookupMachine(RuleBasedStateMachine):
    """Bound to a live target by ``run_machine``."""

    api = None
    broker = None
    timing = None
    exercised: ClassVar[set[str]] = set()  # the requirements a passing check has seen (bound per run)
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
        requirement = ROW_REQUIREMENT[expected.table_row]
        assert response.status_code == expected.http_status, \
            f"[{requirement}] {expected.table_row}: expected {expected.http_status}, got {response.status_code} " \
            f"{response.text[:200]}"
        body = json_object(response)
        if expected.is_conflict:
            assert body.get("conflict") == expected.body["conflict"], \
                f"[{requirement}] {expected.table_row}: conflict {body.get('conflict')!r}"
            self.exercised.add(requirement)
            return
        self.exercised.add(requirement)
        if expected.insert:
            row = new_row("model", key, PRINTS[variant], b"", int(time.time() * 1000), POLICY)
            dispatched = apply(row, OutboxEvent("dispatch", now=1), POLICY).after
            settled = apply(dispatched, OutboxEvent(ACK_EVENT[outcome], now=2, broker_message_id="b"), POLICY).after
            self.model[key] = settled
            self.prints[key] = PRINTS[variant].hex()
            try:
                found = wait_row(self.api, key, settled.status, timeout=self.timing.settle_s())
            except AssertionError as exc:
                raise AssertionError(f"[OBX-BROKER-OUTCOMES] a first send answered {outcome}: {exc}") from exc
            self.daemon_ids[key] = found.get("id")
            self.exercised.add("OBX-BROKER-OUTCOMES")

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
            assert response.status_code == 409, \
                f"[REQUEUE-STATES] requeue of a {existing.status} row answered {response.status_code}"
            self.exercised.add("REQUEUE-STATES")
            return multiple(key)
        self.exercised.add("REQUEUE-STATES")
        assert response.status_code == 200, f"[REQUEUE-STATES] requeue of a {existing.status} row answered " \
                                             f"{response.status_code}: {response.text[:200]}"
        self.model[key] = predicted.after
        successor = predicted.successor
        dispatched = apply(successor, OutboxEvent("dispatch", now=4), POLICY).after
        self.model[fresh] = apply(dispatched, OutboxEvent("ack_created", now=5, broker_message_id="b"), POLICY).after
        self.prints[fresh] = self.prints.get(key)
        try:
            self.daemon_ids[fresh] = wait_row(self.api, fresh, "done", timeout=self.timing.settle_s()).get("id")
        except AssertionError as exc:
            raise AssertionError(f"[REQUEUE-STATES] the successor did not settle: {exc}") from exc
        return multiple(key, fresh)

    @invariant()
    def outbox_matches_model(self):
        if not self.model:
            return
        rows = {r.get("client_message_id"): r for r in outbox_rows(self.api)
                if r.get("client_message_id") in self.model}
        assert set(rows) == set(self.model), f"[ID-CONSUMED-NEVER-FREED] ids gone: {set(self.model) - set(rows)}"
        self.exercised.add("ID-CONSUMED-NEVER-FREED")
        for cmid, row in rows.items():
            assert row.get("status") == self.model[cmid].status, \
                f"[OBX-BROKER-OUTCOMES] {cmid} is {row.get('status')}, the tables say {self.model[cmid].status}"
            shown = row.get("request_fingerprint")
            if shown is not None:
                first = self.prints.setdefault(f"seen:{cmid}", shown)
                assert shown == first, f"[FP-FROZEN] {cmid}: fingerprint changed {first} -> {shown}"
                self.exercised.add("FP-FROZEN")


@case("ipc.state_machine", "IPC-CONFLICT-NO-MUTATION", "IPC-NEW-ROW", "IPC-PENDING-MATCH", "IPC-INFLIGHT-MATCH",
      "IPC-DONE-MATCH", "IPC-DONE-MISMATCH", "IPC-DEAD-MATCH", "OBX-BROKER-OUTCOMES", "REQUEUE-STATES",
      "REQUEUE-NEVER-FREES", "FP-FROZEN", "ID-CONSUMED-NEVER-FREED")
def test_state_machine(api, broker, verdict, timing):
    exercised: set[str] = set()
    machine = type("BoundLookupMachine", (LookupMachine,), {"api": api, "broker": broker, "timing": timing,
                                                            "exercised": exercised})
    test = machine.TestCase
    test.settings = settings(max_examples=6, stateful_step_count=10, deadline=None,
                             suppress_health_check=list(HealthCheck))
    runner = test("runTest")
    result = runner.defaultTestResult()
    runner.run(result)
    problems = result.failures + result.errors
    if not problems:
        for requirement in verdict.declared:
            if requirement in exercised:
                verdict.passed(requirement)
            else:
                verdict.skip(requirement, "no generated sequence reached it")
        return
    text = problems[0][1]
    message = next((line.split("AssertionError: ", 1)[1] for line in reversed(text.splitlines())
                    if "AssertionError: " in line), text.strip().splitlines()[-1])
    found = TAGGED.match(message)
    if found is None or found["req"] not in verdict.declared:
        raise AssertionError(f"the state machine failed: {message}\n{text[-1500:]}")
    verdict.expect(found["req"], False, f"{message} (the sequence hypothesis shrank to: {_steps(text)})")
    raise Attributed(message)


def _steps(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("state.")]
    return "; ".join(lines[:12])
