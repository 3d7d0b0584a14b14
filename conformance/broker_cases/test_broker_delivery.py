"""Delivery: only committed messages are pushed, an unacknowledged push comes again after its lease, and only the
recipient's own client_ack naming the delivery settles it.

Theory of operation. One lease wait serves every check. A sender sends five DMs to a receiver; each gets its first
push. Then, at once: the receiver acknowledges ``acked`` properly; another member acknowledges ``foreign`` with the
receiver's delivery_id and ids; the receiver acknowledges ``wrong_delivery_id`` with a delivery_id that names none of
its deliveries and ``wrong_message_id`` with a brokerMessageId of no message; ``control`` is never acknowledged. A
push counts for a role only when it carries that send's client_message_id *and* the broker_message_id its ack named
(a push of anything else is a leak, judged apart). When ``control`` comes again (BRK-REDELIVER: same delivery_id, a
higher attempt), the three wrongly acknowledged ones must have come again too, give or take a short grace
(BRK-CLIENT-ACK). When ``control`` comes a third time, ``acked`` must not have come more than once after its ack (one
push may have been in flight). Sends to the receiver that the broker refused — a drifted fingerprint, an oversized
body, another body under ``control``'s id — are never pushed (BRK-DELIVERY-COMMITTED).

The lease is the broker target's ``lease_for`` (--lease-s, else advertised, else the default): the waits are bounded
by twice and three times the lease plus a margin, and the case says so when its timeout cannot hold them.
"""

from __future__ import annotations

import uuid

from conformance.broker_cases._support import (
    ANSWER_S,
    PUSH,
    budget_s,
    cmid,
    first_acks,
    inline_limit,
    join,
    status,
    summary,
)
from conformance.member import send_frame
from conformance.registry import case

ROLES = ("control", "acked", "foreign", "wrong_delivery_id", "wrong_message_id")
REQUIREMENTS = ("BRK-DELIVERY-COMMITTED", "BRK-REDELIVER", "BRK-REDELIVER-LEASE", "BRK-CLIENT-ACK")


def _unused_delivery_id(seen: set[str], real: str) -> str:
    """A delivery_id that names none of the receiver's deliveries (digits if the broker's are digits)."""
    if real.isdigit():
        candidate = int(real) + 1_000_003
        while str(candidate) in seen:
            candidate += 1
        return str(candidate)
    return f"{real}x{uuid.uuid4().hex[:6]}"[:128]


def _unused_message_id() -> str:
    return "01" + uuid.uuid4().hex[:24].upper()  # a ULID-shaped broker_message_id no message has


@case("broker.delivery", "BRK-DELIVERY-COMMITTED", "BRK-REDELIVER", "BRK-REDELIVER-LEASE", "BRK-CLIENT-ACK")
def test_delivery_redelivers_until_the_recipient_acks(broker_target, member, verdict, request):
    receiver = join(member, verdict, REQUIREMENTS, "receiver")
    sender = join(member, verdict, REQUIREMENTS, "sender")
    other = join(member, verdict, REQUIREMENTS, "other")
    lease_s, source = broker_target.lease_for(receiver.negotiation)
    second_s = broker_target.redelivery_wait_s(lease_s)
    grace_s = min(10.0, max(2.0, 0.1 * lease_s))

    keys = {role: cmid(f"deliver-{role}") for role in ROLES}
    for role in ROLES:
        sender.send(send_frame(keys[role], receiver.pubkey, f"delivery {role}"))
    acks = dict(zip(ROLES, first_acks([(sender, keys[role]) for role in ROLES]), strict=True))
    not_accepted = {role: summary(ack) for role, ack in acks.items() if status(ack) != 201}
    if not_accepted:
        verdict.blocked(REQUIREMENTS, f"DMs to a connected member were not accepted: {not_accepted}")

    def delivered(role: str) -> list[dict]:
        """The pushes of that send: its client_message_id and the broker_message_id its ack named."""
        message = acks[role].get("broker_message_id")
        return [p for p in receiver.pushes(keys[role]) if p.get("messageId") == message]

    refused_bodies = {}
    drift = send_frame(cmid("deliver-drift"), receiver.pubkey, "refused: a drifted fingerprint", claimed="ab" * 32)
    refused = [drift, send_frame(keys["control"], receiver.pubkey, "refused: another body under control's id")]
    limit = inline_limit(receiver)
    if limit is not None:
        refused.append(send_frame(cmid("deliver-big"), receiver.pubkey, "z" * (limit + 1)))
    for frame in refused:
        sender.send(frame)
        number = 2 if frame["client_message_id"] == keys["control"] else 1
        answer = sender.ack(frame["client_message_id"], number)
        if answer is not None and status(answer) not in (200, 201):
            refused_bodies[frame["body"]] = summary(answer)

    first = {}
    for role in ROLES:
        pushes = receiver.poll(lambda role=role: delivered(role), ANSWER_S)
        if not pushes:
            verdict.expect("BRK-REDELIVER", False, f"the committed DM {role!r} was not pushed to its connected "
                                                   f"recipient within {ANSWER_S:g} s")
            verdict.blocked(REQUIREMENTS, "a committed message was never pushed")
        first[role] = pushes[0]
    malformed = [f"{role}: {e.message}" for role, push in first.items() for e in list(PUSH.iter_errors(push))[:1]]
    if any(not isinstance(push.get("delivery_id"), str) for push in first.values()):
        verdict.blocked(REQUIREMENTS, f"pushes without a delivery_id cannot be acknowledged: {malformed[:2]}")

    seen_ids = {str(push.get("delivery_id")) for push in receiver.pushes()}
    acked_attempt = max([p["attempt"] for p in delivered("acked") if isinstance(p.get("attempt"), int)] or [1])
    receiver.client_ack(first["acked"])
    other.client_ack(first["foreign"])
    receiver.client_ack(first["wrong_delivery_id"],
                        delivery_id=_unused_delivery_id(seen_ids, first["wrong_delivery_id"]["delivery_id"]))
    receiver.client_ack(first["wrong_message_id"], brokerMessageId=_unused_message_id())

    # --- the lease lapses once: control, and every wrongly acknowledged delivery, come again -------------------------
    if second_s > budget_s(request):
        verdict.blocked(["BRK-REDELIVER", "BRK-REDELIVER-LEASE", "BRK-CLIENT-ACK"],
                        f"a redelivery may take {second_s:g} s with a lease of {lease_s:g} s ({source}), more than the "
                        "case timeout leaves: raise --case-timeout")
    again = receiver.poll(lambda: len(delivered("control")) >= 2, second_s)
    pushes = delivered("control")
    if not again:
        verdict.expect("BRK-REDELIVER", False, f"an unacknowledged push was not delivered again within {second_s:g} s "
                                               f"(twice the lease of {lease_s:g} s, {source}, plus a margin)")
    else:
        verdict.passed("BRK-REDELIVER")
        verdict.expect("BRK-REDELIVER-LEASE", pushes[1].get("delivery_id") == pushes[0].get("delivery_id")
                       and isinstance(pushes[1].get("attempt"), int) and isinstance(pushes[0].get("attempt"), int)
                       and pushes[1]["attempt"] > pushes[0]["attempt"],
                       f"the redelivery has delivery_id {pushes[1].get('delivery_id')!r} attempt "
                       f"{pushes[1].get('attempt')!r}; the first push {pushes[0].get('delivery_id')!r} attempt "
                       f"{pushes[0].get('attempt')!r} (the same row, a higher attempt)")
        wrongly = ("foreign", "wrong_delivery_id", "wrong_message_id")
        receiver.poll(lambda: all(len(delivered(r)) >= 2 for r in wrongly), grace_s)
        for role, what in (("foreign", "a client_ack from another member naming the recipient's delivery"),
                           ("wrong_delivery_id", "the recipient's client_ack naming a delivery_id it does not have"),
                           ("wrong_message_id", "the recipient's client_ack naming a brokerMessageId of no message")):
            verdict.expect("BRK-CLIENT-ACK", len(delivered(role)) >= 2,
                           f"{what} settled the delivery: it was not delivered again although an unacknowledged one "
                           "sent with it was")

    # --- committed only: what the broker refused never reaches the recipient -----------------------------------------
    leaked = [f"{body[:40]!r} (answered {answer})" for body, answer in refused_bodies.items()
              if any(p.get("body") == body for p in receiver.pushes())]
    verdict.expect("BRK-DELIVERY-COMMITTED", not leaked, f"refused sends were pushed to their recipient: {leaked}")
    if not refused_bodies:
        verdict.skip("BRK-DELIVERY-COMMITTED", "the broker refused none of the sends that should not commit")

    # --- the lease lapses twice: the recipient's own ack settled its delivery ----------------------------------------
    if not again:
        verdict.blocked(["BRK-CLIENT-ACK"], "no redelivery to compare with")
    third_s = second_s + lease_s
    if third_s > budget_s(request):
        verdict.skip("BRK-REDELIVER-LEASE", f"whether the recipient's own ack settles is seen after two leases "
                                       f"({third_s:g} s): more than the case timeout leaves")
        return
    third = receiver.poll(lambda: len(delivered("control")) >= 3, third_s)
    verdict.expect("BRK-REDELIVER", third, f"an unacknowledged push was delivered again once, but not a second time "
                                           f"within {third_s:g} s")
    if third:
        receiver.poll(lambda: False, grace_s)
    late = [p.get("attempt") for p in delivered("acked")
            if isinstance(p.get("attempt"), int) and p["attempt"] > acked_attempt + 1]
    verdict.expect("BRK-REDELIVER-LEASE", not late,
                   f"the recipient's own client_ack did not settle its delivery: pushed again with attempts {late} "
                   f"after it acknowledged attempt {acked_attempt}")
