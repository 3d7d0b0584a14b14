"""The generator's decisions, every one taken from ``reference.core`` (and the spec's tables) once per input shape.

The tables are tiny and the simulation asks them millions of times, so each answer is memoised on the inputs the
table reads; a simulated row's own ids, times and bodies never reach a memo key. An outbox transition is applied by
the core once, to a representative row, and the simulation replays what the core changed (``Step``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from spec import load_table


class Step(NamedTuple):
    """What the core's outbox table does to a row in one state on one event: the columns a trace shows."""

    table_row: str
    to: str
    attempts_delta: int
    sets_broker_message_id: bool  # the row takes the ack's broker_message_id
    sets_superseded_by: bool  # the row names its successor (requeue)
    effects: tuple[str, ...]  # the IO effects the daemon performs


class Core:
    """Every decision the simulation makes, taken from ``reference.core`` once per input shape."""

    def __init__(self) -> None:
        from reference.core import OutboxPolicy, derive

        # E-14's default retry schedule (timing.yaml), and rows that age out within the hour
        self.policy = OutboxPolicy(max_age_hours=derive("retention_scoped", 7, override_hours=1).hours)
        self._ipc: dict[tuple[str, bool | None], tuple[str, int]] = {}
        self._transition: dict[tuple[str, str], Step | None] = {}
        self._broker: dict[tuple[str, ...], tuple[str, str, str]] = {}
        self._ack: dict[tuple[int, bool], str] = {}
        accept = load_table("broker_accept")
        self._status = {(phase, entry["check"]): int(entry["http_status"])
                        for phase, key in (("B1", "b1_checks"), ("B2", "b2_checks")) for entry in accept[key]}

    def ipc(self, state: str, match: bool | None) -> tuple[str, int]:
        """(table_row, http_status) of the §4.5.1 decision for a row in ``state`` (``none``: no row)."""
        key = (state, match)
        found = self._ipc.get(key)
        if found is None:
            from reference.core import OutboxRow, decide_send

            stored, other = b"\x01" * 32, b"\x02" * 32
            existing = None if state == "none" else OutboxRow(
                id="0" * 26, client_message_id="x", request_fingerprint=stored, payload=b"", enqueued_at=0,
                next_attempt_at=0, status=state)
            decision = decide_send(existing, stored if match in (None, True) else other, "x")
            found = self._ipc[key] = (decision.table_row, decision.http_status)
        return found

    def transition(self, state: str, event: str) -> Step | None:
        """The ``Step`` the outbox table takes for ``event`` on a row in ``state``; None when it ignores the event."""
        key = (state, event)
        if key in self._transition:
            return self._transition[key]
        from reference.core import OutboxEvent, OutboxRow, accepted, apply, new_row

        found: Step | None
        if state == "none":
            result = accepted(new_row("0" * 26, "x", b"\x01" * 32, b"", 0, self.policy))
            found = Step(result.table_row, "pending", 0, False, False, result.effects)
        else:
            row = OutboxRow(id="0" * 26, client_message_id="x", request_fingerprint=b"\x01" * 32, payload=b"",
                            enqueued_at=0, next_attempt_at=0, status=state, attempts=3)
            broker_message_id, successor_id = "b" * 26, "1" * 26
            result = apply(row, OutboxEvent(event, now=0, broker_message_id=broker_message_id, history_id="h",
                                            successor_id=successor_id, successor_client_message_id="y"), self.policy)
            if result.outcome != "transition":
                found = None
            else:
                after = result.after
                assert after is not None
                found = Step(result.table_row, after.status, after.attempts - row.attempts,
                             after.broker_message_id == broker_message_id, after.superseded_by == successor_id,
                             result.effects)
        self._transition[key] = found
        return found

    def broker(self, b1: str, drift: str, claim: str, fingerprint: str, b2: str, commit: str
               ) -> tuple[str, str, str]:
        """(table_row, phase, http_status) of the broker's accept decision (spec/tables/broker_accept.yaml)."""
        key = (b1, drift, claim, fingerprint, b2, commit)
        found = self._broker.get(key)
        if found is None:
            from reference.core import settle

            settled = settle(b1=b1, drift=drift, claim=claim, fingerprint=fingerprint, b2=b2, commit=commit)
            assert settled is not None
            found = self._broker[key] = (settled.table_row, settled.phase, settled.http_status)
        return found

    def ack(self, status: int, history_available: bool = True) -> str:
        """The outbox event a broker ack with ``status`` is (spec/tables/ack_events.yaml)."""
        key = (status, history_available)
        found = self._ack.get(key)
        if found is None:
            from reference.core import ack_event

            found = self._ack[key] = ack_event({"status": status, "history_available": history_available}).event
        return found

    def check_status(self, phase: str, check: str) -> int:
        """The HTTP status of a failed B1 or B2 ``check`` (spec/tables/broker_accept.yaml)."""
        return self._status[(phase, check)]

    def max_age_at(self, enqueued_at: int) -> int:
        """The ``max_age_at`` of a row enqueued at ``enqueued_at`` under the policy's max age (E-14)."""
        from reference.core.maxage import max_age_at

        return max_age_at(enqueued_at, self.policy.max_age_hours)

    @staticmethod
    def expired(row: Any, now: int) -> bool:
        """Whether ``now`` is past ``row``'s ``max_age_at`` (E-14; ``row`` is any row with one)."""
        from reference.core import is_expired

        return is_expired(row, now)

    def backoff(self, attempts: int, jitter_unit: float) -> int:
        from reference.core import backoff_ms

        return backoff_ms(attempts, self.policy, jitter_unit)

    @staticmethod
    def fingerprint(destination_kind: str, destination_ref: str, body: str) -> bytes:
        from reference.core import FingerprintInput, request_fingerprint
        from reference.core.request import DEFAULT_PRIORITY

        return request_fingerprint(FingerprintInput(destination_kind, destination_ref, "", DEFAULT_PRIORITY, None,
                                                    body))
