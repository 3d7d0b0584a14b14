------------------------------- MODULE Outbox -------------------------------
(***************************************************************************)
(* The claudemesh daemon v0.9.0 outbox and the broker's dedupe: sections   *)
(* 4.1-4.12 of the spec and meshspec ERRATA E-09, E-10, E-14, E-16, E-17,  *)
(* E-21.                                                                   *)
(*                                                                         *)
(* This module is the twin of spec/tools/model.py: the same variables, the *)
(* same actions, the same bounds, so that TLC and `meshd spec model-check` *)
(* find the same number of distinct states. The three decision tables      *)
(* (spec/tables/ipc_lookup.yaml, outbox.yaml, broker_accept.yaml) are      *)
(* transcribed below by hand (Ipc, OB, BrokerDecision); the Python model   *)
(* reads the YAML itself. If you change a table, change its transcription. *)
(*                                                                         *)
(* Abstraction (the same as the Python model's):                           *)
(*  - an outbox row is [status, variant, attempts, succ]; `variant` names  *)
(*    the request ("A" or "B"; equal variants = equal fingerprints); the   *)
(*    first POST of a key is called "A" (renaming the variants of one key  *)
(*    is a symmetry of the model); attempts saturate at MaxAttempts;       *)
(*  - time is abstract: a pending row may be dispatched at any time;       *)
(*    "older than max age" and "the ack timer fired" are nondeterministic  *)
(*    events;                                                              *)
(*  - an ack timer exists only while its row is inflight (`timers`);       *)
(*  - the network is a bag of send frames and acks (a reconnect may        *)
(*    reorder); a daemon crash loses the bag and the timers, and restart   *)
(*    applies crash_recovery to every row, in the same step;               *)
(*  - faults (lost frame or ack, dropped link, early ack timeout, failed   *)
(*    broker commit) hit a row only while its attempts < MaxAttempts, and  *)
(*    at most MaxCrashes crashes happen: afterwards the broker is          *)
(*    reachable and reliable. This keeps the state space finite.           *)
(***************************************************************************)
EXTENDS Naturals, Sequences, Bags, TLC

CONSTANTS NumKeys,      \* client_message_ids k1..kN that clients POST
          NumSpare,     \* ids s1..sN requeue takes its fresh ids from, in order
          MaxAttempts,  \* attempts saturate here; faults hit a row only below it
          MaxCrashes    \* daemon crashes (each followed by a restart)

ASSUME NumKeys \in Nat \ {0} /\ NumSpare \in Nat /\ MaxAttempts \in Nat \ {0} /\ MaxCrashes \in Nat

Keys == {"k" \o ToString(i) : i \in 1..NumKeys}
SpareSeq == [i \in 1..NumSpare |-> "s" \o ToString(i)]
Spare == {SpareSeq[i] : i \in 1..NumSpare}
Ids == Keys \cup Spare
Variants == {"A", "B"}
None == "none"

Statuses == {"pending", "inflight", "done", "dead", "aborted"}
Terminal == {"done", "dead", "aborted"}
NoRow == [status |-> None, variant |-> None, attempts |-> 0, succ |-> None]
NewRow(v) == [status |-> "pending", variant |-> v, attempts |-> 0, succ |-> None]
Min(a, b) == IF a < b THEN a ELSE b

AckEvents == {"ack_created", "ack_duplicate_history", "ack_conflict", "ack_rejected", "ack_failed"}
Frames == {<<"send", id, v>> : id \in Ids, v \in Variants}
Acks == {<<"ack", id, e>> : id \in Ids, e \in AckEvents}

VARIABLES rows,      \* [Ids -> row]: the daemon's outbox.db (NoRow = no row: the id is free)
          timers,    \* the ids whose ack timer is armed (daemon memory)
          chan,      \* bag of frames and acks on the WebSocket
          dedupe,    \* [Ids -> variant or None]: mesh.client_message_dedupe
          messages,  \* [Ids -> Nat]: topic_message / message_queue rows
          history,   \* [Ids -> Nat]: message_history rows
          delivery,  \* [Ids -> Nat]: delivery_queue rows (counted per accept)
          crashes    \* daemon crashes so far

vars == <<rows, timers, chan, dedupe, messages, history, delivery, crashes>>
broker == <<dedupe, messages, history, delivery>>

Put(b, m) == b (+) SetToBag({m})
Take(b, m) == b (-) SetToBag({m})
InFlight(id) == \E m \in DOMAIN chan : m[2] = id
FaultAllowed(id) == rows[id] # NoRow /\ rows[id].attempts < MaxAttempts
\* An ack timer only exists while its row is inflight.
Armed(ts, rs) == {id \in ts : rs[id].status = "inflight"}

(***************************************************************************)
(* spec/tables/ipc_lookup.yaml (sec. 4.5.1)                                *)
(***************************************************************************)
Ipc(s, match) ==
  IF s = None THEN [row |-> "IPC-NEW", code |-> 202, mutation |-> "insert_pending"]
  ELSE IF s = "pending" /\ match THEN [row |-> "IPC-PENDING-MATCH", code |-> 202, mutation |-> "none"]
  ELSE IF s = "inflight" /\ match THEN [row |-> "IPC-INFLIGHT-MATCH", code |-> 202, mutation |-> "none"]
  ELSE IF s = "done" /\ match THEN [row |-> "IPC-DONE-MATCH", code |-> 200, mutation |-> "none"]
  ELSE [row |-> "IPC-CONFLICT", code |-> 409, mutation |-> "none"]   \* the seven 409 rows

Matches(k, v) == rows[k] = NoRow \/ rows[k].variant = v
IpcFor(k, v) == Ipc(rows[k].status, Matches(k, v))

(***************************************************************************)
(* spec/tables/outbox.yaml (sec. 4.5.2, E-14, E-16, E-17)                  *)
(***************************************************************************)
T(to, eff) == [outcome |-> "transition", to |-> to, effects |-> eff]
Ignore == [outcome |-> "ignore", to |-> None, effects |-> {}]
Reject == [outcome |-> "reject", to |-> None, effects |-> {}]
Impossible == [outcome |-> "impossible", to |-> None, effects |-> {}]
AckDone == {"ack_created", "ack_duplicate_history", "ack_duplicate_pruned"}
AckDead == {"ack_conflict", "ack_rejected"}
Transient == {"ack_failed", "ack_timeout", "link_lost"}
Requeued == T("aborted", {"set_aborted_audit", "insert_successor_pending"})

OB(s, e) ==
  IF s = "pending" THEN
    (CASE e = "dispatch" -> T("inflight", {"increment_attempts", "arm_ack_timer", "send_frame"})
       [] e \in AckDone -> T("done", {"set_broker_ids", "set_delivered_at"})
       [] e \in AckDead -> T("dead", {"set_last_error", "emit_outbox_dead"})
       [] e \in Transient \cup {"crash_recovery"} -> Ignore
       [] e = "max_age_exceeded" -> T("dead", {"set_last_error_max_age", "emit_outbox_dead"})
       [] e = "requeue" -> Requeued
       [] OTHER -> Impossible)
  ELSE IF s = "inflight" THEN
    (CASE e \in AckDone -> T("done", {"set_broker_ids", "set_delivered_at"})
       [] e \in AckDead -> T("dead", {"set_last_error", "emit_outbox_dead"})
       [] e \in Transient -> T("pending", {"set_last_error", "schedule_backoff"})
       [] e = "max_age_exceeded" -> Ignore
       [] e = "crash_recovery" -> T("pending", {"schedule_min_backoff"})
       [] e = "requeue" -> Reject
       [] OTHER -> Impossible)
  ELSE IF s = "dead" THEN
    (CASE e = "requeue" -> Requeued
       [] e \in {"accept", "dispatch"} -> Impossible
       [] OTHER -> Ignore)
  ELSE IF s \in {"done", "aborted"} THEN
    (CASE e = "requeue" -> Reject
       [] e \in {"accept", "dispatch"} -> Impossible
       [] OTHER -> Ignore)
  ELSE Impossible   \* no row: `accept` goes through Ipc, nothing else can happen

\* The row after event e (succ: the successor id for requeue).
Apply(r, e, succ) ==
  LET t == OB(r.status, e)
  IN IF t.outcome = "impossible" THEN Assert(FALSE, <<"impossible outbox event", r.status, e>>)
     ELSE IF t.outcome # "transition" THEN r
     ELSE [status |-> t.to,
           variant |-> r.variant,
           attempts |-> IF "increment_attempts" \in t.effects THEN Min(r.attempts + 1, MaxAttempts)
                        ELSE r.attempts,
           succ |-> IF "set_aborted_audit" \in t.effects THEN succ ELSE r.succ]

(***************************************************************************)
(* spec/tables/broker_accept.yaml (sec. 4.6.2, sec. 4.7, E-21)             *)
(***************************************************************************)
BrokerDecision(b1, drift, claim, fpm, b2, commit) ==
  IF b1 = "rejected" THEN [row |-> "BRK-B1-REJECT", code |-> "4xx", tx |-> "none", effects |-> {}]
  ELSE IF drift = "differs" THEN [row |-> "BRK-DRIFT", code |-> "409", tx |-> "none", effects |-> {}]
  ELSE IF claim = "theirs" /\ fpm = "match"
       THEN [row |-> "BRK-DUP-MATCH", code |-> "200", tx |-> "rollback", effects |-> {}]
  ELSE IF claim = "theirs" THEN [row |-> "BRK-DUP-MISMATCH", code |-> "409", tx |-> "rollback", effects |-> {}]
  ELSE IF b2 = "rejected" THEN [row |-> "BRK-B2-REJECT", code |-> "4xx", tx |-> "rollback", effects |-> {}]
  ELSE IF commit = "failed" THEN [row |-> "BRK-COMMIT-FAIL", code |-> "5xx", tx |-> "rollback", effects |-> {}]
  ELSE [row |-> "BRK-ACCEPT", code |-> "201", tx |-> "commit", effects |-> {"dedupe", "message", "history", "delivery"}]

\* sec. 4.5b, E-10: the outbox event an answer becomes (no retention pruning in the model).
AckEvent(code) ==
  CASE code = "201" -> "ack_created"
    [] code = "200" -> "ack_duplicate_history"
    [] code = "409" -> "ack_conflict"
    [] code = "4xx" -> "ack_rejected"
    [] OTHER -> "ack_failed"

Claim(id) == IF dedupe[id] = None THEN "ours" ELSE "theirs"
Fpm(id, v) == IF Claim(id) = "ours" \/ dedupe[id] = v THEN "match" ELSE "mismatch"
Decide(m, b1, drift, b2, commit) == BrokerDecision(b1, drift, Claim(m[2]), Fpm(m[2], m[3]), b2, commit)
\* The transaction reached COMMIT: the outcome still depended on it.
CommitReached(m, b1, drift, b2) == Decide(m, b1, drift, b2, "ok") # Decide(m, b1, drift, b2, "failed")

\* One accept transaction for frame m, from the claim to COMMIT or ROLLBACK, as one atomic step.
Accept(m, b1, drift, b2, commit) ==
  LET id == m[2]
      v == m[3]
      d == Decide(m, b1, drift, b2, commit)
  IN /\ chan' = Put(Take(chan, m), <<"ack", id, AckEvent(d.code)>>)
     /\ IF d.tx = "commit"
          THEN /\ dedupe' = IF "dedupe" \in d.effects /\ dedupe[id] = None THEN [dedupe EXCEPT ![id] = v] ELSE dedupe
               /\ messages' = IF "message" \in d.effects THEN [messages EXCEPT ![id] = @ + 1] ELSE messages
               /\ history' = IF "history" \in d.effects THEN [history EXCEPT ![id] = @ + 1] ELSE history
               /\ delivery' = IF "delivery" \in d.effects THEN [delivery EXCEPT ![id] = @ + 1] ELSE delivery
          ELSE UNCHANGED broker
     /\ UNCHANGED <<rows, timers, crashes>>

(***************************************************************************)
(* Actions (the names match the Python model's)                            *)
(***************************************************************************)
Init ==
  /\ rows = [id \in Ids |-> NoRow]
  /\ timers = {}
  /\ chan = EmptyBag
  /\ dedupe = [id \in Ids |-> None]
  /\ messages = [id \in Ids |-> 0]
  /\ history = [id \in Ids |-> 0]
  /\ delivery = [id \in Ids |-> 0]
  /\ crashes = 0

\* A client POSTs /v1/send for key k with request v (sec. 4.5.1).
Post(k, v) ==
  /\ rows[k] = NoRow => v = "A"
  /\ IF IpcFor(k, v).mutation = "insert_pending"
       THEN /\ rows' = [rows EXCEPT ![k] = NewRow(v)]
            /\ timers' = Armed(timers, rows')
            /\ UNCHANGED <<chan, crashes>> /\ UNCHANGED broker
       ELSE UNCHANGED vars

\* The drain loop sends a pending row.
Dispatch(id) ==
  /\ rows[id].status = "pending"
  /\ LET t == OB("pending", "dispatch")
         r == Apply(rows[id], "dispatch", None)
     IN /\ rows' = [rows EXCEPT ![id] = r]
        /\ chan' = IF "send_frame" \in t.effects THEN Put(chan, <<"send", id, r.variant>>) ELSE chan
        /\ timers' = Armed(IF "arm_ack_timer" \in t.effects THEN timers \cup {id} ELSE timers, rows')
  /\ UNCHANGED <<crashes>> /\ UNCHANGED broker

\* The broker takes a send frame; its commit does not fail.
Broker(m) ==
  /\ m \in DOMAIN chan /\ m[1] = "send"
  /\ \E b1 \in {"ok", "rejected"}, drift \in {"same", "differs"}, b2 \in {"ok", "rejected"} :
       Accept(m, b1, drift, b2, "ok")

\* Fault: the transaction reaches COMMIT and the commit fails (all rolled back, 5xx).
BrokerCommitFail(m) ==
  /\ m \in DOMAIN chan /\ m[1] = "send"
  /\ FaultAllowed(m[2])
  /\ \E b1 \in {"ok", "rejected"}, drift \in {"same", "differs"}, b2 \in {"ok", "rejected"} :
       CommitReached(m, b1, drift, b2) /\ Accept(m, b1, drift, b2, "failed")

\* The daemon receives an ack and applies it to the row with that id (E-17).
DeliverAck(m) ==
  /\ m \in DOMAIN chan /\ m[1] = "ack"
  /\ rows' = [rows EXCEPT ![m[2]] = Apply(@, m[3], None)]
  /\ chan' = Take(chan, m)
  /\ timers' = Armed(timers, rows')
  /\ UNCHANGED <<crashes>> /\ UNCHANGED broker

\* The ack timer fires and nothing for the row is left in flight.
AckTimeout(id) ==
  /\ id \in timers /\ ~InFlight(id)
  /\ rows' = [rows EXCEPT ![id] = Apply(@, "ack_timeout", None)]
  /\ timers' = Armed(timers, rows')
  /\ UNCHANGED <<chan, crashes>> /\ UNCHANGED broker

\* Fault: the ack timer fires while the frame or its ack is still on the way.
AckTimeoutEarly(id) ==
  /\ id \in timers /\ InFlight(id) /\ FaultAllowed(id)
  /\ rows' = [rows EXCEPT ![id] = Apply(@, "ack_timeout", None)]
  /\ timers' = Armed(timers, rows')
  /\ UNCHANGED <<chan, crashes>> /\ UNCHANGED broker

\* Fault: one frame or ack is lost.
LoseMessage(m) ==
  /\ m \in DOMAIN chan /\ FaultAllowed(m[2])
  /\ chan' = Take(chan, m)
  /\ UNCHANGED <<rows, timers, crashes>> /\ UNCHANGED broker

\* Fault: the WebSocket drops; everything in flight is lost; waiting rows get link_lost.
LinkDrop ==
  /\ \E id \in timers : FaultAllowed(id)
  /\ chan' = EmptyBag
  /\ rows' = [id \in Ids |-> IF id \in timers THEN Apply(rows[id], "link_lost", None) ELSE rows[id]]
  /\ timers' = Armed(timers, rows')
  /\ UNCHANGED <<crashes>> /\ UNCHANGED broker

\* Fault: the daemon crashes and restarts: channel and timers are lost, every row gets crash_recovery (sec. 4.11, E-16).
CrashRestart ==
  /\ crashes < MaxCrashes
  /\ crashes' = crashes + 1
  /\ chan' = EmptyBag
  /\ timers' = {}
  /\ rows' = [id \in Ids |-> IF rows[id] = NoRow THEN NoRow ELSE Apply(rows[id], "crash_recovery", None)]
  /\ UNCHANGED broker

\* Time passes: a pending row is older than its max age at a dispatch attempt (E-14).
MaxAge(id) ==
  /\ rows[id].status = "pending"
  /\ rows' = [rows EXCEPT ![id] = Apply(@, "max_age_exceeded", None)]
  /\ timers' = Armed(timers, rows')
  /\ UNCHANGED <<chan, crashes>> /\ UNCHANGED broker

\* The operator requeues a row onto the first unused spare id (sec. 4.5.3, E-09); the table refuses some states.
FreeSpare == {i \in 1..NumSpare : rows[SpareSeq[i]] = NoRow}
Requeue(id) ==
  /\ rows[id] # NoRow
  /\ FreeSpare # {}
  /\ LET s == SpareSeq[CHOOSE i \in FreeSpare : \A j \in FreeSpare : i <= j]
         t == OB(rows[id].status, "requeue")
     IN IF t.outcome = "transition" /\ "insert_successor_pending" \in t.effects
          THEN /\ rows' = [rows EXCEPT ![id] = Apply(@, "requeue", s), ![s] = NewRow(rows[id].variant)]
               /\ timers' = Armed(timers, rows')
               /\ UNCHANGED <<chan, crashes>> /\ UNCHANGED broker
          ELSE /\ Apply(rows[id], "requeue", s) = rows[id]   \* reject: nothing changes
               /\ UNCHANGED vars

Next ==
  \/ \E k \in Keys, v \in Variants : Post(k, v)
  \/ \E id \in Ids : Dispatch(id) \/ AckTimeout(id) \/ AckTimeoutEarly(id) \/ MaxAge(id) \/ Requeue(id)
  \/ \E m \in DOMAIN chan : Broker(m) \/ BrokerCommitFail(m) \/ DeliverAck(m) \/ LoseMessage(m)
  \/ LinkDrop
  \/ CrashRestart

\* Fairness only for the protocol's own fault-free steps; clients, the operator, time and faults get none.
Fairness ==
  /\ \A id \in Ids : WF_vars(Dispatch(id)) /\ WF_vars(AckTimeout(id))
  /\ \A m \in Frames : WF_vars(Broker(m))
  /\ \A m \in Acks : WF_vars(DeliverAck(m))

Spec == Init /\ [][Next]_vars /\ Fairness

(***************************************************************************)
(* Properties                                                              *)
(***************************************************************************)
TypeOK ==
  /\ rows \in [Ids -> {NoRow} \cup [status : Statuses, variant : Variants, attempts : 0..MaxAttempts,
                                    succ : Spare \cup {None}]]
  /\ timers \subseteq {id \in Ids : rows[id].status = "inflight"}
  /\ DOMAIN chan \subseteq Frames \cup Acks
  /\ dedupe \in [Ids -> Variants \cup {None}]
  /\ messages \in [Ids -> Nat] /\ history \in [Ids -> Nat] /\ delivery \in [Ids -> Nat]
  /\ crashes \in 0..MaxCrashes

\* sec. 4.1: per client_message_id the broker holds at most one message.
AtMostOneBrokerMessage == \A id \in Ids : messages[id] <= 1

\* sec. 4.1, sec. 4.7.1: dedupe row <=> message row <=> history row <=> delivery rows, in every state.
AllOrNothing ==
  \A id \in Ids :
    LET claimed == dedupe[id] # None
    IN /\ claimed = (messages[id] > 0)
       /\ claimed = (history[id] > 0)
       /\ claimed = (delivery[id] > 0)

\* A row is done only when the broker has the message under its id.
DoneMeansAccepted == \A id \in Ids : rows[id].status = "done" => dedupe[id] # None

\* sec. 4.5.1: a 409 from the IPC lookup never changes anything.
ConflictNeverMutates ==
  [][\A k \in Keys, v \in Variants : (Post(k, v) /\ IpcFor(k, v).code = 409) => UNCHANGED vars]_vars

\* sec. 4.1, sec. 4.5.3: once a client_message_id has an outbox row it always has one.
ConsumedNeverFreed == [][\A id \in Ids : rows[id] # NoRow => rows'[id] # NoRow]_vars

\* sec. 4.5.2, sec. 4.8: the request fingerprint is frozen for the row's lifecycle.
FingerprintFrozen ==
  [][\A id \in Ids : (rows[id] # NoRow /\ rows'[id] # NoRow) => rows'[id].variant = rows[id].variant]_vars

\* With the broker eventually reachable, every accepted send ends done, dead or aborted.
Termination == \A id \in Ids : (rows[id] # NoRow) ~> (rows[id].status \in Terminal)

=============================================================================
