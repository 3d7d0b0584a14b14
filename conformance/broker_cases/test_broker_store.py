"""The store after the other cases (--store-dsn) and under kill -9 (a launched broker): the §4.7.3 inventory.

These run last (file order): the inventory judges every key this run minted (store_inventory.RUN_PREFIX), so it sees
what every earlier case left behind. Each finding fails the requirement its rule protects.
"""

from __future__ import annotations

from conformance.broker_cases._support import ANSWER_S, TOPIC, cmid, join, status, summary
from conformance.member import send_frame
from conformance.registry import case
from conformance.store_inventory import RULES, findings

INVENTORY = ("BRK-ATOMIC", "BRK-CONCURRENT-ONE-MESSAGE", "BRK-HISTORY-AVAILABLE", "BRK-ORPHAN-CHECK")


def _record_findings(verdict, dsn: str, requirements: tuple[str, ...]) -> None:
    found = findings(dsn)
    for requirement in requirements:
        if requirement == "BRK-ORPHAN-CHECK":
            continue
        mine = [str(f) for f in found if f.requirement == requirement]
        rules = sorted({rule for rule, protects, _ in RULES if protects == requirement})
        verdict.expect(requirement, not mine, f"{len(mine)} contradiction(s) in the store ({', '.join(rules)}): "
                                              f"{mine[:5]}")


@case("broker.inventory", "BRK-ATOMIC", "BRK-CONCURRENT-ONE-MESSAGE", "BRK-HISTORY-AVAILABLE", "BRK-ORPHAN-CHECK")
def test_store_inventory_is_clean(broker_target, verdict):
    if not broker_target.store_dsn:
        verdict.blocked(INVENTORY, "the store is read directly: give --store-dsn")
    _record_findings(verdict, broker_target.store_dsn, tuple(r for r in INVENTORY))
    verdict.skip("BRK-ORPHAN-CHECK", "the broker's own orphan check is not reachable over the protocol; the harness "
                                     "ran the §4.7.3 inventory itself (the other requirements of this case)")


@case("broker.crash.atomicity", "BRK-ATOMIC", "BRK-DUP-MATCH")
def test_kill9_under_load_leaves_no_partial_accept(broker_target, member, verdict):
    """Five rounds of 40 sends, each cut short by SIGKILL once a few are acknowledged: every send acknowledged 201
    before a kill is afterwards a 200 duplicate of the same broker_message_id, and the store has no partial accept."""
    if not broker_target.can_restart:
        verdict.blocked(["BRK-ATOMIC", "BRK-DUP-MATCH"], "restart-dependent: the broker was not given a launch "
                                                         "template")
    acked: dict[str, dict] = {}
    for round_ in range(5):
        sender = join(member, verdict, ("BRK-ATOMIC", "BRK-DUP-MATCH"), f"crash-{round_}")
        keys = [cmid(f"crash{round_}-{n}") for n in range(40)]
        for key in keys:
            sender.send(send_frame(key, TOPIC, key))

        def created(peer=sender):
            return [f for f in list(peer.frames) if f.get("type") == "ack" and f.get("status") == 201]

        sender.poll(lambda fewest=3 + round_: len(created()) >= fewest, ANSWER_S)
        broker_target.restart()  # SIGKILL mid-stream: some sends acked, some committing, some unread
        for frame in created():
            acked[str(frame.get("client_message_id"))] = frame
    if not acked:
        verdict.blocked(["BRK-ATOMIC", "BRK-DUP-MATCH"], "no 201 came before the kills: the case would prove nothing")
    retry = join(member, verdict, ("BRK-ATOMIC", "BRK-DUP-MATCH"), "retry")
    lost = []
    for key, ack in acked.items():
        retry.send(send_frame(key, TOPIC, key))
        again = retry.ack(key)
        if (status(again), (again or {}).get("broker_message_id")) != (200, ack.get("broker_message_id")):
            lost.append(f"{key}: {summary(again)} after a 201 of {ack.get('broker_message_id')}")
    verdict.expect("BRK-DUP-MATCH", not lost, f"{len(lost)} of {len(acked)} sends acknowledged 201 before a kill "
                                              f"were not the same message afterwards: {lost[:3]}")
    if not broker_target.store_dsn:
        verdict.skip("BRK-ATOMIC", "the store is read directly: give --store-dsn")
        return
    _record_findings(verdict, broker_target.store_dsn, ("BRK-ATOMIC",))
