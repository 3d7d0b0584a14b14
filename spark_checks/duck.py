"""The catalogue in DuckDB SQL: what a user would run on one machine instead of Spark (bench-only: needs ``duckdb``).

``bench/trace_check.py`` runs it next to the Spark checks on the same trace; the tests hold it to the oracle's
answers so the comparison is of equal work. It is written as plain SQL the way a DuckDB user would write it --
windows over the natural subjects, ``arg_min``/``arg_max`` for first and last events, no chunking (one machine needs
no skew handling) -- with the same per-node shortcut the Spark checks use (a node whose ``seq - line`` is constant
has strictly increasing seqs). It reports what the other engines report: the same (invariant, key, event, related)
identities, each candidate naming its ``catalogue.DETAILS`` case and the value it computed (``fact``), and the same
evidence, fetched for the reported violations only by joins of the dataset with small tables of wanted positions and
subjects.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from .catalogue import (
    BY_ID,
    DEFAULT_ACK_GRACE_MS,
    DEFAULT_ACK_TIMEOUT_MS,
    DEFAULT_EVIDENCE_EVENTS,
    DEFAULT_HOOK_GRACE_MS,
    DEFAULT_HOOK_TIMEOUT_MS,
    DEFAULT_REDELIVERY_GRACE_MS,
    EventRef,
    Violation,
    detail_text,
    evidence_entries,
)
from .inputs import check_node_count
from .oracle import Report, Tables, sort_violations


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _candidates_sql(grace: int, seq_suspects: list[str],
                    ack_window: int = DEFAULT_ACK_TIMEOUT_MS + DEFAULT_ACK_GRACE_MS,
                    hook_window: int = DEFAULT_HOOK_TIMEOUT_MS + DEFAULT_HOOK_GRACE_MS) -> str:
    suspects = ", ".join(_literal(n) for n in seq_suspects) or "NULL"
    return f"""
WITH
rows AS MATERIALIZED (
  SELECT e.node, e.client_message_id AS cmid, e.seq, e.line, e.ts_ms, e.kind = 'outbox_transition' AS is_ot,
         e.outbox_id AS oid, e.request_fingerprint AS fp, e.from_state AS fr, e.to_state AS tos, e.attempts AS att,
         e.table_row, e.row_state AS st, e.fingerprint_match AS fm, e.max_age_at_ms, e.enqueued_at_ms AS enq, l.delta,
         a.answer IS NOT NULL AS tok, x.answer AS expected_answer,
         e.kind = 'ipc_decision' AND e.outbox_id IS NOT NULL AND coalesce((e.table_row, e.http_status) IN (
           SELECT (table_row, http_status) FROM creating_decisions), false) AS made
  FROM ev e
  LEFT JOIN legal l ON e.kind = 'outbox_transition'
       AND l.tkey = concat_ws('|', e.from_state, e.event, e.to_state, e.table_row)
  LEFT JOIN answers a ON e.kind = 'ipc_decision'
       AND a.answer = concat_ws('|', e.row_state, coalesce(CAST(e.fingerprint_match AS VARCHAR), 'null'),
                                e.table_row, CAST(e.http_status AS VARCHAR))
  LEFT JOIN ipc_expected x ON e.kind = 'ipc_decision'
       AND x.k = concat_ws('|', e.row_state, coalesce(CAST(e.fingerprint_match AS VARCHAR), 'null'))
  WHERE e.kind IN ('outbox_transition', 'ipc_decision')),
w AS MATERIALIZED (
  SELECT *,
    last_value(CASE WHEN is_ot THEN {{'seq': seq, 'line': line, 'tos': tos, 'oid': oid, 'att': att,
                                        'mag': max_age_at_ms, 'enq': enq}} END IGNORE NULLS)
      OVER (PARTITION BY node, cmid ORDER BY seq, line ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS p,
    -- the previous transition of the same outbox row (rows of one client_message_id may interleave)
    last_value(CASE WHEN is_ot THEN {{'seq': seq, 'line': line, 'tos': tos, 'att': att, 'mag': max_age_at_ms,
                                        'enq': enq}} END IGNORE NULLS)
      OVER (PARTITION BY node, cmid, oid ORDER BY seq, line ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS r,
    first_value(CASE WHEN is_ot THEN {{'seq': seq, 'line': line, 'fp': fp}} END IGNORE NULLS)
      OVER (PARTITION BY node, cmid ORDER BY seq, line ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS f,
    last_value(CASE WHEN made THEN {{'seq': seq, 'line': line, 'fp': fp, 'oid': oid}} END IGNORE NULLS)
      OVER (PARTITION BY node, cmid ORDER BY seq, line ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS m
  FROM rows),
shown_created AS (
  -- the rows the node's trace shows created (anywhere in it): named by a decision whose table row creates one
  -- (creating_decisions: IPC-NEW, 202), or a successor named by a requeue whose table row inserts it
  -- (creating_transitions), both read from spec/tables (oracle.Tables)
  SELECT node, outbox_id AS oid FROM ev
  WHERE kind = 'ipc_decision' AND (table_row, http_status) IN (SELECT (table_row, http_status) FROM creating_decisions)
        AND outbox_id IS NOT NULL
  UNION
  SELECT node, superseded_by FROM ev
  WHERE kind = 'outbox_transition'
        AND (from_state, event, to_state) IN (SELECT (from_state, event, to_state) FROM creating_transitions)
        AND superseded_by IS NOT NULL AND superseded_by <> outbox_id),
wc AS (
  -- a row's first transition may start at `pending` when the trace shows the row created: a daemon stopped between
  -- the commit that created the row and its event (E-32)
  SELECT w.*, r IS NOT NULL AS same_row,
         coalesce(CASE WHEN r IS NOT NULL THEN fr IS NOT DISTINCT FROM r.tos
                       ELSE fr = 'none' OR (fr = 'pending' AND c.oid IS NOT NULL) END, false) AS from_ok
  FROM w LEFT JOIN shown_created c ON w.is_ot AND w.fr = 'pending' AND c.node = w.node AND c.oid = w.oid),
ledger AS MATERIALIZED (
  SELECT mesh, client_message_id AS cmid, broker_message_id AS bmid,
    min((node, seq, line)) FILTER (WHERE kind = 'accept_commit' OR (kind = 'accept_decision'
                                                                   AND broker_message_id IS NOT NULL)) AS named,
    min((node, seq, line)) FILTER (WHERE kind = 'accept_decision' AND broker_message_id IS NOT NULL
                                   AND table_row = 'BRK-ACCEPT') AS accept,
    count(*) FILTER (WHERE kind = 'accept_commit') AS commits,
    min((node, seq, line)) FILTER (WHERE kind = 'accept_commit') AS commit_first,
    max((node, seq, line)) FILTER (WHERE kind = 'accept_commit') AS commit_last,
    min((node, seq, line)) FILTER (WHERE kind = 'accept_commit' AND NOT coalesce(effects_dedupe = 1
         AND effects_message = 1 AND effects_history = 1 AND effects_delivery = recipients, false)) AS bad,
    min((node, seq, line)) FILTER (WHERE kind = 'outbox_transition') AS done,
    min((node, seq, line)) FILTER (WHERE kind = 'delivery') AS delivery,
    bool_or(mesh IN (SELECT mesh FROM broker_meshes)) AS scope
  FROM ev
  WHERE (kind = 'accept_decision' AND broker_message_id IS NOT NULL) OR kind IN ('accept_commit', 'delivery')
        OR (kind = 'outbox_transition' AND to_state = 'done')
  GROUP BY ALL),
messages AS (
  SELECT mesh, cmid, count(*) AS n, min(named) AS low, max(named) AS high, sum(commits) AS commits,
         min(commit_first) AS commit_first, max(commit_last) AS commit_last
  FROM ledger WHERE named IS NOT NULL GROUP BY ALL),
deliveries AS (
  SELECT d.*, n.last_ts FROM (
    SELECT mesh, delivery_id,
      max((node, seq, line)) FILTER (WHERE kind = 'delivery') AS last,
      arg_max(lease_until_ms, (node, seq, line)) FILTER (WHERE kind = 'delivery') AS lease,
      min((node, seq, line)) FILTER (WHERE kind = 'delivery_ack') AS ack
    FROM ev WHERE kind IN ('delivery', 'delivery_ack') GROUP BY ALL) d
  LEFT JOIN node_end n ON n.node = d.last[1]
  WHERE d.last IS NOT NULL),
unknown_acks AS (
  SELECT a.mesh, a.delivery_id, min((a.node, a.seq, a.line)) AS ack
  FROM ev a WHERE a.kind = 'delivery_ack' AND NOT EXISTS (
    SELECT 1 FROM ev d WHERE d.kind = 'delivery' AND d.mesh = a.mesh AND d.delivery_id = a.delivery_id
                             AND d.recipient = a.recipient AND d.broker_message_id = a.broker_message_id)
  GROUP BY ALL),
inbox AS (
  SELECT recipient, client_message_id AS cmid, count(*) AS n, min((node, seq, line)) AS low,
         max((node, seq, line)) AS high
  FROM ev WHERE kind = 'inbox_insert' AND inserted GROUP BY ALL HAVING count(*) > 1),
requeues AS (
  SELECT node, k,
    arg_min((seq, line, request_fingerprint, table_row, to_state = 'pending' AND attempts = 0),
            (seq, line)) FILTER (WHERE from_state = 'none') AS new,
    arg_min((seq, line, request_fingerprint, table_row), (seq, line)) FILTER (WHERE from_state <> 'none') AS old
  FROM (SELECT *, CASE WHEN from_state = 'none' THEN outbox_id ELSE superseded_by END AS k FROM ev
        WHERE kind = 'outbox_transition' AND event = 'requeue' AND (from_state = 'none' OR to_state = 'aborted'))
  GROUP BY ALL),
sse AS (
  SELECT node, seq, line, event_id AS value,
         lag((seq, line, event_id)) OVER (PARTITION BY node ORDER BY line, seq) AS prev
  FROM ev WHERE kind = 'sse_event'),
seqs AS (
  SELECT node, seq, line, seq AS value, lag((seq, line, seq)) OVER (PARTITION BY node ORDER BY line, seq) AS prev
  FROM ev WHERE node IN ({suspects})),
fresh AS (
  SELECT *,
    first_value(CASE WHEN is_ot OR st = 'none' THEN {{'seq': seq, 'line': line, 'is_ot': is_ot, 'fp': fp,
                                                      'oid': oid}} END IGNORE NULLS)
      OVER (PARTITION BY node, cmid ORDER BY seq, line ROWS BETWEEN 1 FOLLOWING AND UNBOUNDED FOLLOWING) AS nx
  FROM (SELECT node, client_message_id AS cmid, seq, line, kind = 'outbox_transition' AS is_ot, outbox_id AS oid,
               request_fingerprint AS fp, row_state AS st,
               kind = 'ipc_decision' AND coalesce((table_row, http_status) IN (
                 SELECT (table_row, http_status) FROM creating_decisions), false) AS is_new
        FROM ev WHERE kind = 'outbox_transition'
                      OR (kind = 'ipc_decision' AND (row_state = 'none'
                                                     OR table_row IN (SELECT table_row FROM creating_decisions))))),
created AS (
  SELECT node, max(made) AS later FROM (
    SELECT node, client_message_id, min(seq) AS made,  -- the id's first transition, whatever its `from` (E-32)
           bool_or(event = 'dispatch') AS sent
    FROM ev WHERE kind = 'outbox_transition' GROUP BY ALL)
  WHERE sent AND made IS NOT NULL GROUP BY node),
inflight AS (
  SELECT o.*, n.last_ts FROM (
    SELECT node, client_message_id, arg_max((seq, line, to_state, ts_ms, outbox_id), (seq, line)) AS last
    FROM ev WHERE kind = 'outbox_transition' GROUP BY ALL) o
  JOIN node_end n ON n.node = o.node
  WHERE o.last[3] = 'inflight'),
dups AS (
  SELECT d.*, c.first, d.fp IS NOT DISTINCT FROM c.first[4] AS same
  FROM (SELECT mesh, client_message_id AS cmid, node, seq, line, table_row, request_fingerprint AS fp FROM ev
        WHERE kind = 'accept_decision' AND table_row IN ('BRK-DUP-MATCH', 'BRK-DUP-MISMATCH')) d
  JOIN (SELECT mesh, client_message_id AS cmid, arg_min((node, seq, line, request_fingerprint), (node, seq, line))
               AS first
        FROM ev WHERE kind = 'accept_commit' GROUP BY ALL) c ON d.mesh = c.mesh AND d.cmid = c.cmid),
attempts AS (
  SELECT mesh, delivery_id, node, seq, line, attempt,
         lag((node, seq, line, attempt)) OVER (PARTITION BY mesh, delivery_id ORDER BY node, seq, line) AS prev
  FROM ev WHERE kind = 'delivery'),
misnamed AS (
  SELECT f.*, r.first
  FROM (SELECT recipient, client_message_id AS cmid, node, seq, line, inbox_seq FROM ev
        WHERE kind = 'inbox_insert' AND NOT inserted AND inbox_seq IS NOT NULL) f
  JOIN (SELECT recipient, client_message_id AS cmid, min((node, seq, line)) AS first, list(inbox_seq) AS held
        FROM ev WHERE kind = 'inbox_insert' AND inserted GROUP BY ALL) r
    ON f.recipient = r.recipient AND f.cmid = r.cmid
  WHERE NOT list_contains(r.held, f.inbox_seq)),
inbox_seqs AS (
  SELECT node, seq, line, inbox_seq AS value,
         lag((seq, line, inbox_seq)) OVER (PARTITION BY node ORDER BY line, seq) AS prev
  FROM ev WHERE kind = 'inbox_insert' AND inserted AND inbox_seq IS NOT NULL),
published AS (
  -- per node in line order: the message events and new rows so far, and the last inbox_insert before; kept are the
  -- message events that outnumber the rows before them, on nodes with more message events than new rows
  SELECT * FROM (
    SELECT node, seq, line, is_message,
      sum(CAST(is_message AS INTEGER)) OVER (PARTITION BY node ORDER BY line, seq ROWS UNBOUNDED PRECEDING) AS messages,
      sum(CAST(is_new AS INTEGER)) OVER (PARTITION BY node ORDER BY line, seq ROWS UNBOUNDED PRECEDING) AS news,
      sum(CAST(is_message AS INTEGER) - CAST(is_new AS INTEGER)) OVER (PARTITION BY node) AS surplus,
      last_value(CASE WHEN NOT is_message THEN (seq, line) END IGNORE NULLS)
        OVER (PARTITION BY node ORDER BY line, seq ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING) AS prev
    FROM (SELECT node, seq, line, kind = 'sse_event' AS is_message,
                 kind = 'inbox_insert' AND coalesce(inserted, false) AS is_new
          FROM ev WHERE kind = 'inbox_insert' OR (kind = 'sse_event' AND event = 'message')))
  WHERE is_message AND surplus > 0 AND messages > news),
hooks AS (
  -- per (node, client_message_id, hook): its enqueues and marks, the first reply under another id than the derived
  SELECT h.*, n.last_ts FROM (
    SELECT node, client_message_id AS cmid, hook,
      count(*) FILTER (WHERE kind = 'hook_enqueue') AS enqueues,
      min((seq, line)) FILTER (WHERE kind = 'hook_enqueue') AS enq_first,
      max((seq, line)) FILTER (WHERE kind = 'hook_enqueue') AS enq_last,
      arg_min(ts_ms, (seq, line)) FILTER (WHERE kind = 'hook_enqueue') AS enq_ts,
      count(*) FILTER (WHERE kind = 'hook_run') AS runs,
      min((seq, line)) FILTER (WHERE kind = 'hook_run') AS run_first,
      max((seq, line)) FILTER (WHERE kind = 'hook_run') AS run_last,
      min((seq, line)) FILTER (WHERE kind = 'hook_run' AND reply_client_message_id IS NOT NULL
                                        AND reply_client_message_id <> derived) AS bad_reply
    FROM (SELECT *, 'hook.' || left(sha256(encode(client_message_id) || '\\x00'::BLOB || encode(hook)), 40)
                    AS derived
          FROM ev WHERE kind IN ('hook_enqueue', 'hook_run'))
    GROUP BY ALL) h
  LEFT JOIN node_end n ON n.node = h.node),
candidates AS (
  SELECT 'TRC-OUTBOX-LEGAL' AS invariant, [node, oid] AS k, node, seq, line,
         CASE WHEN same_row THEN node END AS r_node, CASE WHEN same_row THEN r.seq END AS r_seq,
         CASE WHEN same_row THEN r.line END AS r_line, false AS by_line,
         CASE WHEN delta IS NULL THEN 'outbox-not-a-transition'
              WHEN NOT from_ok THEN 'outbox-from'
              ELSE 'outbox-attempts' END AS detail,
         CAST((CASE WHEN same_row THEN r.att ELSE 0 END) + coalesce(delta, 0) AS VARCHAR) AS fact
  FROM wc WHERE is_ot AND (delta IS NULL OR NOT from_ok
                           OR att IS DISTINCT FROM (CASE WHEN same_row THEN r.att ELSE 0 END) + coalesce(delta, 0))
  UNION ALL
  -- what the lookup finds (k): the row as its last transition left it; before any, the row a decision created
  -- (`pending`, its fingerprint and id: the transition's event lost, E-32), else none
  SELECT 'TRC-IPC-CONSISTENT', [node, cmid], node, seq, line, CASE WHEN k IS NOT NULL THEN node END, k.seq,
         k.line, false,
         CASE WHEN st IS DISTINCT FROM coalesce(k.tos, 'none') THEN 'ipc-row-state'
              WHEN fm IS DISTINCT FROM xm THEN 'ipc-fingerprint-match'
              WHEN NOT tok THEN 'ipc-answer' ELSE 'ipc-outbox-id' END,
         CASE WHEN st IS DISTINCT FROM coalesce(k.tos, 'none') THEN coalesce(k.tos, 'none')
              WHEN fm IS DISTINCT FROM xm THEN CAST(xm AS VARCHAR)
              WHEN NOT tok THEN expected_answer END
  FROM (SELECT *, CASE WHEN k IS NOT NULL THEN fp = k.fp END AS xm FROM (
          SELECT *, CASE WHEN p IS NOT NULL THEN {{'seq': p.seq, 'line': p.line, 'tos': p.tos, 'oid': p.oid,
                                                   'fp': f.fp}}
                         WHEN m IS NOT NULL THEN {{'seq': m.seq, 'line': m.line, 'tos': 'pending', 'oid': m.oid,
                                                   'fp': m.fp}} END AS k
          FROM wc WHERE NOT is_ot))
  WHERE st IS DISTINCT FROM coalesce(k.tos, 'none') OR fm IS DISTINCT FROM xm OR NOT tok
        OR (k IS NOT NULL AND oid IS NOT NULL AND oid <> k.oid)
  UNION ALL
  SELECT 'TRC-FP-FROZEN', [node, oid], node, seq, line, node, f.seq, f.line, false, 'fp-changed', NULL
  FROM wc WHERE is_ot AND fp IS DISTINCT FROM f.fp
  UNION ALL
  SELECT 'TRC-ID-NEVER-FREED', [node, cmid], node, seq, line, node, f.seq, f.line, false, 'id-freed', NULL
  FROM wc WHERE is_ot AND fr = 'none' AND p IS NOT NULL
  UNION ALL
  SELECT 'TRC-MAX-AGE', [node, oid], node, seq, line, CASE WHEN moved THEN node END,
         CASE WHEN moved THEN r.seq END, CASE WHEN moved THEN r.line END, false, age_case, NULL
  FROM (SELECT *, age_case IN ('max-age-raised', 'max-age-enqueued-changed') AS moved FROM (
    SELECT *,
      CASE WHEN table_row = 'OB-PENDING-DISPATCH' AND max_age_at_ms IS NOT NULL AND ts_ms > max_age_at_ms
             THEN 'max-age-dispatched'
           WHEN table_row = 'OB-PENDING-MAX-AGE' AND (max_age_at_ms IS NULL OR ts_ms <= max_age_at_ms)
             THEN 'max-age-aged-out'
           WHEN same_row AND r.mag IS NOT NULL AND (max_age_at_ms IS NULL OR max_age_at_ms > r.mag)
             THEN 'max-age-raised'
           WHEN same_row AND enq IS DISTINCT FROM r.enq THEN 'max-age-enqueued-changed' END AS age_case
    FROM wc WHERE is_ot))
  WHERE age_case IS NOT NULL
  UNION ALL
  SELECT 'TRC-SIDE-EFFECTS', [mesh, cmid], bad[1], bad[2], bad[3], NULL, NULL, NULL, false,
         'side-effects-counts', NULL
  FROM ledger WHERE bad IS NOT NULL
  UNION ALL
  SELECT 'TRC-SIDE-EFFECTS', [mesh, cmid], accept[1], accept[2], accept[3], NULL, NULL, NULL, false,
         'side-effects-uncommitted', NULL
  FROM ledger WHERE accept IS NOT NULL AND commits = 0
  UNION ALL
  SELECT 'TRC-DONE-HAS-MESSAGE', [mesh, cmid], done[1], done[2], done[3], NULL, NULL, NULL, false,
         'done-uncommitted', NULL
  FROM ledger WHERE done IS NOT NULL AND commits = 0 AND scope
  UNION ALL
  SELECT 'TRC-DELIVERY-COMMITTED', [mesh, cmid], delivery[1], delivery[2], delivery[3], NULL, NULL, NULL,
         false, 'delivery-uncommitted', NULL
  FROM ledger WHERE delivery IS NOT NULL AND commits = 0
  UNION ALL
  SELECT 'TRC-ONE-MESSAGE', [mesh, cmid], high[1], high[2], high[3], low[1], low[2], low[3], false,
         'one-message-messages', CAST(n AS VARCHAR)
  FROM messages WHERE n > 1
  UNION ALL
  SELECT 'TRC-ONE-MESSAGE', [mesh, cmid], commit_last[1], commit_last[2], commit_last[3], commit_first[1],
         commit_first[2], commit_first[3], false, 'one-message-commits', CAST(commits AS VARCHAR)
  FROM messages WHERE n <= 1 AND commits > 1
  UNION ALL
  SELECT 'TRC-DELIVERY-ACKED', [mesh, delivery_id], last[1], last[2], last[3], NULL, NULL, NULL, false,
         'delivery-unacked', CAST(last_ts AS VARCHAR)
  FROM deliveries WHERE ack IS NULL AND lease + {grace} < last_ts
  UNION ALL
  SELECT 'TRC-DELIVERY-ACKED', [mesh, delivery_id], last[1], last[2], last[3], ack[1], ack[2], ack[3], false,
         'delivery-after-ack', NULL
  FROM deliveries WHERE ack IS NOT NULL AND last > ack
  UNION ALL
  SELECT 'TRC-DELIVERY-ACKED', [mesh, delivery_id], ack[1], ack[2], ack[3], NULL, NULL, NULL, false,
         'delivery-ack-unknown', NULL
  FROM unknown_acks
  UNION ALL
  SELECT 'TRC-ONE-INBOX-ROW', [recipient, cmid], high[1], high[2], high[3], low[1], low[2], low[3], false,
         'inbox-rows', CAST(n AS VARCHAR)
  FROM inbox
  UNION ALL
  SELECT 'TRC-FP-FROZEN', [node, k], node, new[1], new[2], node, old[1], old[2], false, 'fp-successor', NULL
  FROM requeues WHERE new IS NOT NULL AND old IS NOT NULL AND new[3] <> old[3]
  UNION ALL
  SELECT 'TRC-OUTBOX-LEGAL', [node, k], node, new[1], new[2], CASE WHEN old IS NOT NULL THEN node END, old[1],
         old[2], false, CASE WHEN old IS NULL THEN 'outbox-successor-orphan' ELSE 'outbox-successor-row' END, NULL
  FROM requeues WHERE new IS NOT NULL AND new[5] AND 'none|requeue|pending|' || new[4] IN (SELECT tkey FROM legal)
                      AND (old IS NULL OR new[4] <> old[4])
  UNION ALL
  SELECT 'TRC-EVENT-IDS-MONOTONIC', [node], node, seq, line, node, prev[1], prev[2], true, 'event_id-not-increasing',
         NULL
  FROM sse WHERE value <= prev[3]
  UNION ALL
  SELECT 'TRC-SEQ-MONOTONIC', [node], node, seq, line, node, prev[1], prev[2], true, 'seq-not-increasing', NULL
  FROM seqs WHERE value <= prev[3]
  UNION ALL
  SELECT 'TRC-NEW-ROW-TRACED', [node, cmid], node, nx.seq, nx.line, node, seq, line, false,
         CASE WHEN nx.is_ot THEN 'new-row-other-row' ELSE 'new-row-gone' END, NULL
  FROM fresh WHERE is_new AND nx IS NOT NULL
                   AND (NOT nx.is_ot OR nx.fp IS DISTINCT FROM fp OR (oid IS NOT NULL AND nx.oid IS DISTINCT FROM oid))
  UNION ALL
  SELECT 'TRC-NEW-ROW-TRACED', [f.node, f.cmid], f.node, f.seq, f.line, NULL, NULL, NULL, false,
         'new-row-untraced', CAST(c.later AS VARCHAR)
  FROM fresh f JOIN created c ON c.node = f.node WHERE f.is_new AND f.nx IS NULL AND c.later > f.seq
  UNION ALL
  SELECT 'TRC-INFLIGHT-RESOLVED', [node, last[5]], node, last[1], last[2], NULL, NULL, NULL, false,
         'inflight-unresolved', CAST(last_ts AS VARCHAR)
  FROM inflight WHERE last[4] + {ack_window} < last_ts
  UNION ALL
  SELECT 'TRC-DUP-FINGERPRINT', [mesh, cmid], node, seq, line, first[1], first[2], first[3], false,
         CASE WHEN same THEN 'dup-mismatch-same-fingerprint' ELSE 'dup-match-other-fingerprint' END, NULL
  FROM dups WHERE same <> (table_row = 'BRK-DUP-MATCH')
  UNION ALL
  SELECT 'TRC-DELIVERY-ATTEMPTS', [mesh, delivery_id], node, seq, line, prev[1], prev[2], prev[3], false,
         'attempt-not-increasing', NULL
  FROM attempts WHERE attempt <= prev[4]
  UNION ALL
  SELECT 'TRC-INBOX-SEQ-NAMES-ROW', [recipient, cmid], node, seq, line, first[1], first[2], first[3], false,
         'inbox-seq-misnamed', NULL
  FROM misnamed
  UNION ALL
  SELECT 'TRC-INBOX-SEQ-MONOTONIC', [node], node, seq, line, node, prev[1], prev[2], true, 'inbox_seq-not-increasing',
         NULL
  FROM inbox_seqs WHERE value <= prev[3]
  UNION ALL
  SELECT 'TRC-MESSAGE-EVENT-NEW-ROW', [node], node, seq, line, CASE WHEN prev IS NOT NULL THEN node END, prev[1],
         prev[2], true, 'message-event-without-row', CAST(news AS VARCHAR)
  FROM published
  UNION ALL
  SELECT 'TRC-HOOK-ONCE', [node, cmid, hook], node, enq_last[1], enq_last[2], node, enq_first[1],
         enq_first[2], false, 'hook-enqueued-twice', CAST(enqueues AS VARCHAR)
  FROM hooks WHERE enqueues > 1
  UNION ALL
  SELECT 'TRC-HOOK-ONCE', [node, cmid, hook], node, run_last[1], run_last[2], node, run_first[1],
         run_first[2], false, 'hook-finished-twice', CAST(runs AS VARCHAR)
  FROM hooks WHERE runs > 1
  UNION ALL
  SELECT 'TRC-HOOK-ENQUEUED', [node, cmid, hook], node, run_first[1], run_first[2],
         CASE WHEN enq_first IS NOT NULL THEN node END, enq_first[1], enq_first[2], false, 'hook-run-unenqueued', NULL
  FROM hooks WHERE run_first IS NOT NULL AND (enq_first IS NULL OR enq_first > run_first)
  UNION ALL
  SELECT 'TRC-HOOK-RUN-FINISHED', [node, cmid, hook], node, enq_first[1], enq_first[2], NULL, NULL,
         NULL, false, 'hook-run-unfinished', CAST(last_ts AS VARCHAR)
  FROM hooks WHERE enqueues > 0 AND runs = 0 AND enq_ts + {hook_window} < last_ts
  UNION ALL
  SELECT 'TRC-HOOK-REPLY-ID', [node, cmid, hook], node, bad_reply[1], bad_reply[2], NULL, NULL, NULL,
         false, 'hook-reply-id', NULL
  FROM hooks WHERE bad_reply IS NOT NULL)
SELECT invariant, k,
  arg_min((node, seq, line, r_node, r_seq, r_line, detail, fact),
          (CASE WHEN by_line THEN '' ELSE node END, CASE WHEN by_line THEN line ELSE seq END,
           coalesce(r_node, ''), coalesce(r_seq, -1), line, coalesce(r_line, -1))) AS first
FROM candidates GROUP BY invariant, k
"""


def check(paths: str | Path | list[str] | list[Path], threads: int | None = None, memory_limit: str | None = None,
          redelivery_grace_ms: int = DEFAULT_REDELIVERY_GRACE_MS,
          evidence_events: int = DEFAULT_EVIDENCE_EVENTS, ack_timeout_ms: int = DEFAULT_ACK_TIMEOUT_MS,
          ack_grace_ms: int = DEFAULT_ACK_GRACE_MS, hook_timeout_ms: int = DEFAULT_HOOK_TIMEOUT_MS,
          hook_grace_ms: int = DEFAULT_HOOK_GRACE_MS) -> Report:
    """Run the catalogue with DuckDB over the valid events of a trace (JSONL or Parquet, validated in SQL by
    ``_duck_input``); returns the violations with their evidence. Raises ``inputs.InputError`` for unusable input."""
    import duckdb

    from ._duck_input import load

    started = time.monotonic()
    paths = [str(p) for p in ([paths] if isinstance(paths, str | Path) else paths)]
    con = duckdb.connect()
    # Spill under the system temp directory, never into the working directory (DuckDB's default ``.tmp``).
    spill = Path(tempfile.gettempdir()) / f"meshtrace-duckdb-{os.getpid()}"
    con.execute(f"SET temp_directory = {_literal(str(spill))}")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    if memory_limit:
        con.execute(f"SET memory_limit = {_literal(memory_limit)}")
    con.execute("SET preserve_insertion_order = false")
    con.execute("SET enable_progress_bar = false")
    try:
        loaded = load(con, paths)
    except BaseException:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
        raise
    from .spark import STATES, ipc_answers, legal_transitions

    tables = Tables()
    con.execute("CREATE TEMP TABLE legal (tkey VARCHAR, delta INTEGER)")
    con.executemany("INSERT INTO legal VALUES (?, ?)", sorted(legal_transitions(tables).items()))
    con.execute("CREATE TEMP TABLE answers (answer VARCHAR)")
    con.executemany("INSERT INTO answers VALUES (?)", [(a,) for a in ipc_answers(tables)])
    con.execute("CREATE TEMP TABLE creating_decisions (table_row VARCHAR, http_status INTEGER)")
    con.executemany("INSERT INTO creating_decisions VALUES (?, ?)", sorted(tables.creating_decisions))
    con.execute("CREATE TEMP TABLE creating_transitions (from_state VARCHAR, event VARCHAR, to_state VARCHAR)")
    con.executemany("INSERT INTO creating_transitions VALUES (?, ?, ?)", sorted(tables.creating_transitions))
    con.execute("CREATE TEMP TABLE ipc_expected (k VARCHAR, answer VARCHAR)")
    con.executemany("INSERT INTO ipc_expected VALUES (?, ?)",
                    [(f"{state}|{text}", tables.ipc_answer(state, match)) for state in STATES
                     for match, text in ((None, "null"), (True, "true"), (False, "false"))])
    stats = con.execute("""
        SELECT node, source, mesh, min(seq - line), max(seq - line), max(ts_ms), count(*)
        FROM ev GROUP BY ALL""").fetchall()
    spread: dict[str, tuple[int, int]] = {}
    node_end: dict[str, int] = {}
    sources, broker_meshes, events = set(), set(), 0
    for node, source, mesh, low, high, last, n in stats:
        events += n
        sources.add(source)
        node_end[node] = max(node_end.get(node, -1), last)
        a, b = spread.get(node, (low, high))
        spread[node] = (min(a, low), max(b, high))
        if source == "broker" and mesh is not None:
            broker_meshes.add(mesh)
    check_node_count(len(node_end))
    # in the engine, not by executemany: that inserts row by row, a minute for 2^19 nodes
    con.execute("CREATE TEMP TABLE node_end AS SELECT node, max(ts_ms) AS last_ts FROM ev GROUP BY node")
    con.execute("CREATE TEMP TABLE broker_meshes (mesh VARCHAR)")
    if broker_meshes:
        con.executemany("INSERT INTO broker_meshes VALUES (?)", [(m,) for m in sorted(broker_meshes)])
    suspects = sorted(node for node, (low, high) in spread.items() if low != high)
    found = [(invariant_id, *first) for invariant_id, _, first in
             con.execute(_candidates_sql(redelivery_grace_ms, suspects, ack_timeout_ms + ack_grace_ms,
                                         hook_timeout_ms + hook_grace_ms)).fetchall()]
    counts = dict(Counter(candidate[0] for candidate in found))
    violations = _violations(con, found, evidence_events)
    con.close()
    loaded.close()
    shutil.rmtree(spill, ignore_errors=True)
    return Report("duckdb", ", ".join(map(str, paths)), events, sorted(sources), time.monotonic() - started,
                  sort_violations(violations), counts, loaded.invalid,
                  {"redelivery_grace_ms": redelivery_grace_ms, "ack_timeout_ms": ack_timeout_ms,
                   "ack_grace_ms": ack_grace_ms, "hook_timeout_ms": hook_timeout_ms,
                   "hook_grace_ms": hook_grace_ms},
                  sum(loaded.reasons.values()), loaded.reasons)


#: the prefix invariants whose evidence is one outbox row's transitions (the others take the whole subject's)
ONE_ROW = ("TRC-OUTBOX-LEGAL", "TRC-FP-FROZEN", "TRC-MAX-AGE")
SUCCESSOR_CASES = ("fp-successor", "outbox-successor-row", "outbox-successor-orphan")


def _violations(con: Any, found: list[tuple[Any, ...]], evidence_events: int) -> list[Violation]:
    """The chosen candidates ``(invariant, node, seq, line, r_node, r_seq, r_line, case, fact)`` as violations: keys,
    details and evidence read back by joining the dataset with small tables of the wanted positions and subjects."""
    if not found:
        return []
    wanted = {(c[1], c[3]) for c in found} | {(c[4], c[6]) for c in found if c[4] is not None}
    rows = {(row["node"], row["line"]): row for row in _joined(
        con, "wanted", "w_node VARCHAR, w_line BIGINT", sorted(wanted),
        "SELECT e.* FROM ev e JOIN wanted ON e.node = w_node AND e.line = w_line")}
    row_subjects, delivery_subjects = [], []
    for vid, (invariant_id, node, seq, line, _, _, _, case, _) in enumerate(found):
        if BY_ID[invariant_id].evidence != "prefix" or case in SUCCESSOR_CASES:  # a successor shows its pair
            continue
        event = rows[(node, line)]
        if invariant_id == "TRC-DELIVERY-ACKED":
            delivery_subjects.append((vid, event["mesh"], event["delivery_id"], node, seq, line))
        else:
            row_subjects.append((vid, node, event["client_message_id"],
                                 event["outbox_id"] if invariant_id in ONE_ROW else None,
                                 invariant_id == "TRC-IPC-CONSISTENT", seq, line))
    trim = (f"QUALIFY row_number() OVER (PARTITION BY vid ORDER BY e.node, e.seq, e.line) = 1 OR row_number() "
            f"OVER (PARTITION BY vid ORDER BY e.node DESC, e.seq DESC, e.line DESC) <= {evidence_events - 1}")
    prefixes: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in _joined(con, "row_subjects", "vid INTEGER, s_node VARCHAR, s_cmid VARCHAR, s_oid VARCHAR, "
                       "s_ipc BOOLEAN, s_seq BIGINT, s_line BIGINT", row_subjects, f"""
            SELECT vid, e.* FROM ev e JOIN row_subjects ON e.node = s_node AND e.client_message_id = s_cmid
            WHERE e.kind IN ('outbox_transition', 'ipc_decision') AND (e.kind = 'outbox_transition' OR s_ipc)
              AND (s_oid IS NULL OR e.outbox_id = s_oid) AND (e.seq, e.line) <= (s_seq, s_line) {trim}"""):
        prefixes[row["vid"]].append(row)
    for row in _joined(con, "delivery_subjects", "vid INTEGER, s_mesh VARCHAR, s_did VARCHAR, s_node VARCHAR, "
                       "s_seq BIGINT, s_line BIGINT", delivery_subjects, f"""
            SELECT vid, e.* FROM ev e JOIN delivery_subjects ON e.mesh = s_mesh AND e.delivery_id = s_did
            WHERE e.kind IN ('delivery', 'delivery_ack') AND (e.node, e.seq, e.line) <= (s_node, s_seq, s_line)
            {trim}"""):
        prefixes[row["vid"]].append(row)
    violations = []
    for vid, (invariant_id, node, seq, line, r_node, r_seq, r_line, case, fact) in enumerate(found):
        event = rows[(node, line)]
        related = None if r_node is None else rows[(r_node, r_line)]
        chosen = {(row["node"], row["line"]): row for row in prefixes.get(vid, [])}
        chosen[(node, line)] = event
        if related is not None:
            chosen[(r_node, r_line)] = related
        violations.append(Violation(
            invariant_id, tuple((name, str(event[name])) for name in BY_ID[invariant_id].key),
            EventRef(node, seq, line), None if r_node is None else EventRef(r_node, r_seq, r_line),
            detail_text(case, event, related, fact), evidence_entries(chosen.values())))
    return violations


def _joined(con: Any, table: str, columns: str, values: list[tuple[Any, ...]], query: str) -> list[dict[str, Any]]:
    """The rows of ``query`` (as dicts) after loading ``values`` into the temp table ``table`` (``columns``)."""
    if not values:
        return []
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} ({columns})")
    con.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(values[0]))})", values)
    cursor = con.execute(query)
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
