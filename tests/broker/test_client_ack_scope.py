"""BRK-CLIENT-ACK: a client_ack settles a delivery only when it names that delivery as the recipient received it —
its ``delivery_id`` and the message's ``brokerMessageId`` — from the recipient's own connection. Anything else
settles nothing: the message is delivered again after its lease (an ack whose ids disagree may come from a daemon
that stored another message; settling on a guess could lose this one).
"""

from __future__ import annotations

from broker_server_testkit import Member, joined, running_broker, send_frame
from store_testkit import BOB, CAROL, T0, make_request, new_ids

from reference.broker.store import BrokerStore


def test_the_store_settles_a_delivery_only_for_its_message(store: BrokerStore) -> None:
    broker_message_id, history_id = new_ids()
    store.accept(make_request(), broker_message_id, history_id)
    [delivery] = store.pending_deliveries(BOB, now_ms=T0 + 10, lease_ms=1_000)
    other_message, _ = new_ids()

    assert not store.ack_delivery(delivery.delivery_id, BOB, now_ms=T0 + 20, broker_message_id=other_message)
    assert not store.ack_delivery(delivery.delivery_id, CAROL, now_ms=T0 + 20, broker_message_id=broker_message_id)
    [again] = store.pending_deliveries(BOB, now_ms=T0 + 1_010, lease_ms=1_000)  # neither ack settled it
    assert (again.delivery_id, again.attempt) == (delivery.delivery_id, 2)

    assert store.ack_delivery(delivery.delivery_id, BOB, now_ms=T0 + 1_020, broker_message_id=broker_message_id)
    assert store.pending_deliveries(BOB, now_ms=T0 + 100_000, lease_ms=1_000) == []


def test_a_client_ack_naming_another_message_or_from_another_member_settles_nothing(store_url):
    """BRK-CLIENT-ACK, through the server: bob's ack with the right delivery_id but another message's id, and carol's
    ack of bob's delivery, are answered unknown_delivery and bob gets the message again; bob's own ack settles it."""
    cast = {name: Member(name) for name in ("alice", "bob", "carol")}
    with (running_broker(store_url, list(cast.values()), lease_s=0.5) as broker,
          joined(broker.url, cast["alice"]) as alice, joined(broker.url, cast["bob"]) as bob,
          joined(broker.url, cast["carol"]) as carol):
        alice.send(send_frame("c1", "for bob", ref=cast["bob"].pubkey, kind="dm"))
        ack = alice.expect("ack", client_message_id="c1")
        first = bob.expect("push", client_message_id="c1")
        alice.send(send_frame("c2", "another", ref=cast["bob"].pubkey, kind="dm"))
        other = alice.expect("ack", client_message_id="c2")
        bob.send({"type": "client_ack", "clientMessageId": "c1", "brokerMessageId": other["broker_message_id"],
                  "delivery_id": first["delivery_id"]})
        assert bob.expect("error", code="unknown_delivery")
        carol.send({"type": "client_ack", "clientMessageId": "c1", "brokerMessageId": ack["broker_message_id"],
                    "delivery_id": first["delivery_id"]})
        assert carol.expect("error", code="unknown_delivery")
        again = bob.expect("push", client_message_id="c1", timeout=5)
        assert (again["delivery_id"], again["attempt"]) == (first["delivery_id"], 2)
        bob.send({"type": "client_ack", "clientMessageId": "c1", "brokerMessageId": again["messageId"],
                  "delivery_id": again["delivery_id"]})
        assert bob.quiet("push", 1.5, client_message_id="c1")
