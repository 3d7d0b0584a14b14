"""What the broker cases share: ids, joining members, reading acks without trusting their shape, the clock budget.

Rules of this file. A helper never raises because of what the broker answered: it returns ``None`` (no ack), a
summary string for a report, or ends the node through the ``verdict`` (``blocked`` when a precondition the broker
had to provide did not hold — a member could not join, a committed send was never acknowledged).
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime
from typing import Any

import pytest

from conformance.member import Member
from conformance.store_inventory import RUN_PREFIX
from conformance.verdict import Verdicts
from spec import load_table, validator

ACK = validator("broker/ack")
PUSH = validator("broker/push")
NEGOTIATION = validator("broker/feature_negotiation_response")
TOPIC = "#meshconform"
DAY_MS = 86_400_000
#: E-22: a hello whose timestamp is more than this far from the broker's clock is refused 4002 (limits.yaml)
HELLO_SKEW_S = float(load_table("limits")["limits"]["broker_hello_skew_s"]["value"])
#: how long an ack, a close or a first push may take on a loaded machine
ANSWER_S = 10.0
#: how long a broker may take to close a connection it must refuse
CLOSE_S = 5.0
#: what a case keeps free of its timeout for its own steps after its longest wait
CASE_MARGIN_S = 15.0


def cmid(label: str) -> str:
    """A fresh client_message_id of this run (the store inventory judges exactly these)."""
    return f"{RUN_PREFIX}{label}-{uuid.uuid4().hex[:12]}"


def fresh_name(prefix: str = "mc") -> str:
    """A topic or queue name nobody used before (E-18 grammar)."""
    return f"{prefix}-{uuid.uuid4().hex[:16]}"


def stranger() -> str:
    """A 64-hex public key no member has."""
    return uuid.uuid4().hex + uuid.uuid4().hex


def join(member, verdict: Verdicts, requirements: tuple[str, ...], name: str = "meshconform") -> Member:
    """A member that finished hello and negotiation; otherwise the node's ``requirements`` are not checkable."""
    peer = member(name=name).open()
    if not peer.joined:
        verdict.blocked(requirements, f"a fresh member's honest hello was not answered with hello_ack and a "
                                      f"feature_negotiation_response (close {peer.close_code} {peer.close_reason!r}); "
                                      "broker.hello.auth and broker.negotiation.advertise say why")
    return peer


def summary(ack: dict[str, Any] | None) -> str:
    """An ack in a few words, for a report."""
    if ack is None:
        return "no ack"
    keys = ("status", "error", "conflict", "duplicate", "broker_message_id", "history_id", "first_seen_at",
            "broker_fingerprint_prefix")
    return "{" + ", ".join(f"{k}={ack[k]!r}" for k in keys if k in ack) + "}"


def status(ack: dict[str, Any] | None) -> Any:
    return None if ack is None else ack.get("status")


def shape_problems(frames: list[dict[str, Any] | None], validator_=ACK) -> list[str]:
    """Schema problems of the frames that came (E-10, E-28), one line each."""
    problems = []
    for frame in frames:
        if frame is None:
            continue
        errors = [e.message for e in validator_.iter_errors(frame)]
        if errors:
            problems.append(f"{summary(frame)}: {errors[0][:160]}")
    return problems


def record_shape(verdict: Verdicts, acks: list[dict[str, Any] | None], requirement: str = "WS-ACK-STATUS") -> None:
    """Every ack that came matches spec/schemas/broker/ack.json."""
    problems = shape_problems(acks)
    came = [a for a in acks if a is not None]
    if came:
        verdict.expect(requirement, not problems, f"{len(problems)} of {len(came)} acks outside the E-10 ack "
                                                  f"schema: {'; '.join(problems[:3])}")


def rfc3339_ms(text: Any) -> int | None:
    """An RFC 3339 time as unix milliseconds; None when it is not one."""
    if not isinstance(text, str):
        return None
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return round(parsed.timestamp() * 1000) if parsed.tzinfo is not None else None


def first_acks(waits: list[tuple[Any, str]], quiet_s: float = ANSWER_S, poll_s: float = 0.01,
               clock: Any = time.monotonic, sleep: Any = time.sleep) -> list[dict[str, Any] | None]:
    """The first ack of each (member, client_message_id), waited for together. The wait ends when each has its ack
    (or its connection closed), or ``quiet_s`` after the last new one: a broker that serialises racing accepts (one
    lock, one writer at a time) answers them one after another, and is judged by whether it keeps answering, not
    by whether the last of them fits in one member's wait."""
    def firsts() -> list[dict[str, Any] | None]:
        return [next(iter(member.acks(key)), None) for member, key in waits]

    found = firsts()
    last_new = clock()
    while any(ack is None and not member.closed for ack, (member, _) in zip(found, waits, strict=True)):
        if clock() - last_new >= quiet_s:
            break
        sleep(poll_s)
        now = firsts()
        if sum(ack is not None for ack in now) > sum(ack is not None for ack in found):
            last_new = clock()
        found = now
    return firsts()


def budget_s(request: pytest.FixtureRequest) -> float:
    """How long this node may still wait: its case timeout (or what is left of the run), less a margin."""
    from conformance.plugin import STATE, case_timeout_s

    state = request.config.stash[STATE]
    return min(case_timeout_s(state), state.remaining_s) - CASE_MARGIN_S


def dedupe_params(peer: Member) -> dict[str, Any] | None:
    """The advertised client_message_id_dedupe params, or None."""
    supported = (peer.negotiation or {}).get("supported")
    entry = supported.get("client_message_id_dedupe") if isinstance(supported, dict) else None
    params = entry.get("params") if isinstance(entry, dict) else None
    return params if isinstance(params, dict) else None


def inline_limit(peer: Member) -> int | None:
    """The advertised max_payload.inline_bytes, or None."""
    supported = (peer.negotiation or {}).get("supported")
    entry = supported.get("max_payload") if isinstance(supported, dict) else None
    params = entry.get("params") if isinstance(entry, dict) else None
    value = params.get("inline_bytes") if isinstance(params, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
