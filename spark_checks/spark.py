"""The Spark checks: the catalogue over a Parquet trace of any size, locally or on a cluster.

Run it as ``meshtrace check PATH [--master …]``, ``python -m spark_checks.spark PATH …`` or
``spark-submit spark_checks/spark.py PATH …`` (the same module; see spark_checks/README.md for cluster use).

Theory of operation. Everything is DataFrame operations -- no Python UDFs, and the few tables the driver builds go
to Spark as Arrow (`local_frame`) -- so executors never start Python and the plan is the same on two local cores or a
cluster.

1. One small pre-job (two aggregations, ``_summary``) learns each node's last ts, whether its ``seq - line`` is
   constant, which meshes have broker events, which sources are present, and -- from a sample -- which (node,
   client_message_id) subjects are heavy. For a Parquet trace it is the read's own pass, which also counts the
   invalid events; a JSONL trace's valid events are kept (``localCheckpoint``) after the read, which parsed and
   judged them, and the pre-job reads them from there.
2. One job runs the catalogue, reading the dataset four times:

   * the per-row invariants (outbox legality, IPC consistency, frozen fingerprint, ids never freed, max age) are
     windows over (node, client_message_id) in seq order. A heavy subject is split into chunks of ``chunk`` seq
     values, each its own window partition, and what a chunk needs from the chunks before it (the last transition,
     the first fingerprint) is carried in from a per-chunk summary, so no task holds a skewed subject at once;
   * the broker and inbox invariants are one aggregation over (mesh, client_message_id, sub-key) -- the broker
     message, the delivery or the recipient -- whose map-side partial aggregation absorbs skew (a delivery redelivered
     a million times is one partial row per task), then a second, small aggregation per (mesh, client_message_id);
   * requeue successors are matched to the rows they replace by one aggregation;
   * the per-node orderings (SSE event ids, and seq where ``seq - line`` is not constant) are windows over chunks of
     ``line``, with chunk boundaries checked on a per-chunk summary.

   Every branch yields candidate violations and one aggregation keeps the first per (invariant, key).
3. The reported violations' events and evidence are fetched with broadcast joins.

Shuffled rows stay narrow: a node is its index in name order, an event reference is one long ``(node index << 44) |
seq`` (ordering by it is ordering by (node, seq)), and a key travels as two independent 64- and 32-bit hashes (a
subject's, an outbox row's). Values the invariants compare (an outbox_id, a request fingerprint) are compared as
they are, never by a hash, which can be made to collide. Keys and evidence are read back from the events
themselves.
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file (spark-submit spark_checks/spark.py): make the package importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from spark_checks import format as fmt
from spark_checks.catalogue import (
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
from spark_checks.inputs import check_node_count
from spark_checks.oracle import Report, Tables, sort_violations
from spec import load_table

#: the outbox table's states, ``none`` (no row) first (spec/tables/outbox.yaml)
STATES = tuple(load_table("outbox")["inputs"]["state"])
NONE_CODE = STATES.index("none") + 1  # array_position (1-based) of "none" in STATES
PENDING_CODE = STATES.index("pending") + 1
START, START_ATTEMPTS = "start", "start-attempts"  # _rows' cases of a first transition starting at `pending`
DEFAULT_CHUNK = 1 << 17
SAMPLE_TARGET = 200  # sampled events expected from a subject of ``chunk`` events
#: the families of ``SparkChecker._by_line`` whose value strictly increases in a node's line order: flag -> (value
#: column, invariant, catalogue.DETAILS case)
LINE_ORDERED = {"e": ("event_id", "TRC-EVENT-IDS-MONOTONIC", "event_id-not-increasing"),
                "i": ("inbox_seq", "TRC-INBOX-SEQ-MONOTONIC", "inbox_seq-not-increasing"),
                "s": ("seq", "TRC-SEQ-MONOTONIC", "seq-not-increasing")}
SEQ_BITS = 44  # an event reference is (node index << SEQ_BITS) | seq
OT, IPC = "outbox_transition", "ipc_decision"


def spark_schema():
    """``format.FLAT_SCHEMA`` as a Spark schema."""
    from pyspark.sql import types as T

    mapping = {"int8": T.ByteType(), "int32": T.IntegerType(), "int64": T.LongType(), "string": T.StringType(),
               "bool": T.BooleanType(), "fixed_size_binary[32]": T.BinaryType()}
    return T.StructType([T.StructField(f.name, mapping[str(f.type)], True) for f in fmt.FLAT_SCHEMA])


def local_frame(spark: Any, rows: list[tuple[Any, ...]] | list[list[Any]], columns: str):
    """A DataFrame of driver-side ``rows`` (``columns``: ``"name type, ..."`` with types int, long, string, boolean),
    handed to Spark as an Arrow table: ``createDataFrame`` of Python rows pickles them, and executors would need
    Python workers to read them back."""
    import pyarrow as pa

    types = {"int": pa.int32(), "long": pa.int64(), "string": pa.string(), "boolean": pa.bool_()}
    fields = [column.split() for column in columns.split(",")]
    return spark.createDataFrame(pa.table({name: pa.array([row[k] for row in rows], types[kind])
                                           for k, (name, kind) in enumerate(fields)}))


def legal_transitions(tables: Tables) -> dict[str, int]:
    """``"from|event|to|table_row"`` -> attempts increment, for every transition the outbox table allows."""
    from reference.core import outbox

    document = outbox.table()
    found: dict[str, int] = {}
    for from_state in STATES:
        for event in document.inputs["event"]:
            for to_state in STATES[1:]:
                for row in document.rows:
                    delta = tables.attempts_delta(from_state, event, to_state, row.id)
                    if delta is not None:
                        found[f"{from_state}|{event}|{to_state}|{row.id}"] = delta
    return found


def ipc_answers(tables: Tables) -> list[str]:
    """``"row_state|fingerprint_match|table_row|http_status"`` for every answer the ipc_lookup table gives."""
    from reference.core import ipc

    answers = []
    for state in STATES:
        for match, text in ((None, "null"), (True, "true"), (False, "false")):
            row = ipc.table().lookup(row_state=state, fingerprint="match" if match in (None, True) else "mismatch")
            status = int(row.then["http_status"])
            if tables.ipc_answer_ok(state, match, row.id, status):
                answers.append(f"{state}|{text}|{row.id}|{status}")
    return answers


class SparkChecker:
    """Runs the catalogue with Spark."""

    def __init__(self, spark: Any, chunk: int = DEFAULT_CHUNK, redelivery_grace_ms: int = DEFAULT_REDELIVERY_GRACE_MS,
                 evidence_events: int = DEFAULT_EVIDENCE_EVENTS, limit: int | None = 100,
                 ack_timeout_ms: int = DEFAULT_ACK_TIMEOUT_MS, ack_grace_ms: int = DEFAULT_ACK_GRACE_MS,
                 hook_timeout_ms: int = DEFAULT_HOOK_TIMEOUT_MS, hook_grace_ms: int = DEFAULT_HOOK_GRACE_MS):
        self.spark = spark
        self.hook_timeout = hook_timeout_ms
        self.hook_grace = hook_grace_ms
        self.chunk = chunk
        self.grace = redelivery_grace_ms
        self.ack_timeout = ack_timeout_ms
        self.ack_grace = ack_grace_ms
        self.evidence_events = evidence_events
        self.limit = limit
        self.tables = Tables()
        self.timings: dict[str, float] = {}
        self._marked = 0.0

    # --- input --------------------------------------------------------------------------------------------------
    def read(self, paths: list[Path] | list[str]):
        """The valid events of the trace (JSONL or Parquet, any Hadoop URI; ``_spark_input``); what was invalid is
        kept in ``self.loaded``. Raises ``inputs.InputError`` for unusable input."""
        from spark_checks._spark_input import read

        frame, self.loaded = read(self.spark, [str(p) for p in paths], summary=self._summary)
        return frame

    # --- the run ------------------------------------------------------------------------------------------------
    def check(self, paths: Path | str | list[Path] | list[str]) -> Report:
        """The report of the catalogue over ``paths``. Raises ``inputs.InputError`` for unusable input, a file Spark
        fails to read included."""
        from spark_checks.inputs import spark_read_failures

        with spark_read_failures():
            return self._check(paths)

    def _check(self, paths: Path | str | list[Path] | list[str]) -> Report:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        started = time.monotonic()
        self.timings = {}
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        ev = self.read(paths)
        if self.loaded.trace.is_jsonl:  # lines parsed and judged once, not again in every pass over the events
            ev = ev.localCheckpoint()
        stats = self._stats(ev)
        self._mark("stats", started)
        names = stats["nodes"]
        ev = self.indexed(ev, stats)
        candidates = self._candidates(ev, stats)
        first = F.min(F.struct("o", "r", "e_pk", "e_line", "r_pk", "r_line", "mode", "detail")).alias("first")
        grouped = candidates.groupBy("invariant", "gs", "g1", "g2").agg(first).select("invariant", "first.*")
        # one job: each violation carries its invariant's count, and only the first ``limit`` (at least one, for
        # the count) are fetched, in the order every engine lists them (oracle.listing_order: the event's node,
        # seq and line, then the related event's, none first)
        per_invariant = Window.partitionBy("invariant")
        order = [F.col(c).asc_nulls_first() for c in ("e_pk", "e_line", "r_pk", "r_line")]
        ranked = grouped.select("*", F.count(F.lit(1)).over(per_invariant).alias("violations"),
                                F.row_number().over(per_invariant.orderBy(*order)).alias("rank"))
        if self.limit is not None:
            ranked = ranked.filter(F.col("rank") <= max(self.limit, 1))
        collected = ranked.collect()
        counts = {row["invariant"]: row["violations"] for row in collected}
        rows = [self._decode(row, names) for row in collected if self.limit is None or row["rank"] <= self.limit]
        self._mark("catalogue", started)
        violations = self._evidence(ev, rows)
        self._mark("evidence", started)
        return Report("spark", ", ".join(map(str, paths)), stats["events"], sorted(stats["sources"]),
                      time.monotonic() - started, sort_violations(violations), counts, self.loaded.invalid,
                      {"redelivery_grace_ms": self.grace, "evidence_events": self.evidence_events,
                       "ack_timeout_ms": self.ack_timeout, "ack_grace_ms": self.ack_grace,
                       "hook_timeout_ms": self.hook_timeout, "hook_grace_ms": self.hook_grace,
                       "chunk": self.chunk, "heavy_subjects": len(stats["heavy"]),
                       "master": self.spark.sparkContext.master, "timings": dict(self.timings)},
                      sum(self.loaded.reasons.values()), self.loaded.reasons)

    def _mark(self, name: str, started: float) -> None:
        """Time the step ``name``: from the previous mark (``started`` for the first) to now, never negative."""
        now = time.monotonic()
        self.timings[name] = round(now - (self._marked if self.timings else started), 3)
        self._marked = now

    @staticmethod
    def _decode(row: Any, names: list[str]) -> dict[str, Any]:
        mask = (1 << SEQ_BITS) - 1
        decoded = row.asDict()
        decoded["e_node"], decoded["e_seq"] = names[row["e_pk"] >> SEQ_BITS], row["e_pk"] & mask
        if row["r_pk"] is None:
            decoded["r_node"] = decoded["r_seq"] = None
        else:
            decoded["r_node"], decoded["r_seq"] = names[row["r_pk"] >> SEQ_BITS], row["r_pk"] & mask
        return decoded

    # --- the pre-job --------------------------------------------------------------------------------------------
    def _summary(self, frame):
        """The pre-job's aggregation: per-node statistics and the sampled heavy subjects of the valid events, and
        per ``reason`` the count of invalid ones when ``frame`` has that column (the judged events of a Parquet
        read, which this aggregation then counts in the same pass).

        The inner aggregation groups by (reason, node, source, mesh, sampled id), where the id is set for a sample
        of the valid outbox and IPC events only and an invalid event has only its reason; the outer one folds the
        sampled groups back into their node's statistics and lists the sampled ids that look heavy. Over judged
        events (a Parquet read) both also group by the node of every row holding a (node, line) position, valid or
        not, and carry the aggregates the read finds shared positions with (``_spark_input.position_aggregates``).
        """
        from pyspark.sql import functions as F

        from spark_checks._spark_input import position_aggregates, position_key

        judged = "reason" in frame.columns
        valid = F.col("reason").isNull() if judged else F.lit(True)
        reason = F.col("reason") if judged else F.lit(None).cast("string")
        fraction = min(1.0, SAMPLE_TARGET / self.chunk)
        threshold = self.chunk if fraction >= 1.0 else SAMPLE_TARGET // 2
        sampled = F.when(valid & F.col("kind").isin(OT, IPC) & (F.rand(11) < fraction), F.col("client_message_id"))
        # positions only where the read judges them: a JSONL trace's lines are numbered by the read, never shared
        positions = [position_key()] if judged else []
        inner = frame.groupBy(reason.alias("reason"), *[F.when(valid, F.col(c)).alias(c) for c in
                                                        ("node", "source", "mesh")], sampled.alias("sampled"),
                              *positions).agg(
            F.min(F.col("seq") - F.col("line")).alias("d_min"), F.max(F.col("seq") - F.col("line")).alias("d_max"),
            F.max("ts_ms").alias("last_ts"), F.count(F.lit(1)).alias("n"),
            *(position_aggregates(inner=True) if judged else []))
        return inner.groupBy("reason", "node", "source", "mesh", *(["pnode"] if judged else [])).agg(
            F.min("d_min").alias("d_min"), F.max("d_max").alias("d_max"), F.max("last_ts").alias("last_ts"),
            F.sum("n").alias("n"), *(position_aggregates(inner=False) if judged else []),
            F.collect_list(F.when(F.col("sampled").isNotNull() & (F.col("n") > threshold), F.col("sampled")))
            .alias("heavy"))

    def _stats(self, ev) -> dict[str, Any]:
        """The statistics the catalogue is planned with: ``_summary``'s rows from the read, when it counted the
        invalid events with them (Parquet), else from a job of their own (JSONL, whose lines are numbered after
        the read)."""
        rows = self.loaded.summary if self.loaded.summary is not None else self._summary(ev).collect()
        node_end: dict[str, int] = {}
        spread: dict[str, tuple[int, int]] = {}
        sources: set[str] = set()
        broker_meshes: set[str] = set()
        heavy: set[tuple[str, str]] = set()
        events = 0
        for row in rows:
            node = row["node"]
            events += row["n"]
            sources.add(row["source"])
            node_end[node] = max(node_end.get(node, -1), row["last_ts"])
            low, high = spread.get(node, (row["d_min"], row["d_max"]))
            spread[node] = (min(low, row["d_min"]), max(high, row["d_max"]))
            if row["source"] == "broker" and row["mesh"] is not None:
                broker_meshes.add(row["mesh"])
            heavy.update((node, cmid) for cmid in row["heavy"])
        return {"events": events, "sources": sources, "broker_meshes": broker_meshes, "node_end": node_end,
                "nodes": sorted(node_end), "heavy": sorted(heavy) if events > self.chunk else [],
                "seq_suspects": sorted(node for node, (low, high) in spread.items() if low != high)}

    def indexed(self, ev, stats: dict[str, Any]):
        """The events with their node's index ``ni`` (kept as ``self.node_ids``): what the families read."""
        from pyspark.sql import functions as F

        check_node_count(len(stats["nodes"]))  # a node index fits the event reference's 63 - SEQ_BITS bits
        self.node_ids = local_frame(self.spark, list(enumerate(stats["nodes"])), "ni int, node string")
        return ev.join(F.broadcast(self.node_ids), "node")

    # --- candidates ---------------------------------------------------------------------------------------------
    def families(self, ev, stats: dict[str, Any]) -> dict[str, Any]:
        """The catalogue's candidates, per family: a family's invariants share its reads, shuffles and windows."""
        return {"rows": self._rows(ev, stats["heavy"]), "messages": self._messages(ev, stats),
                "requeues": self._requeues(ev), "by_line": self._by_line(ev, stats),
                "deliveries": self._deliveries(ev, stats), "gaps": self._gaps(ev, stats)}

    def _candidates(self, ev, stats: dict[str, Any]):
        parts = list(self.families(ev, stats).values())
        result = parts[0]
        for part in parts[1:]:
            result = result.unionByName(part)
        return result

    @staticmethod
    def _pk(ni="ni", seq="seq"):
        """An event reference: (node index << 44) | seq, ordered as (node, seq)."""
        from pyspark.sql import functions as F

        ni = F.col(ni) if isinstance(ni, str) else ni
        seq = F.col(seq) if isinstance(seq, str) else seq
        return F.shiftleft(ni.cast("long"), SEQ_BITS) + seq.cast("long")

    @staticmethod
    def _position(pk="pk", line="line"):
        """An event's (pk, line) as one decimal ordered as the pair -- ``pk * 2**63 + line`` (a pk is below 2**63 and
        a line a non-negative long) -- for ``min_by``/``max_by``, which keep a fixed-width buffer (aggregated by
        hashing) where a struct would be sorted. Two events of one node sharing a seq are ordered by their lines, as
        the oracle and DuckDB order them; a pk alone would leave the pick to the shuffle's order."""
        from pyspark.sql import functions as F

        big = "decimal(38,0)"
        return F.col(pk).cast(big) * F.expr(f"CAST('{1 << 63}' AS {big})") + F.col(line).cast(big)

    @staticmethod
    def _candidate(invariant_id: str, gs, g1, g2, event, related, detail, by_line: bool = False,
                   mode: str | None = None, fact=None):
        """The candidate struct: key (gs, g1, g2), order (o, r), references, evidence mode and a detail.

        ``event`` and ``related`` are structs (or dicts) with ``pk`` and ``line``; ``detail`` is a case of
        ``catalogue.DETAILS`` (a name, or a string column choosing one) and ``fact`` the column holding its value.
        """
        from pyspark.sql import functions as F

        case = F.lit(detail) if isinstance(detail, str) else detail
        fact = F.lit(None) if fact is None else fact
        none_long = F.lit(None).cast("long")
        r_pk = none_long if related is None else related["pk"]
        r_line = none_long if related is None else related["line"]
        return F.struct(
            F.lit(invariant_id).alias("invariant"), F.coalesce(gs.cast("string"), F.lit("")).alias("gs"),
            g1.cast("long").alias("g1"), g2.cast("long").alias("g2"),
            (event["line"] if by_line else event["pk"]).cast("long").alias("o"),
            F.coalesce(r_pk, F.lit(-1)).cast("long").alias("r"),
            event["pk"].cast("long").alias("e_pk"), event["line"].cast("long").alias("e_line"),
            r_pk.cast("long").alias("r_pk"), r_line.cast("long").alias("r_line"),
            F.lit(mode or BY_ID[invariant_id].evidence).alias("mode"),
            F.struct(case.cast("string").alias("case"), fact.cast("string").alias("fact")).alias("detail"))

    @staticmethod
    def _explode(frame, *cases):
        """Rows -> one row per (condition, candidate struct) case that holds. The conditions are filtered on first,
        so candidate structs are only built for violating rows."""
        from pyspark.sql import functions as F

        anything = None
        for condition, _ in cases:
            anything = condition if anything is None else anything | condition
        candidates = [F.when(condition, candidate) for condition, candidate in cases]
        return (frame.filter(F.coalesce(anything, F.lit(False))).select(F.explode(F.array(*candidates)).alias("c"))
                .filter(F.col("c").isNotNull()).select("c.*"))

    def _rows(self, ev, heavy: list[tuple[str, str]]):
        """TRC-OUTBOX-LEGAL, TRC-IPC-CONSISTENT, TRC-FP-FROZEN, TRC-ID-NEVER-FREED, TRC-MAX-AGE."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        states = F.array(*[F.lit(s) for s in STATES])

        def code(column: str):
            return F.array_position(states, F.col(column)).cast("int")

        legal = legal_transitions(self.tables)
        legal_map = F.create_map(*[x for key, delta in legal.items() for x in (F.lit(key), F.lit(delta))])
        is_ot = F.col("kind") == OT
        delta = F.try_element_at(legal_map, F.concat_ws("|", "from_state", "event", "to_state", "table_row"))
        answer_ok = F.concat_ws("|", "row_state", F.coalesce(F.col("fingerprint_match").cast("string"),
                                                             F.lit("null")),
                                "table_row", F.col("http_status").cast("string")).isin(ipc_answers(self.tables))
        max_age = is_ot & (((F.col("table_row") == "OB-PENDING-DISPATCH") & F.col("max_age_at_ms").isNotNull()
                            & (F.col("ts_ms") > F.col("max_age_at_ms")))
                           | ((F.col("table_row") == "OB-PENDING-MAX-AGE")
                              & (F.col("max_age_at_ms").isNull() | (F.col("ts_ms") <= F.col("max_age_at_ms")))))
        match = F.when(F.col("fingerprint_match").isNull(), 0).when(F.col("fingerprint_match"), 1).otherwise(2)

        def bits(value, shift: int):
            return F.shiftleft(F.coalesce(value, F.lit(0)).cast("long"), shift)

        dispatch = F.col("table_row") == "OB-PENDING-DISPATCH"
        made = self._creating_decision() & F.col("outbox_id").isNotNull()
        # one long: from(4 bits) to(4) row_state(4) delta+1(4, 0 = not a legal transition) match(2) answer ok(1)
        # max age violated(1) is_ot(1) a dispatch(1) a decision creating a row(1)
        packed = (bits(code("from_state"), 0) + bits(code("to_state"), 4) + bits(code("row_state"), 8)
                  + bits(F.when(is_ot, delta + 1), 12) + bits(match, 16) + bits(answer_ok.cast("int"), 18)
                  + bits(max_age.cast("int"), 19) + bits(is_ot.cast("int"), 20) + bits(dispatch.cast("int"), 21)
                  + bits(made.cast("int"), 22))
        rows = ev.filter(F.col("kind").isin(OT, IPC)).select(
            "ni", "seq", "line", F.xxhash64("client_message_id").alias("c1"), F.hash("client_message_id").alias("c2"),
            # ids and fingerprints compared as they are (a 64-bit hash of each can be made to collide); an
            # outbox row's key is two independent hashes, as a subject's is
            F.col("outbox_id").alias("oid"), F.xxhash64("outbox_id").alias("o1"), F.hash("outbox_id").alias("o2"),
            F.col("request_fingerprint").alias("fp"),
            F.col("attempts").cast("long").alias("att"), F.col("max_age_at_ms").cast("long").alias("mag"),
            F.col("enqueued_at_ms").cast("long").alias("enq"), packed.alias("bits"))
        if heavy:
            marks = (local_frame(self.spark, heavy, "node string, cmid string").join(self.node_ids, "node")
                     .select("ni", F.xxhash64("cmid").alias("c1"), F.hash("cmid").alias("c2"),
                             F.lit(True).alias("heavy")))
            rows = rows.join(F.broadcast(marks), ["ni", "c1", "c2"], "left")
            chunk = F.when(F.col("heavy"), F.floor(F.col("seq") / self.chunk) + 1).otherwise(0)
        else:
            chunk = F.lit(0)
        rows = rows.withColumn("chunk", chunk.cast("long"))

        def field(shift: int, width: int):
            return F.shiftright(F.col("bits"), shift).bitwiseAND((1 << width) - 1).cast("int")

        rows = rows.select("*", field(0, 4).alias("fr"), field(4, 4).alias("to"), field(8, 4).alias("st"),
                           (field(12, 4) - 1).alias("delta"), field(16, 2).alias("fm"),
                           (field(18, 1) == 1).alias("tok"), (field(19, 1) == 1).alias("mav"),
                           (field(20, 1) == 1).alias("is_ot"), (field(21, 1) == 1).alias("dispatch"),
                           (field(22, 1) == 1).alias("made"))
        key = ["ni", "c1", "c2", "chunk"]
        w = Window.partitionBy(*key).orderBy("seq", "line")
        transition = F.struct("seq", "line", "to", "oid")
        first = F.struct("seq", "line", "fp")
        creation = F.struct("seq", "line", "fp", "oid")
        # the previous transition of the same outbox row (by its id as it is, not a hash): rows of one
        # client_message_id may interleave
        w_row = Window.partitionBy(*key, "oid").orderBy("seq", "line")
        row_transition = F.struct("seq", "line", "to", "att", "mag", "enq")
        windowed = rows.select(
            "*",
            F.last(F.when(F.col("is_ot"), transition), ignorenulls=True)
            .over(w.rowsBetween(Window.unboundedPreceding, -1)).alias("w_prev"),
            F.last(F.when(F.col("is_ot"), row_transition), ignorenulls=True)
            .over(w_row.rowsBetween(Window.unboundedPreceding, -1)).alias("w_row"),
            F.last(F.when(F.col("made"), creation), ignorenulls=True)
            .over(w.rowsBetween(Window.unboundedPreceding, -1)).alias("w_made"),
            F.first(F.when(F.col("is_ot"), first), ignorenulls=True)
            .over(w.rowsBetween(Window.unboundedPreceding, 0)).alias("w_first"))
        if heavy:
            summary = windowed.filter(F.col("chunk") > 0).groupBy(*key).agg(
                F.max(F.when(F.col("is_ot"), transition)).alias("last_t"),
                F.min(F.when(F.col("is_ot"), first)).alias("first_t"),
                F.max(F.when(F.col("made"), creation)).alias("made_t"))
            ws = Window.partitionBy("ni", "c1", "c2").orderBy("chunk").rowsBetween(Window.unboundedPreceding, -1)
            carry = summary.select(*key, F.last("last_t", ignorenulls=True).over(ws).alias("c_prev"),
                                   F.first("first_t", ignorenulls=True).over(ws).alias("c_first"),
                                   F.last("made_t", ignorenulls=True).over(ws).alias("c_made"))
            row_summary = windowed.filter((F.col("chunk") > 0) & F.col("is_ot")).groupBy(*key, "oid").agg(
                F.max(row_transition).alias("last_r"))
            wr = (Window.partitionBy("ni", "c1", "c2", "oid").orderBy("chunk")
                  .rowsBetween(Window.unboundedPreceding, -1))
            row_carry = row_summary.select(*key, "oid", F.last("last_r", ignorenulls=True).over(wr).alias("c_row"))
            windowed = (windowed.join(F.broadcast(carry), key, "left")
                        .join(F.broadcast(row_carry), [*key, "oid"], "left"))
            row_prev = F.coalesce(F.col("w_row"), F.col("c_row"))
            prev = F.coalesce(F.col("w_prev"), F.col("c_prev"))
            first_t = F.coalesce(F.col("c_first"), F.col("w_first"))
            made_t = F.coalesce(F.col("w_made"), F.col("c_made"))
        else:
            row_prev, prev, first_t, made_t = F.col("w_row"), F.col("w_prev"), F.col("w_first"), F.col("w_made")
        windowed = windowed.select("*", row_prev.alias("r"), prev.alias("p"), first_t.alias("f"), made_t.alias("m"))
        r, p, f, m = F.col("r"), F.col("p"), F.col("f"), F.col("m")
        same_row = F.col("is_ot") & r.isNotNull()
        # a row's first transition may start at `pending` when the trace shows the row created: a daemon stopped
        # between the commit that created the row and its event (E-32). Such a start (rare) is a candidate of its
        # own case, resolved against the created rows after the window (_resolve_starts).
        start = F.col("is_ot") & ~same_row & (F.col("fr") == PENDING_CODE)
        from_ok = F.coalesce(F.when(same_row, F.col("fr").eqNullSafe(r["to"])).otherwise(F.col("fr") == NONE_CODE),
                             F.lit(False))
        expected_attempts = F.when(same_row, r["att"]).otherwise(F.lit(0)) + F.greatest(F.col("delta"), F.lit(0))
        pk = self._pk()
        event = {"pk": pk, "line": F.col("line")}
        first_ref = {"pk": self._pk(seq=f["seq"]), "line": f["line"]}
        same_ref = {"pk": F.when(same_row, self._pk(seq=r["seq"])), "line": F.when(same_row, r["line"])}
        ot = F.col("is_ot")
        attempts_ok = F.col("att").eqNullSafe(expected_attempts)
        outbox = ot & ((F.col("delta") < 0) | ~from_ok | ~attempts_ok)
        # what a lookup finds: the row as its last transition left it; before any, the row a decision created
        # (`pending`, its fingerprint and id: the transition's event lost, E-32), else none
        known = p.isNotNull() | m.isNotNull()
        known_ref = {"pk": F.when(p.isNotNull(), self._pk(seq=p["seq"])).otherwise(self._pk(seq=m["seq"])),
                     "line": F.when(p.isNotNull(), p["line"]).otherwise(m["line"])}
        known_fp = F.when(p.isNotNull(), f["fp"]).otherwise(m["fp"])
        known_oid = F.when(p.isNotNull(), p["oid"]).otherwise(m["oid"])
        expected_state = F.coalesce(p["to"], F.when(m.isNotNull(), F.lit(PENDING_CODE)), F.lit(NONE_CODE))
        expected_match = F.when(~known, F.lit(0)).when(F.col("fp") == known_fp, 1).otherwise(2)
        ipc = ~ot & (~F.col("st").eqNullSafe(expected_state) | ~F.col("fm").eqNullSafe(expected_match)
                     | ~F.col("tok") | (known & F.col("oid").isNotNull() & (F.col("oid") != known_oid)))
        frozen = ot & ~F.col("fp").eqNullSafe(f["fp"])
        freed = ot & (F.col("fr") == NONE_CODE) & p.isNotNull()
        # TRC-MAX-AGE beyond the event itself: the row's previous transition had a lower deadline or another enqueue
        raised = ot & same_row & r["mag"].isNotNull() & (F.col("mag").isNull() | (F.col("mag") > r["mag"]))
        moved = ~F.col("mav") & (raised | (ot & same_row & ~F.col("enq").eqNullSafe(r["enq"])))
        age_case = (F.when(F.col("mav") & F.col("dispatch"), "max-age-dispatched")
                    .when(F.col("mav"), "max-age-aged-out").when(raised, "max-age-raised")
                    .otherwise("max-age-enqueued-changed"))
        moved_ref = {"pk": F.when(moved, self._pk(seq=r["seq"])), "line": F.when(moved, r["line"])}
        gs, o1, o2 = F.col("ni"), F.col("o1"), F.col("o2")

        def match_text(column):
            return F.when(column == 0, "null").when(column == 1, "true").when(column == 2, "false")

        state_name = F.when(F.col("st") > 0, F.element_at(states, F.greatest(F.col("st"), F.lit(1))))
        answers = self.tables.ipc_answer
        answer_map = F.create_map(*[F.lit(x) for state in STATES for match, text in
                                    ((None, "null"), (True, "true"), (False, "false"))
                                    for x in (f"{state}|{text}", answers(state, match))])
        outbox_case = (F.when(F.col("delta") < 0, "outbox-not-a-transition")
                       .when(start, F.when(attempts_ok, START).otherwise(START_ATTEMPTS))
                       .when(~from_ok, "outbox-from").otherwise("outbox-attempts"))
        wrong_state, wrong_match = ~F.col("st").eqNullSafe(expected_state), ~F.col("fm").eqNullSafe(expected_match)
        ipc_case = (F.when(wrong_state, "ipc-row-state").when(wrong_match, "ipc-fingerprint-match")
                    .when(~F.col("tok"), "ipc-answer").otherwise("ipc-outbox-id"))
        ipc_fact = (F.when(wrong_state, F.element_at(states, expected_state)).when(wrong_match,
                                                                                  match_text(expected_match))
                    .when(~F.col("tok"), F.try_element_at(answer_map, F.concat_ws("|", state_name,
                                                                                  match_text(F.col("fm"))))))
        return self._resolve_starts(ev, self._explode(
            windowed,
            (outbox, self._candidate("TRC-OUTBOX-LEGAL", gs, o1, o2, event, same_ref, outbox_case,
                                     fact=expected_attempts)),
            (ipc, self._candidate("TRC-IPC-CONSISTENT", gs, F.col("c1"), F.col("c2"), event, known_ref, ipc_case,
                                  fact=ipc_fact)),
            (frozen, self._candidate("TRC-FP-FROZEN", gs, o1, o2, event, first_ref, "fp-changed")),
            (freed, self._candidate("TRC-ID-NEVER-FREED", gs, F.col("c1"), F.col("c2"), event, first_ref,
                                    "id-freed")),
            (F.col("mav") | moved, self._candidate("TRC-MAX-AGE", gs, o1, o2, event, moved_ref,
                                                   age_case))))

    @staticmethod
    def _among(columns: tuple[str, ...], values: frozenset[tuple[Any, ...]]):
        """Whether the event's ``columns`` (none null) hold one of the tuples ``values``."""
        from pyspark.sql import functions as F

        parts = [F.col(columns[0]).cast("string")]
        for column in columns[1:]:
            parts += [F.lit("|"), F.col(column).cast("string")]
        joined = F.concat(*parts)  # null when any column is
        return F.coalesce(joined.isin(*["|".join(map(str, v)) for v in sorted(values)]), F.lit(False))

    def _creating_decision(self):
        """Whether an event is a decision whose table row creates an outbox row (``Tables.creating_decisions``)."""
        from pyspark.sql import functions as F

        return (F.col("kind") == IPC) & self._among(("table_row", "http_status"), self.tables.creating_decisions)

    def _resolve_starts(self, ev, candidates):
        """_rows' candidates with each first transition starting at `pending` resolved: legal (dropped, or
        reported for its attempts) when the node's trace shows the row created anywhere -- named by a decision whose
        table row creates it, or a successor named by a requeue whose table row inserts it (``Tables``) --, else
        reported as `outbox-from`."""
        from pyspark.sql import functions as F

        decided = ev.filter(self._creating_decision() & F.col("outbox_id").isNotNull()).select(
            "ni", F.xxhash64("outbox_id").alias("o1"), F.hash("outbox_id").alias("o2"))
        creating = self._among(("from_state", "event", "to_state"), self.tables.creating_transitions)
        requeued = ev.filter((F.col("kind") == OT) & creating & F.col("superseded_by").isNotNull()
                             & (F.col("superseded_by") != F.col("outbox_id"))).select(
            "ni", F.xxhash64("superseded_by").alias("o1"), F.hash("superseded_by").alias("o2"))
        # the outbox row's key as _rows gives it: two independent hashes of its id
        created = decided.unionByName(requeued).select(
            F.coalesce(F.col("ni").cast("string"), F.lit("")).alias("c_gs"), F.col("o1").cast("long").alias("c_g1"),
            F.col("o2").cast("long").alias("c_g2"), F.lit(True).alias("created")).dropDuplicates(["c_gs", "c_g1",
                                                                                                 "c_g2"])
        case = F.col("detail.case")
        starting = case.isin(START, START_ATTEMPTS)
        joined = candidates.join(created, starting & (F.col("gs") == F.col("c_gs")) & (F.col("g1") == F.col("c_g1"))
                                 & (F.col("g2") == F.col("c_g2")), "left")
        made = F.coalesce(F.col("created"), F.lit(False))
        resolved = (F.when(~starting, case).when(~made, "outbox-from")
                    .when(case == START_ATTEMPTS, "outbox-attempts"))
        return joined.filter(resolved.isNotNull()).select(
            *[c for c in candidates.columns if c != "detail"],
            F.struct(resolved.alias("case"), F.col("detail.fact").alias("fact")).alias("detail"))

    def _messages(self, ev, stats: dict[str, Any]):
        """The broker and inbox invariants: two aggregations with fixed-width buffers (hashed keys, longs and
        booleans), so Spark aggregates by hashing, map side first.

        * per (mesh, client_message_id, broker_message_id): TRC-SIDE-EFFECTS, TRC-DONE-HAS-MESSAGE,
          TRC-DELIVERY-COMMITTED, and by a window over its result, per (mesh, client_message_id) TRC-ONE-MESSAGE;
        * per (recipient, client_message_id): TRC-ONE-INBOX-ROW, and in the same aggregation per (node,
          client_message_id, hook): TRC-HOOK-ONCE, TRC-HOOK-ENQUEUED, TRC-HOOK-RUN-FINISHED, TRC-HOOK-REPLY-ID.
        """
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        kind = F.col("kind")
        named = (kind == "accept_decision") & F.col("broker_message_id").isNotNull()
        commit = kind == "accept_commit"
        done = (kind == OT) & (F.col("to_state") == "done")
        delivery = kind == "delivery"
        complete = ((F.col("effects_dedupe") == 1) & (F.col("effects_message") == 1)
                    & (F.col("effects_history") == 1) & (F.col("effects_delivery") == F.col("recipients")))
        broker_meshes = sorted(stats["broker_meshes"])
        in_scope = F.col("mesh").isin(broker_meshes) if broker_meshes else F.lit(False)
        pk = self._pk()

        def first(flag: str, name: str | None = None) -> list[Any]:
            name = name or flag
            return [F.min(F.when(F.col(flag), F.col("pk"))).alias(f"{name}_pk"),
                    F.min_by("line", F.when(F.col(flag), F.col("at"))).alias(f"{name}_line")]

        def last(flag: str, name: str) -> list[Any]:
            return [F.max(F.when(F.col(flag), F.col("pk"))).alias(f"{name}_pk"),
                    F.max_by("line", F.when(F.col(flag), F.col("at"))).alias(f"{name}_line")]

        def ref(name: str):
            return {"pk": F.col(f"{name}_pk"), "line": F.col(f"{name}_line")}

        blank = F.lit("")
        m1, m2 = F.col("m1"), F.col("m2")
        # --- per broker message
        flags = {"named": named | commit, "accept": named & (F.col("table_row") == "BRK-ACCEPT"),
                 "commit": commit, "bad": commit & ~F.coalesce(complete, F.lit(False)), "done": done,
                 "delivery": delivery}
        ledger = ev.filter(named | commit | done | delivery).select(
            F.xxhash64("mesh", "client_message_id").alias("m1"), F.hash("mesh", "client_message_id").alias("m2"),
            F.xxhash64("broker_message_id").alias("b1"), F.hash("broker_message_id").alias("b2"),
            pk.alias("pk"), "line", in_scope.alias("scope"), *[flag.alias(name) for name, flag in flags.items()]
        ).withColumn("at", self._position()).groupBy("m1", "m2", "b1", "b2").agg(
            *first("named"), *first("accept"), *first("commit"), *last("commit", "commit_last"), *first("bad"),
            *first("done"), *first("delivery"), F.count(F.when(F.col("commit"), 1)).alias("commits"),
            F.max("scope").alias("scope"))
        # per (mesh, client_message_id), over its broker messages that are named: a window over the ledger, the
        # ledger's one consumer (an aggregation of it would compute the ledger again, as `_new_rows` says); each
        # ledger row of a subject carries the subject's case, and the candidates' grouping keeps one
        is_named = F.col("named_pk").isNotNull()

        def if_named(column: str):
            return F.when(is_named, F.col(column))

        subject = Window.partitionBy("m1", "m2")
        ledger = ledger.select("*", *[self._position(f"{name}_pk", f"{name}_line").alias(f"{name}_at")
                                      for name in ("named", "commit", "commit_last")])
        ledger = ledger.select(
            "*", F.count(if_named("named_pk")).over(subject).alias("s_messages"),
            F.min(if_named("named_pk")).over(subject).alias("s_low_pk"),
            F.min_by(if_named("named_line"), if_named("named_at")).over(subject).alias("s_low_line"),
            F.max(if_named("named_pk")).over(subject).alias("s_high_pk"),
            F.max_by(if_named("named_line"), if_named("named_at")).over(subject).alias("s_high_line"),
            F.sum(if_named("commits")).over(subject).alias("s_commits"),
            F.min(if_named("commit_pk")).over(subject).alias("s_commit_pk"),
            F.min_by(if_named("commit_line"), if_named("commit_at")).over(subject).alias("s_commit_line"),
            F.max(if_named("commit_last_pk")).over(subject).alias("s_commit_last_pk"),
            F.max_by(if_named("commit_last_line"), if_named("commit_last_at")).over(subject)
            .alias("s_commit_last_line"))
        uncommitted = F.col("commits") == 0
        two = F.col("s_messages") > 1
        per_message = self._explode(
            ledger,
            (F.col("bad_pk").isNotNull(), self._candidate(
                "TRC-SIDE-EFFECTS", blank, m1, m2, ref("bad"), None, "side-effects-counts")),
            (F.col("accept_pk").isNotNull() & uncommitted, self._candidate(
                "TRC-SIDE-EFFECTS", blank, m1, m2, ref("accept"), None, "side-effects-uncommitted")),
            (F.col("done_pk").isNotNull() & uncommitted & F.col("scope"), self._candidate(
                "TRC-DONE-HAS-MESSAGE", blank, m1, m2, ref("done"), None, "done-uncommitted")),
            (F.col("delivery_pk").isNotNull() & uncommitted, self._candidate(
                "TRC-DELIVERY-COMMITTED", blank, m1, m2, ref("delivery"), None, "delivery-uncommitted")),
            (two, self._candidate("TRC-ONE-MESSAGE", blank, m1, m2, ref("s_high"), ref("s_low"),
                                  "one-message-messages", fact=F.col("s_messages"))),
            (~two & (F.col("s_commits") > 1), self._candidate(
                "TRC-ONE-MESSAGE", blank, m1, m2, ref("s_commit_last"), ref("s_commit"), "one-message-commits",
                fact=F.col("s_commits"))))
        ends = self._ends(stats).select(F.col("ni").alias("end_ni"), "end")
        # --- per inbox row and per hook run: one aggregation (one exchange) keyed by the family (``hk``) and its
        # subject, (recipient, client_message_id) for a new inbox row, (node, client_message_id, hook) for a hook
        # run's events
        row = (kind == "inbox_insert") & F.coalesce(F.col("inserted"), F.lit(False))
        enq, run = kind == "hook_enqueue", kind == "hook_run"
        hooked = enq | run
        derived = F.concat(F.lit("hook."), F.substring(
            F.sha2(F.concat(F.col("client_message_id"), F.lit("\x00"), F.col("hook")), 256), 1, 40))
        reply = F.col("reply_client_message_id")
        subject = ("ni", "client_message_id", "hook")
        inbox = ev.filter(row | hooked).select(
            hooked.alias("hk"),
            F.when(hooked, F.xxhash64(*subject)).otherwise(F.xxhash64("recipient", "client_message_id")).alias("m1"),
            F.when(hooked, F.hash(*subject)).otherwise(F.hash("recipient", "client_message_id")).alias("m2"),
            pk.alias("pk"), "line", "ts_ms", row.alias("ins"), enq.alias("enq"), run.alias("run"),
            (run & reply.isNotNull() & (reply != derived)).alias("bad")
        ).withColumn("at", self._position()).groupBy("hk", "m1", "m2").agg(
            F.count(F.when(F.col("ins"), 1)).alias("inserts"), *first("ins", "low"), *last("ins", "high"),
            F.count(F.when(F.col("enq"), 1)).alias("enqs"), *first("enq"), *last("enq", "enq_last"),
            F.min_by("ts_ms", F.when(F.col("enq"), F.col("at"))).alias("enq_ts"),
            F.count(F.when(F.col("run"), 1)).alias("runs"), *first("run"), *last("run", "run_last"), *first("bad"))
        inbox = inbox.join(F.broadcast(ends), F.shiftright(F.col("enq_pk"), SEQ_BITS) == F.col("end_ni"), "left")
        hk, enq_pk, run_pk = F.col("hk"), F.col("enq_pk"), F.col("run_pk")
        unenqueued = hk & run_pk.isNotNull() & (enq_pk.isNull() | (F.struct("enq_pk", "enq_line")
                                                                   > F.struct("run_pk", "run_line")))
        inserted = self._explode(
            inbox,
            (~hk & (F.col("inserts") > 1), self._candidate(
                "TRC-ONE-INBOX-ROW", blank, m1, m2, ref("high"), ref("low"), "inbox-rows", fact=F.col("inserts"))),
            (hk & (F.col("enqs") > 1), self._candidate(
                "TRC-HOOK-ONCE", blank, m1, m2, ref("enq_last"), ref("enq"), "hook-enqueued-twice",
                fact=F.col("enqs"))),
            (hk & (F.col("runs") > 1), self._candidate(
                "TRC-HOOK-ONCE", blank, m1, m2, ref("run_last"), ref("run"), "hook-finished-twice",
                fact=F.col("runs"))),
            (unenqueued, self._candidate("TRC-HOOK-ENQUEUED", blank, m1, m2, ref("run"), ref("enq"),
                                         "hook-run-unenqueued")),
            (hk & (F.col("enqs") > 0) & (F.col("runs") == 0)
             & (F.col("enq_ts") + (self.hook_timeout + self.hook_grace) < F.col("end")), self._candidate(
                "TRC-HOOK-RUN-FINISHED", blank, m1, m2, ref("enq"), None, "hook-run-unfinished",
                fact=F.col("end"))),
            (hk & F.col("bad_pk").isNotNull(), self._candidate(
                "TRC-HOOK-REPLY-ID", blank, m1, m2, ref("bad"), None, "hook-reply-id")))
        return per_message.unionByName(inserted)

    def _requeues(self, ev):
        """TRC-FP-FROZEN for requeue successors: the successor carries the fingerprint of the (first) row whose
        ``superseded_by`` names it; TRC-OUTBOX-LEGAL (REQUEUE-ATOMIC): a successor the replay finds legal has such a
        row, and that row's table_row."""
        from pyspark.sql import functions as F

        rows = [key.rpartition("|")[2] for key in legal_transitions(self.tables) if key.startswith("none|requeue|")]
        successor = F.col("from_state") == "none"
        legal = (successor & (F.col("to_state") == "pending") & (F.col("attempts") == 0)
                 & F.col("table_row").isin(rows))
        k = F.when(successor, F.col("outbox_id")).otherwise(F.col("superseded_by"))
        pairs = ev.filter((F.col("kind") == OT) & (F.col("event") == "requeue")
                          & (successor | (F.col("to_state") == "aborted"))).select(
            "ni", F.xxhash64(k).alias("k1"), F.hash(k).alias("k2"), successor.alias("successor"),
            self._pk().alias("pk"), "line", F.col("request_fingerprint").alias("fp"), "table_row",
            legal.alias("legal"))

        def first(is_successor: bool, name: str) -> list[Any]:
            order = F.when(F.col("successor") == F.lit(is_successor), F.col("at"))
            return [F.min(F.when(F.col("successor") == F.lit(is_successor), F.col("pk"))).alias(f"{name}_pk"),
                    F.min_by("line", order).alias(f"{name}_line"),
                    F.min_by("fp", order).alias(f"{name}_fp"), F.min_by("table_row", order).alias(f"{name}_row"),
                    F.min_by("legal", order).alias(f"{name}_legal")]

        pairs = pairs.withColumn("at", self._position()).groupBy("ni", "k1", "k2").agg(
            *first(True, "new"), *first(False, "old"))
        event = {"pk": F.col("new_pk"), "line": F.col("new_line")}
        related = {"pk": F.col("old_pk"), "line": F.col("old_line")}
        orphan = F.col("old_pk").isNull()
        # the key as _rows gives it, two hashes of the outbox_id: one violation per (node, outbox_id) across both
        k1, k2 = F.col("k1"), F.col("k2")
        return self._explode(pairs, (
            F.col("new_pk").isNotNull() & F.col("old_pk").isNotNull() & ~F.col("new_fp").eqNullSafe(F.col("old_fp")),
            self._candidate("TRC-FP-FROZEN", F.col("ni"), k1, k2, event, related, "fp-successor",
                            mode="pair")), (
            F.col("new_pk").isNotNull() & F.col("new_legal") & (orphan | (F.col("new_row") != F.col("old_row"))),
            self._candidate("TRC-OUTBOX-LEGAL", F.col("ni"), k1, k2, event,
                            {"pk": F.when(~orphan, F.col("old_pk")), "line": F.when(~orphan, F.col("old_line"))},
                            F.when(orphan, "outbox-successor-orphan").otherwise("outbox-successor-row"),
                            mode="pair")))

    def _by_line(self, ev, stats: dict[str, Any]):
        """The invariants over each node's events in line order, as one family ((node, chunk of ``line``)): one
        projection of the events flagged by what they are, one window over (node, chunk) in (line, seq) order, one
        aggregation per (node, chunk) and a window over that small summary, whose few rows a chunk needs from the
        chunks before it are broadcast back.

        * TRC-EVENT-IDS-MONOTONIC (every sse_event's event_id), TRC-INBOX-SEQ-MONOTONIC (the inbox_seq of each new
          inbox row), TRC-SEQ-MONOTONIC (every event's seq, on the nodes whose seqs and lines do not move together:
          ``seq_suspects``): within a chunk each value against the family's previous one, and a chunk's first
          against the last of the family's chunks before it;
        * TRC-MESSAGE-EVENT-NEW-ROW: on a node with more message events than new rows, the running counts of both
          in line order (what the chunks before carry in, plus the chunk's own) find the message events that
          outnumber the rows before them, each with the last inbox_insert before it.

        A node's valid events hold distinct lines (a shared position is invalid input) and a line may be any
        non-negative long, so the line is the order itself."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        kind = F.col("kind")
        insert = kind == "inbox_insert"
        new = insert & F.coalesce(F.col("inserted"), F.lit(False))
        suspects = stats["seq_suspects"]
        suspect = F.col("node").isin(suspects) if suspects else F.lit(False)
        flags = {"e": kind == "sse_event", "i": new & F.col("inbox_seq").isNotNull(), "s": suspect}
        rows = ev.filter((kind == "sse_event") | insert | suspect).select(
            "ni", "seq", "line", F.floor(F.col("line") / self.chunk).alias("chunk"),
            *[flag.alias(f"is_{name}") for name, flag in flags.items()],
            *[F.col(column).cast("long").alias(f"v_{name}") for name, (column, _, _) in LINE_ORDERED.items()],
            ((kind == "sse_event") & (F.col("event") == "message")).cast("int").alias("message"),
            new.cast("int").alias("new"), insert.alias("ins"))

        def point(name: str):
            return F.struct("line", "seq", F.col(f"v_{name}").alias("value"))

        w = Window.partitionBy("ni", "chunk").orderBy("line", "seq")
        before, upto = w.rowsBetween(Window.unboundedPreceding, -1), w.rowsBetween(Window.unboundedPreceding, 0)
        windowed = rows.select(
            "*", *[F.last(F.when(F.col(f"is_{name}"), point(name)), ignorenulls=True).over(before).alias(f"p_{name}")
                   for name in LINE_ORDERED],
            F.sum("message").over(upto).alias("run_messages"), F.sum("new").over(upto).alias("run_news"),
            F.last(F.when(F.col("ins"), F.struct("line", "seq")), ignorenulls=True).over(before).alias("p_ins"))
        # per (node, chunk): each family's last value, the message events, the new rows and the last insert
        tails = []
        for name in LINE_ORDERED:
            order = F.when(F.col(f"is_{name}"), F.col("line"))
            tails += [F.max(order).alias(f"tail_line_{name}"), F.max_by("seq", order).alias(f"tail_seq_{name}"),
                      F.max_by(f"v_{name}", order).alias(f"tail_v_{name}")]
        last_insert = F.when(F.col("ins"), F.col("line"))
        summary = rows.groupBy("ni", "chunk").agg(
            *tails, F.sum("message").alias("messages"), F.sum("new").alias("news"),
            F.max(last_insert).alias("last_line"), F.max_by("seq", last_insert).alias("last_seq"))
        node = Window.partitionBy("ni")
        earlier = node.orderBy("chunk").rowsBetween(Window.unboundedPreceding, -1)

        def tail(name: str):
            return F.when(F.col(f"tail_line_{name}").isNotNull(), F.struct(
                F.col(f"tail_line_{name}").alias("line"), F.col(f"tail_seq_{name}").alias("seq"),
                F.col(f"tail_v_{name}").alias("value")))

        last = F.when(F.col("last_line").isNotNull(), F.struct(F.col("last_line").alias("line"),
                                                                F.col("last_seq").alias("seq")))
        carried = summary.select(
            "ni", "chunk", *[F.last(tail(name), ignorenulls=True).over(earlier).alias(f"c_{name}")
                             for name in LINE_ORDERED],
            (F.sum("messages").over(node) - F.sum("news").over(node)).alias("surplus"),
            F.coalesce(F.sum("messages").over(earlier), F.lit(0)).alias("messages_before"),
            F.coalesce(F.sum("news").over(earlier), F.lit(0)).alias("news_before"),
            F.last(last, ignorenulls=True).over(earlier).alias("last_before"))
        # what a chunk needs from before it: a chunk after a node's first (a node of more than ``chunk`` lines), or
        # a node with more message events than new rows -- few rows, broadcast
        needed = F.col("surplus") > 0
        for name in LINE_ORDERED:
            needed = needed | F.col(f"c_{name}").isNotNull()
        carried = carried.filter(needed)
        joined = windowed.join(F.broadcast(carried), ["ni", "chunk"], "left")
        zero = F.lit(0)
        here = {"pk": self._pk(), "line": F.col("line")}

        def at(column: str):
            return {"pk": self._pk(seq=F.col(f"{column}.seq")), "line": F.col(f"{column}.line")}

        cases = []
        for name, (_, invariant_id, case) in LINE_ORDERED.items():
            value, previous, carried_in = F.col(f"v_{name}"), F.col(f"p_{name}"), F.col(f"c_{name}")
            is_name = F.col(f"is_{name}")
            cases += [(is_name & (value <= previous["value"]), self._candidate(
                          invariant_id, F.col("ni"), zero, zero, here, at(f"p_{name}"), case, by_line=True)),
                      (is_name & previous.isNull() & (value <= carried_in["value"]), self._candidate(
                          invariant_id, F.col("ni"), zero, zero, here, at(f"c_{name}"), case, by_line=True))]
        messages = F.col("messages_before") + F.col("run_messages")
        news = F.col("news_before") + F.col("run_news")
        cases.append(((F.col("message") == 1) & (F.col("surplus") > 0) & (messages > news), self._candidate(
            "TRC-MESSAGE-EVENT-NEW-ROW", F.col("ni"), zero, zero, here,
            {"pk": self._pk(seq=F.coalesce(F.col("p_ins.seq"), F.col("last_before.seq"))),
             "line": F.coalesce(F.col("p_ins.line"), F.col("last_before.line"))},
            "message-event-without-row", by_line=True, fact=news)))
        return self._explode(joined, *cases)

    def _gaps(self, ev, stats: dict[str, Any]):
        """TRC-NEW-ROW-TRACED, TRC-INFLIGHT-RESOLVED, TRC-DUP-FINGERPRINT and TRC-INBOX-SEQ-NAMES-ROW."""
        return (self._new_rows(ev, self._ends(stats)).unionByName(self._duplicates(ev))
                .unionByName(self._inbox_names(ev)))

    def _new_rows(self, ev, ends):
        """TRC-NEW-ROW-TRACED and TRC-INFLIGHT-RESOLVED, in one window over (node, client_message_id) of the
        transitions and the decisions that found no row (a re-posted hot id has one), in descending seq order: the
        nearest later event is ``last`` over the rows before (linear, where a frame of the rows after would rescan
        them), and the subject's last transition an aggregate over the whole partition (computed once per
        partition). The window has one consumer: Catalyst prunes each consumer's unused window columns, so two
        consumers would each shuffle, sort and window the rows again. Each node's latest creation of a row it
        dispatched comes from a hash aggregation of the transitions instead."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        is_ot = F.col("kind") == OT
        found_none = (F.col("kind") == IPC) & (F.col("row_state") == "none")
        is_new = self._creating_decision()
        fresh = ev.filter(is_ot | found_none | is_new).select(
            "ni", "seq", "line", "ts_ms", F.xxhash64("client_message_id").alias("c1"),
            F.hash("client_message_id").alias("c2"), F.col("outbox_id").alias("oid"),
            F.xxhash64("outbox_id").alias("o1"), F.hash("outbox_id").alias("o2"),
            F.col("request_fingerprint").alias("fp"),
            is_ot.alias("is_ot"), (is_ot | found_none).alias("follows"), is_new.alias("is_new"),
            (is_ot & (F.col("to_state") == "inflight")).alias("inflight"))
        down = Window.partitionBy("ni", "c1", "c2").orderBy(F.col("seq").desc(), F.col("line").desc())
        whole = down.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
        fresh = fresh.select(
            "*", F.last(F.when(F.col("follows"), F.struct("seq", "line", "is_ot", "fp", "oid")), ignorenulls=True)
            .over(down.rowsBetween(Window.unboundedPreceding, -1)).alias("nx"),
            F.max(F.when(F.col("is_ot"), F.struct("seq", "line"))).over(whole).alias("last"))
        # per node, the latest first seq of a subject (its first transition, whatever its `from`: an accept's event
        # may be lost, E-32) among the subjects it dispatched
        subjects = ev.filter(is_ot).groupBy(
            "ni", F.xxhash64("client_message_id").alias("c1"), F.hash("client_message_id").alias("c2")).agg(
            F.max(F.col("event") == "dispatch").alias("dispatched"),
            F.min("seq").alias("created"))
        created = subjects.filter(F.col("dispatched")).groupBy("ni").agg(F.max("created").alias("later"))
        rows = fresh.join(F.broadcast(created), "ni", "left").join(F.broadcast(ends), "ni", "left")
        nxt, d = F.col("nx"), {"pk": self._pk(), "line": F.col("line")}
        other = ~nxt["is_ot"] | ~nxt["fp"].eqNullSafe(F.col("fp")) | (
            F.col("oid").isNotNull() & ~nxt["oid"].eqNullSafe(F.col("oid")))
        gs, c1, c2 = F.col("ni"), F.col("c1"), F.col("c2")
        new = F.col("is_new")
        last = F.col("inflight") & (F.struct("seq", "line") == F.col("last"))
        return self._explode(
            rows,
            (new & nxt.isNotNull() & other, self._candidate(
                "TRC-NEW-ROW-TRACED", gs, c1, c2, {"pk": self._pk(seq=nxt["seq"]), "line": nxt["line"]}, d,
                F.when(nxt["is_ot"], "new-row-other-row").otherwise("new-row-gone"))),
            (new & nxt.isNull() & (F.col("later") > F.col("seq")), self._candidate(
                "TRC-NEW-ROW-TRACED", gs, c1, c2, d, None, "new-row-untraced", fact=F.col("later"))),
            (last & (F.col("ts_ms") + (self.ack_timeout + self.ack_grace) < F.col("end")), self._candidate(
                "TRC-INFLIGHT-RESOLVED", gs, F.col("o1"), F.col("o2"), d, None, "inflight-unresolved",
                fact=F.col("end"))))

    def _duplicates(self, ev):
        """TRC-DUP-FINGERPRINT: per (mesh, client_message_id, fingerprint) the first BRK-DUP-MATCH and BRK-DUP-MISMATCH
        decision carrying it, then each compared with the subject's first commit (a map-side aggregation, then a
        window over its small result: a retried id is not held in one task)."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        kind, row = F.col("kind"), F.col("table_row")
        commit = kind == "accept_commit"
        match = (kind == "accept_decision") & (row == "BRK-DUP-MATCH")
        mismatch = (kind == "accept_decision") & (row == "BRK-DUP-MISMATCH")
        point = F.struct(self._pk().alias("pk"), "line")
        groups = ev.filter(commit | match | mismatch).select(
            F.xxhash64("mesh", "client_message_id").alias("m1"), F.hash("mesh", "client_message_id").alias("m2"),
            F.col("request_fingerprint").alias("fp"), point.alias("at"), commit.alias("commit"),
            match.alias("match"), mismatch.alias("mismatch"))
        by_fp = groups.groupBy("m1", "m2", "fp").agg(
            *[F.min(F.when(F.col(flag), F.col("at"))).alias(flag) for flag in ("commit", "match", "mismatch")])
        # each fingerprint's row with the subject's first commit: a window over the small aggregate, its one
        # consumer (an aggregation of it joined back would compute it twice, as `_new_rows` says)
        subject = Window.partitionBy("m1", "m2")
        joined = by_fp.select("*", F.min(F.when(F.col("commit").isNotNull(), F.struct(
            F.col("commit").alias("at"), "fp"))).over(subject).alias("c")).filter(F.col("c").isNotNull())
        same = F.col("fp").eqNullSafe(F.col("c.fp"))
        blank, m1, m2 = F.lit(""), F.col("m1"), F.col("m2")
        related = {"pk": F.col("c.at.pk"), "line": F.col("c.at.line")}
        return self._explode(
            joined,
            (F.col("match").isNotNull() & ~same, self._candidate(
                "TRC-DUP-FINGERPRINT", blank, m1, m2, F.col("match"), related, "dup-match-other-fingerprint")),
            (F.col("mismatch").isNotNull() & same, self._candidate(
                "TRC-DUP-FINGERPRINT", blank, m1, m2, F.col("mismatch"), related, "dup-mismatch-same-fingerprint")))

    def _deliveries(self, ev, stats: dict[str, Any]):
        """The invariants per (mesh, delivery_id), as one family: one window over its deliveries and acks in (node,
        seq, line) order, whose whole-partition aggregates give each subject's last delivery (with its lease), its
        first ack, and by a second window on the same exchange whether each named delivery was traced; the
        candidates are rows of those windows.

        * TRC-DELIVERY-ATTEMPTS: each delivery's attempt against the delivery before it;
        * TRC-DELIVERY-ACKED: at the subject's last delivery, no ack though its lease (plus the redelivery grace)
          ended before its node's trace did, or a delivery after the first ack; at an ack, that no delivery of the
          subject was traced with its recipient and broker message (one violation per subject: the candidates'
          grouping keeps the first).

        A delivery's leases are few; a window partition holding many spills rather than failing."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        delivery, ack = F.col("kind") == "delivery", F.col("kind") == "delivery_ack"
        named_by = ("mesh", "delivery_id", "recipient", "broker_message_id")
        rows = ev.filter(delivery | ack).select(
            F.xxhash64("mesh", "delivery_id").alias("m1"), F.hash("mesh", "delivery_id").alias("m2"),
            self._pk().alias("pk"), "line", F.col("lease_until_ms").alias("lease"),
            F.col("attempt").cast("long").alias("attempt"), delivery.alias("delivery"), ack.alias("ack"),
            F.xxhash64(*named_by).alias("d1"), F.hash(*named_by).alias("d2"))
        w = Window.partitionBy("m1", "m2").orderBy("pk", "line")
        whole = w.rowsBetween(Window.unboundedPreceding, Window.unboundedFollowing)
        is_delivery, is_ack = F.col("delivery"), F.col("ack")
        windowed = rows.select(
            "*", F.max(F.when(is_delivery, F.struct("pk", "line", "lease"))).over(whole).alias("last"),
            F.min(F.when(is_ack, F.struct("pk", "line"))).over(whole).alias("first_ack"),
            # whether a delivery with the event's recipient and broker message was traced: a window of the same
            # exchange (its partitions hold whole subjects) by the named delivery, never a list of a subject's
            # deliveries on each of its rows (a subject redelivered to many recipients would hold a square of them)
            F.max(is_delivery).over(Window.partitionBy("m1", "m2", "d1", "d2")).alias("traced"),
            F.last(F.when(is_delivery, F.struct("pk", "line", "attempt")), ignorenulls=True)
            .over(w.rowsBetween(Window.unboundedPreceding, -1)).alias("prev"))
        ends = self._ends(stats).select(F.col("ni").alias("end_ni"), "end")
        windowed = windowed.join(F.broadcast(ends), F.shiftright(F.col("last.pk"), SEQ_BITS) == F.col("end_ni"),
                                 "left")
        blank, m1, m2 = F.lit(""), F.col("m1"), F.col("m2")
        here = {"pk": F.col("pk"), "line": F.col("line")}
        last, first_ack = F.col("last"), F.col("first_ack")
        at_last = is_delivery & (F.col("pk") == last["pk"]) & (F.col("line") == last["line"])
        return self._explode(
            windowed,
            (is_delivery & (F.col("attempt") <= F.col("prev.attempt")), self._candidate(
                "TRC-DELIVERY-ATTEMPTS", blank, m1, m2, here, F.col("prev"), "attempt-not-increasing")),
            (at_last & first_ack.isNull() & (last["lease"] + self.grace < F.col("end")), self._candidate(
                "TRC-DELIVERY-ACKED", blank, m1, m2, here, None, "delivery-unacked", fact=F.col("end"))),
            (at_last & first_ack.isNotNull() & (F.struct(last["pk"], last["line"])
                                                > F.struct(first_ack["pk"], first_ack["line"])),
             self._candidate("TRC-DELIVERY-ACKED", blank, m1, m2, here, first_ack, "delivery-after-ack")),
            (is_ack & ~F.col("traced"), self._candidate(
                "TRC-DELIVERY-ACKED", blank, m1, m2, here, None, "delivery-ack-unknown")))

    def _ends(self, stats: dict[str, Any]):
        """Each node's index and the ts_ms its trace ends at: a small table, broadcast where it is joined."""
        return local_frame(self.spark, sorted(stats["node_end"].items()), "node string, end long").join(
            self.node_ids, "node").select("ni", "end")

    def _inbox_names(self, ev):
        """TRC-INBOX-SEQ-NAMES-ROW: per (recipient, client_message_id, inbox_seq) whether an inserted row holds the
        seq and the first redelivery naming it, then per (recipient, client_message_id) the first redelivery naming a
        seq no inserted row holds (two map-side aggregations)."""
        from pyspark.sql import functions as F

        inserted = F.coalesce(F.col("inserted"), F.lit(False))
        named = ~inserted & F.col("inbox_seq").isNotNull()
        point = F.struct(self._pk().alias("pk"), "line")
        by_seq = ev.filter((F.col("kind") == "inbox_insert") & (inserted | named)).select(
            F.xxhash64("recipient", "client_message_id").alias("m1"),
            F.hash("recipient", "client_message_id").alias("m2"), "inbox_seq", inserted.alias("inserted"),
            named.alias("named"), point.alias("at")
        ).groupBy("m1", "m2", "inbox_seq").agg(
            F.max("inserted").alias("held"), F.min(F.when(F.col("inserted"), F.col("at"))).alias("row"),
            F.min(F.when(F.col("named"), F.col("at"))).alias("named"))
        subjects = by_seq.groupBy("m1", "m2").agg(
            F.min("row").alias("row"), F.min(F.when(~F.col("held"), F.col("named"))).alias("bad"))
        blank, m1, m2 = F.lit(""), F.col("m1"), F.col("m2")
        return self._explode(subjects, (F.col("row").isNotNull() & F.col("bad").isNotNull(), self._candidate(
            "TRC-INBOX-SEQ-NAMES-ROW", blank, m1, m2, F.col("bad"), F.col("row"), "inbox-seq-misnamed")))

    # --- evidence -----------------------------------------------------------------------------------------------
    def _evidence(self, ev, rows: list[dict[str, Any]]) -> list[Violation]:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        if not rows:
            return []
        spark = self.spark
        refs = {(r["e_node"], r["e_line"]) for r in rows} | {(r["r_node"], r["r_line"]) for r in rows
                                                             if r["r_node"] is not None}
        wanted = local_frame(spark, sorted(refs), "node string, line long")
        # an event's place in its JSONL file, when the reader kept it (catalogue.evidence_entry)
        columns = [*fmt.COLUMNS, *(c for c in ("file", "file_line") if c in ev.columns and c not in fmt.COLUMNS)]
        fetched = {(row["node"], row["line"]): row.asDict() for row in
                   ev.join(F.broadcast(wanted), ["node", "line"]).select(*columns).collect()}
        keep = self.evidence_events - 1
        row_subjects, delivery_subjects = [], []
        for vid, r in enumerate(rows):
            if r["mode"] != "prefix":
                continue
            event = fetched[(r["e_node"], r["e_line"])]
            if r["invariant"] == "TRC-DELIVERY-ACKED":
                delivery_subjects.append((vid, event["mesh"], event["delivery_id"], r["e_node"], r["e_seq"],
                                          r["e_line"]))
            else:
                one_row = r["invariant"] in ("TRC-OUTBOX-LEGAL", "TRC-FP-FROZEN", "TRC-MAX-AGE")
                row_subjects.append((vid, event["node"], event["client_message_id"],
                                     event["outbox_id"] if one_row else None,
                                     r["invariant"] == "TRC-IPC-CONSISTENT", r["e_seq"], r["e_line"]))
        prefixes: dict[int, list[dict[str, Any]]] = defaultdict(list)
        up = Window.partitionBy("vid").orderBy("node", "seq", "line")
        down = Window.partitionBy("vid").orderBy(F.col("node").desc(), F.col("seq").desc(), F.col("line").desc())

        def trimmed(frame) -> list[Any]:
            return (frame.withColumn("up", F.row_number().over(up)).withColumn("down", F.row_number().over(down))
                    .filter((F.col("up") == 1) | (F.col("down") <= keep)).drop("up", "down").collect())

        if row_subjects:
            subjects = local_frame(spark, row_subjects, "vid int, s_node string, s_cmid string, s_oid string, "
                                                    "s_ipc boolean, s_seq long, s_line long")
            joined = ev.filter(F.col("kind").isin(OT, IPC)).join(
                F.broadcast(subjects), (F.col("node") == F.col("s_node"))
                & (F.col("client_message_id") == F.col("s_cmid"))).filter(
                ((F.col("kind") == OT) | F.col("s_ipc"))
                & (F.col("s_oid").isNull() | (F.col("outbox_id") == F.col("s_oid")))
                & (F.struct("seq", "line") <= F.struct("s_seq", "s_line")))
            for row in trimmed(joined.select("vid", *columns)):
                prefixes[row["vid"]].append(row.asDict())
        if delivery_subjects:
            subjects = local_frame(spark, delivery_subjects, "vid int, s_mesh string, s_did string, "
                                                         "s_node string, s_seq long, s_line long")
            joined = ev.filter(F.col("kind").isin("delivery", "delivery_ack")).join(
                F.broadcast(subjects), (F.col("mesh") == F.col("s_mesh"))
                & (F.col("delivery_id") == F.col("s_did"))).filter(
                F.struct("node", "seq", "line") <= F.struct("s_node", "s_seq", "s_line"))
            for row in trimmed(joined.select("vid", *columns)):
                prefixes[row["vid"]].append(row.asDict())
        violations = []
        for vid, r in enumerate(rows):
            event_row = fetched[(r["e_node"], r["e_line"])]
            related = None if r["r_node"] is None else EventRef(r["r_node"], r["r_seq"], r["r_line"])
            related_row = None if related is None else fetched[(related.node, related.line)]
            chosen = {(row["node"], row["line"]): row for row in prefixes.get(vid, [])}
            chosen[(r["e_node"], r["e_line"])] = event_row
            if related_row is not None:
                chosen[(related.node, related.line)] = related_row
            key = tuple((name, str(event_row[name])) for name in BY_ID[r["invariant"]].key)
            detail = detail_text(r["detail"]["case"], event_row, related_row, r["detail"]["fact"])
            violations.append(Violation(r["invariant"], key, EventRef(r["e_node"], r["e_seq"], r["e_line"]), related,
                                        detail, evidence_entries(chosen.values())))
        return violations


def check(paths: Path | str | list[Path] | list[str], master: str | None = "local[*]", spark: Any = None,
          **options: Any) -> Report:
    """Check a Parquet trace with Spark (a session is created for ``master`` unless ``spark`` is given)."""
    if spark is None:
        from spark_checks.session import build_session

        spark = build_session(master)
    return SparkChecker(spark, **options).check(paths)


def main(argv: list[str] | None = None) -> int:
    """``python -m spark_checks.spark`` / ``spark-submit spark_checks/spark.py``: ``meshtrace check`` with Spark (the
    same options, report and exit codes), on the master spark-submit set unless ``--master`` names one."""
    from spark_checks.cli import check_main

    return check_main(sys.argv[1:] if argv is None else argv, "spark_checks.spark")


if __name__ == "__main__":
    sys.exit(main())
