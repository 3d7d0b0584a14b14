"""Conformance cases for brokers (`meshconform broker`): the harness plays the daemons.

How a broker is tested.

* ``meshconform broker`` launches the reference broker; ``--launch TEMPLATE`` launches yours (``{port}``: a free
  127.0.0.1 port to listen on, ``{state_dir}``: a fresh directory), so the crash case can kill -9 and restart it;
  ``--url ws://HOST:PORT`` tests one already running (the crash case is then skipped, never passed).
* The broker must admit the harness's members: development mode, any ed25519 key joins mesh ``--mesh-id``
  (default ``meshconform``). Topics may be created on first use, as a development broker does: a send to a topic
  nobody created is then accepted and delivered to the mesh's members, and the unknown-topic row of the B2 case is
  not checkable; a send accepted to a topic or queue nobody created that reaches no member is a B2 failure. A DM to
  a key no member has is always a B2 refusal.
* The delivery lease (how long an unacknowledged push waits before it is pushed again) is ``--lease-s``, else a
  ``lease_ms`` / ``lease_s`` parameter of any feature the broker offers, else 30 s (the reference's and upstream's
  default). The delivery case waits up to twice and three times the lease plus a margin; with a 30 s lease it takes
  about a minute, and says so (skips what it cannot wait for) when ``--case-timeout`` is too short.
* ``--store-dsn`` (``sqlite:///…``, ``postgresql://…``; ``{state_dir}`` allowed with ``--launch``) lets the suite
  read the store's §4.3/§4.7.1 tables (conformance/store_inventory.py, no implementation code): the §4.7.3
  inventory, "no dedupe row behind a refusal" directly, one message per raced id, and whether the advertised dedupe
  policy is the one the broker enacts — a dedupe row expires ``dedupe_retention_days`` after ``first_seen_at``
  (``retention_scoped``) or never (``permanent``). Without it those requirements are skipped with that reason; the
  rest is judged black-box.
* Every case records its evidence per requirement, behaviour before shape (the E-10 ack schema is WS-ACK-STATUS's
  alone), and ends in verdicts whatever the broker answers: every wait is bounded, and a broker that did not
  provide a precondition (a member could not join, a plain send was refused) makes the dependent requirements
  "not checkable", never passed.
"""
