"""`meshtrace`: trace tools.

* ``meshtrace validate PATH...`` validates a trace (JSONL or Parquet) as ``check`` does (spark_checks/validity.py);
* ``meshtrace generate --events N --daemons D ... --out DIR`` writes a generated trace (Parquet) with a manifest;
* ``meshtrace check PATH... [--master URL] [--report FILE]`` runs the invariant catalogue (Spark by default; the
  single-process oracle or DuckDB with ``--engine``) over the valid events;
* ``meshtrace convert`` turns JSONL into the Parquet layout and back, refusing invalid input unless tolerated;
  ``meshtrace catalogue`` prints the catalogue.

Exit codes (check, validate, convert): 0 clean, 1 violations (check), 2 invalid input -- unless ``--tolerate`` covers
it -- or a usage error (a missing path, no trace files, no valid events, unreadable or mistyped Parquet, a filesystem
Hadoop cannot open), 3 a run that failed (an engine error: no verdict).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

#: what --tolerate accepts: the reasons each level lets through (None: every reason)
TOLERATE = {"torn-tail": frozenset({"torn_tail"}), "invalid": None}


def validate_files(paths: list[Path] | list[str], limit: int = 20) -> tuple[int, list[str]]:
    """Validate a trace (JSONL files or directories, or a Parquet dataset) as ``check`` does, with the oracle's
    reading; returns (valid events, problems) with at most ``limit`` problems listed, each ``where: reason: message``.
    Raises ``inputs.InputError`` when there is nothing to validate."""
    from .oracle import validate

    events, invalid, reasons = validate(paths)
    count = sum(reasons.values())
    problems = [f"{e['where']}: {e['reason']}: {e['message']}" for e in invalid[:limit]]
    if count > len(problems):
        problems.append(f"... and {count - len(problems)} more")
    return events, problems


TOLERATE_HELP = ("accept known-dirty input: torn-tail = a last line without its newline that is not JSON (a writer "
                 "killed mid-line); invalid = every invalid event (left out of the check, still reported)")


def tolerated(reasons: dict[str, int], level: str | None) -> bool:
    """Whether ``--tolerate level`` lets every invalid event (counts by reason) through."""
    if not reasons:
        return True
    if level is None:
        return False
    allowed = TOLERATE[level]
    return allowed is None or set(reasons) <= allowed


def _count(text: str) -> int:
    """``100M``, ``10m``, ``20k``, ``1_000`` -> an integer."""
    text = text.strip().replace("_", "").lower()
    scale = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def bounded(low: int, high: int, what: str):
    """An argparse type: an integer in [low, high] (the checks do 64-bit arithmetic with these)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not {what} ({low} to {high})")
        return value

    return parse


#: a duration option in milliseconds: at most 2^31 - 1 (24.8 days)
DURATION_MS = bounded(0, 2**31 - 1, "a duration in milliseconds")


ENGINES = ("spark", "oracle", "duckdb")


#: Spark settings an option of ``meshtrace check`` owns: given with ``--conf`` they would undo what the check
#: derives from the option (a local master's loopback driver, or the driver address a remote master needs)
OPTION_SETTINGS = {"spark.master": "--master", "spark.driver.memory": "--driver-memory",
                   "spark.driver.host": "--driver-host", "spark.driver.bindAddress": "--driver-bind-address"}
#: a JVM heap size, as Spark's memory settings take it: a number of bytes, or of kibi- to pebibytes
MEMORY = re.compile(r"[1-9][0-9]*[kmgtp]?b?", re.IGNORECASE)


def spark_setting(text: str) -> tuple[str, str]:
    """An argparse type: ``KEY=VALUE``, a Spark setting (``spark.hadoop.KEY`` for Hadoop's), not one an option
    owns."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip() or key != key.strip():
        raise argparse.ArgumentTypeError(f"{text!r} is not KEY=VALUE")
    if key in OPTION_SETTINGS:
        raise argparse.ArgumentTypeError(f"{key} is set with {OPTION_SETTINGS[key]}, not --conf")
    return key, value


def memory_size(text: str) -> str:
    """An argparse type: a JVM heap size (``6g``, ``512m``)."""
    if not MEMORY.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a heap size (a number with k, m, g, t or p: 6g, 512m)")
    return text


def add_check_arguments(check: argparse.ArgumentParser, engines: tuple[str, ...]) -> None:
    """The options of ``meshtrace check`` (``engines`` to choose from), also those of ``python -m
    spark_checks.spark``."""
    from .catalogue import (
        DEFAULT_ACK_GRACE_MS,
        DEFAULT_ACK_TIMEOUT_MS,
        DEFAULT_HOOK_GRACE_MS,
        DEFAULT_HOOK_TIMEOUT_MS,
        DEFAULT_REDELIVERY_GRACE_MS,
    )

    check.add_argument("paths", nargs="+", help="trace directories, Parquet datasets or JSONL files (paths or URIs: "
                                                "file://, and with Spark any Hadoop filesystem: s3a://, hdfs://, …)")
    check.add_argument("--engine", choices=engines, default=engines[0])
    check.add_argument("--master", default=None,
                       help="Spark master URL (local[*], spark://host:7077, …; default: the one spark-submit started "
                            "this driver with, else local[*])")
    check.add_argument("--conf", type=spark_setting, action="append", default=[], metavar="KEY=VALUE",
                       help="Spark: a setting for the session, applied last (repeatable); Hadoop's as "
                            "spark.hadoop.KEY, e.g. spark.hadoop.fs.s3a.endpoint=…")
    check.add_argument("--driver-memory", default=None, type=memory_size,
                       help="Spark driver heap (default 6g for a local session, 2g for another master)")
    check.add_argument("--driver-host", default=None,
                       help="Spark, a master on another machine: the address its executors connect back to this "
                            "driver at (spark.driver.host; default 127.0.0.1 for local and spark://127.0.0.1 masters)")
    check.add_argument("--driver-bind-address", default=None,
                       help="Spark: the address this driver listens on (spark.driver.bindAddress; default: the driver "
                            "host)")
    check.add_argument("--report", help="write the JSON report here (a path or URI; Spark writes Hadoop URIs)")
    check.add_argument("--tolerate", choices=tuple(TOLERATE), help=TOLERATE_HELP)
    check.add_argument("--limit", type=bounded(0, 2**31 - 1, "a count"), default=100,
                       help="violations listed per invariant (all are counted, and any makes the exit code 1): "
                            "those whose event comes first")
    check.add_argument("--chunk", type=bounded(1, 2**31 - 1, "a chunk size"), default=None,
                       help="Spark: events per window chunk of a heavy subject")
    check.add_argument("--redelivery-grace-ms", type=DURATION_MS, default=DEFAULT_REDELIVERY_GRACE_MS)
    check.add_argument("--ack-timeout-ms", type=DURATION_MS, default=DEFAULT_ACK_TIMEOUT_MS,
                       help="the traced daemons' ack timeout ([outbox] ack_timeout_s; the trace does not record it)")
    check.add_argument("--ack-grace-ms", type=DURATION_MS, default=DEFAULT_ACK_GRACE_MS,
                       help="how late after its ack timeout an inflight row's resolution may be traced")
    check.add_argument("--hook-timeout-ms", type=DURATION_MS, default=DEFAULT_HOOK_TIMEOUT_MS,
                       help="the traced daemons' longest hook timeout (hooks.toml timeout_s; the trace does not "
                            "record it)")
    check.add_argument("--hook-grace-ms", type=DURATION_MS, default=DEFAULT_HOOK_GRACE_MS,
                       help="how late after its timeout a hook run's mark may be traced")


def check_main(argv: list[str], prog: str) -> int:
    """``python -m spark_checks.spark`` / ``spark-submit spark_checks/spark.py``: ``meshtrace check`` with Spark."""
    parser = argparse.ArgumentParser(prog=prog, description="check the invariant catalogue over a trace with Spark")
    add_check_arguments(parser, ("spark",))
    args = parser.parse_args(argv)
    return _failed_run_exits_3(prog, lambda: _check(args, prog))


def _parser() -> argparse.ArgumentParser:
    from .catalogue import INJECTIONS
    from .format import DEFAULT_BUCKETS

    parser = argparse.ArgumentParser(prog="meshtrace", description="meshspec trace tools")
    sub = parser.add_subparsers(dest="command", required=True)

    validate = sub.add_parser("validate", help="validate a trace (JSONL or Parquet) against spec/schemas/trace")
    validate.add_argument("paths", nargs="+", help="JSONL files, directories of them, or a Parquet dataset")
    validate.add_argument("--tolerate", choices=tuple(TOLERATE), help=TOLERATE_HELP)

    generate = sub.add_parser("generate", help="simulate daemons and brokers on the core; write a Parquet trace")
    generate.add_argument("--events", type=_count, required=True, help="events to write (e.g. 20k, 10M)")
    generate.add_argument("--daemons", type=int, default=16, help="daemons simulated (default 16: two meshes of 8)")
    generate.add_argument("--keys", type=_count, default=None,
                          help="client sends (client_message_ids) to start at most; default: as many as --events "
                               "allows")
    generate.add_argument("--seed", type=int, default=0)
    generate.add_argument("--fault-rate", type=float, default=0.05,
                          help="scales every fault: lost frames and acks, 5xx, rejections, link drops, crashes, "
                               "duplicate and mismatched posts, id collisions (0 = the happy path only)")
    generate.add_argument("--inject", action="append", default=[], metavar="KIND",
                          help=f"inject one violation of KIND (repeatable; 'all' for each kind once): "
                               f"{', '.join(INJECTIONS)}")
    generate.add_argument("--workers", type=int, default=None, help="processes (default: one per core)")
    generate.add_argument("--buckets", type=int, default=DEFAULT_BUCKETS, help="dataset partitions")
    generate.add_argument("--mesh-size", type=int, default=8, help="daemons per mesh (each mesh has a broker)")
    generate.add_argument("--send-interval-ms", type=int, default=1_000, help="mean time between a daemon's sends")
    generate.add_argument("--hot-fraction", type=float, default=0.002,
                          help="share of the events spent on two hot keys (a client re-posting one id)")
    generate.add_argument("--out", type=Path, required=True)

    add_check_arguments(sub.add_parser("check", help="check the invariant catalogue over a trace (Parquet or JSONL)"),
                        ENGINES)

    convert = sub.add_parser("convert", help="JSONL trace files -> Parquet dataset, or a dataset -> JSONL")
    convert.add_argument("paths", nargs="+")
    convert.add_argument("--to", choices=("parquet", "jsonl"), default="parquet")
    convert.add_argument("--tolerate", choices=tuple(TOLERATE), help=TOLERATE_HELP)
    convert.add_argument("--buckets", type=int, default=DEFAULT_BUCKETS)
    convert.add_argument("--out", type=Path, required=True)

    sub.add_parser("catalogue", help="print the invariant catalogue (Markdown)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    return _failed_run_exits_3(f"meshtrace {args.command}", lambda: _command(args))


def say(message: str) -> None:
    """A line on stderr; a stderr that cannot take it (closed, a full disk) does not change the exit code."""
    with contextlib.suppress(OSError, ValueError):
        print(message, file=sys.stderr, flush=True)


def _failed_run_exits_3(prog: str, run: Callable[[], int]) -> int:
    """``run()``'s exit code; a run that failed (an engine error, Spark stopped, a bug) prints its traceback and
    exits 3, never 1, which means violations found."""
    try:
        return run()
    except Exception as exc:  # whatever failed, the run gave no verdict
        say(traceback.format_exc().rstrip())
        say(f"{prog}: the run failed ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
            "this is no verdict about the trace (exit 3)")
        return 3


def _command(args: argparse.Namespace) -> int:
    if args.command == "validate":
        return _validate(args)
    if args.command == "generate":
        return _generate(args)
    if args.command == "check":
        return _check(args)
    if args.command == "convert":
        return _convert(args)
    from .catalogue import catalogue_markdown

    print(catalogue_markdown())
    return 0


def _generate(args: argparse.Namespace) -> int:
    from .catalogue import INJECTIONS
    from .generate import Params, generate

    kinds: list[str] = []
    for item in args.inject:
        for kind in item.split(","):
            kinds += list(INJECTIONS) if kind == "all" else [kind]
    try:
        params = Params(events=args.events, daemons=args.daemons, keys=args.keys, seed=args.seed,
                        fault_rate=args.fault_rate, inject=tuple(kinds), buckets=args.buckets,
                        mesh_size=args.mesh_size, send_interval_ms=args.send_interval_ms,
                        hot_fraction=args.hot_fraction)
        manifest = generate(args.out, params, args.workers)
    except (ValueError, FileExistsError) as exc:
        say(f"meshtrace generate: {exc}")
        return 2
    rate = manifest["events"] / manifest["seconds"] if manifest["seconds"] else 0
    print(f"{manifest['events']} events in {manifest['seconds']:.1f} s ({rate:,.0f}/s) -> {args.out / 'events'}")
    for injection in manifest["injections"]:
        print(f"  injected {injection['kind']:<26} {injection['invariant']:<24} {injection['key']}")
    for injection in manifest["dropped_injections"]:
        say(f"  NOT injected {injection['kind']} (no eligible send, or the trace ended first)")
    return 0


def _check(args: argparse.Namespace, prog: str = "meshtrace check") -> int:
    from .inputs import InputError

    if args.conf and args.engine != "spark":
        say(f"{prog}: --conf sets Spark's settings (and Hadoop's); --engine {args.engine} takes none")
        return 2
    if args.report is not None and (not args.report.strip() or args.report.endswith("/")):
        say(f"{prog}: --report {args.report!r}: give the report's file name (a path or URI)")
        return 2
    clash = _report_clash(args.report, args.paths) if args.report else None
    if clash:
        say(f"{prog}: --report {args.report}: {clash}; write the report elsewhere")
        return 2
    try:
        report, write = _run_check(args)
        report = report.limited(args.limit)  # every engine lists the same ones (Spark fetched no more)
        document = report.as_dict()
        # first: a report file that cannot be written does not hide the result; a closed stdout (`| head`, on which
        # rich raises SystemExit(1)) does not stop the report or change the exit code
        with contextlib.suppress(BrokenPipeError, SystemExit):
            _print_report(document)
        if args.report:
            write(args.report, json.dumps(document, indent=2, default=str) + "\n")
    except InputError as exc:
        say(f"{prog}: {exc}")
        return 2
    return _verdict(prog, report.events, report.invalid_reasons, args.tolerate, ", ".join(args.paths),
                    0 if report.ok else 1)


def _report_clash(report: str, paths: list[str]) -> str | None:
    """Why ``report`` would damage the trace it reports on: a trace file's name (it would overwrite one, or be read
    as one next time), or a place inside a trace directory (the next check would refuse the stray file)."""
    if report.endswith((".jsonl", ".parquet")):
        return "a trace file's name (.jsonl, .parquet)"
    from .inputs import file_uri_path, has_scheme

    def local(text: str) -> str | None:  # the real local path text names (None for another filesystem's URI)
        path = file_uri_path(text) if has_scheme(text) else text
        try:
            return None if path is None else os.path.realpath(path)
        except ValueError:  # a NUL byte: the write says so
            return None

    target = local(report)
    for path in paths:
        directory = local(path)
        if target and directory and os.path.isdir(directory) and target.startswith(directory.rstrip("/") + "/"):
            return f"inside the trace directory {path}"
    return None


#: the longest a session without the --conf settings may take to start, when telling whether they stopped one
PROBE_TIMEOUT_S = 120


def _first_line(exc: BaseException) -> str:
    """The first line of what ``exc`` says; of a JVM exception, the Java exception's (py4j's own first line only
    names the call)."""
    java = getattr(exc, "java_exception", None)
    try:
        text = str(java.toString()) if java is not None else str(exc)
    except Exception:  # the JVM is gone
        text = str(exc)
    return text.strip().splitlines()[0] if text.strip() else ""


def _refused(exc: Exception, master: str | None, args: argparse.Namespace) -> bool:
    """Whether Spark failed to start because of ``--conf``: a value Spark's own check refused, or a session that
    starts with every other option and without those settings -- in a process of its own (this one's session
    builder keeps the settings), on this failure only."""
    import subprocess

    from pyspark.errors import IllegalArgumentException

    if isinstance(exc, IllegalArgumentException):
        return True
    options = {"master": master, "driver_memory": args.driver_memory, "driver_host": args.driver_host,
               "driver_bind_address": args.driver_bind_address}
    probe = ("from spark_checks.session import build_session; "
             f"build_session(**{options!r}).stop()")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        return subprocess.run([sys.executable, "-c", probe], cwd=root, capture_output=True,
                              timeout=PROBE_TIMEOUT_S).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _run_check(args: argparse.Namespace):
    """The engine's report and a function writing a text to a path or URI (Hadoop's filesystems for Spark)."""
    from .inputs import write_local

    if args.engine == "spark":
        from .inputs import InputError, estimated_events, write_hadoop
        from .session import DriverUnreachable, build_session
        from .spark import DEFAULT_CHUNK, SparkChecker

        # Under spark-submit the Python driver talks to the JVM it started (PYSPARK_GATEWAY_PORT): keep its master.
        master = args.master or (None if "PYSPARK_GATEWAY_PORT" in os.environ else "local[*]")
        try:
            spark = build_session(master, driver_memory=args.driver_memory, driver_host=args.driver_host,
                                  driver_bind_address=args.driver_bind_address, conf=dict(args.conf),
                                  expected_events=estimated_events(args.paths))
        except DriverUnreachable as exc:
            raise InputError(str(exc)) from None
        except Exception as exc:  # a setting of --conf refused, or a Spark that does not start at all (exit 3)
            if args.conf and _refused(exc, master, args):
                raise InputError(f"Spark does not start with the --conf settings given "
                                 f"({type(exc).__name__}: {_first_line(exc)}); it starts without them") from None
            raise
        report = SparkChecker(spark, chunk=args.chunk or DEFAULT_CHUNK, redelivery_grace_ms=args.redelivery_grace_ms,
                              limit=args.limit, ack_timeout_ms=args.ack_timeout_ms,
                              ack_grace_ms=args.ack_grace_ms, hook_timeout_ms=args.hook_timeout_ms,
                              hook_grace_ms=args.hook_grace_ms).check(args.paths)
        return report, lambda target, text: write_hadoop(spark, target, text)
    if args.engine == "duckdb":
        from .duck import check as duck_check

        return duck_check(args.paths, redelivery_grace_ms=args.redelivery_grace_ms,
                          ack_timeout_ms=args.ack_timeout_ms, ack_grace_ms=args.ack_grace_ms,
                          hook_timeout_ms=args.hook_timeout_ms, hook_grace_ms=args.hook_grace_ms), write_local
    from .oracle import Oracle

    return Oracle(redelivery_grace_ms=args.redelivery_grace_ms, ack_timeout_ms=args.ack_timeout_ms,
                  ack_grace_ms=args.ack_grace_ms, hook_timeout_ms=args.hook_timeout_ms,
                  hook_grace_ms=args.hook_grace_ms).check(args.paths), write_local


def _verdict(prog: str, events: int, reasons: dict[str, int], tolerate: str | None, where: str, otherwise: int
             ) -> int:
    """Exit 2 for invalid input ``--tolerate`` does not cover or for no valid events, else ``otherwise``."""
    count = sum(reasons.values())
    if not tolerated(reasons, tolerate):
        shown = ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items()))
        say(f"{prog}: {count} invalid event(s) ({shown}); see spark_checks/README.md, "
            "'Input validity' (--tolerate torn-tail | invalid for known-dirty traces)")
        return 2
    if not events:
        say(f"{prog}: no valid trace events in {where}")
        return 2
    return otherwise


def _validate(args: argparse.Namespace) -> int:
    from .inputs import InputError
    from .oracle import validate

    try:
        events, invalid, reasons = validate(args.paths)
    except InputError as exc:
        say(f"meshtrace validate: {exc}")
        return 2
    for entry in invalid:
        print(f"{entry['where']}: {entry['reason']}: {entry['message']}")
    count = sum(reasons.values())
    if count > len(invalid):
        print(f"... and {count - len(invalid)} more")
    print(f"{events} valid events, {count} invalid")
    return _verdict("meshtrace validate", events, reasons, args.tolerate, ", ".join(args.paths), 0)


def _print_report(document: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    rate = document["events_per_second"]
    console.print(f"{document['engine']}: {document['events']:,} events in {document['seconds']:.1f} s"
                  + (f" ({rate:,}/s)" if rate else "") + f"; sources: {', '.join(document['sources']) or 'none'}")
    table = Table("invariant", "protects", "result")
    for inv in document["invariants"]:
        if not inv["applies"]:
            result = "[dim]n/a (needs " + ", ".join(inv["needs"]) + " events)[/dim]"
        elif inv["violations"]:
            result = f"[red]{inv['violations']} violated[/red]"
        else:
            result = "[green]ok[/green]"
        table.add_row(inv["id"], ", ".join(inv["requirements"] or inv["errata"]), result)
    console.print(table)
    for violation in document["violations"]:
        key = ", ".join(f"{name}={value}" for name, value in violation["key"].items())
        at = violation["event"]
        console.print(f"[red]{violation['invariant']}[/red] " + escape(
            f"{key} at {at['node']} line {at['line']} (seq {at['seq']}): {violation['detail']}"), soft_wrap=True)
        for line in evidence_lines(violation):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    if document["invalid"]["count"]:
        console.print(f"[yellow]{document['invalid']['count']} invalid event(s)[/yellow]")


def evidence_lines(violation: dict) -> list[str]:
    """A reported violation's evidence, one event a line in file order: ``>`` marks the violating event and ``*`` the
    related one, then where it sits (node, line, seq; ``file:line`` for JSONL input) and the event, so a seq that
    goes backwards in the file is visible at a glance."""
    entries = violation["evidence"]
    marks = {(violation["event"]["node"], violation["event"]["line"]): ">"}
    if violation["related"] is not None:
        marks.setdefault((violation["related"]["node"], violation["related"]["line"]), "*")
    line_width = max((len(str(e["line"])) for e in entries), default=1)
    seq_width = max((len(str(e["seq"])) for e in entries), default=1)
    lines = []
    for entry in entries:
        where = f"{entry['node']} line {entry['line']:>{line_width}} seq {entry['seq']:>{seq_width}}"
        if entry["file"] is not None:
            where += f" {entry['file']}:{entry['file_line']}"
        mark = marks.get((entry["node"], entry["line"]), " ")
        lines.append(f"  {mark} {where}  {json.dumps(entry['event'], separators=(',', ':'))}")
    return lines


def _convert(args: argparse.Namespace) -> int:
    from . import format as fmt
    from .inputs import InputError, LocalFS, check_local_parquet, locate

    try:
        trace = locate(args.paths, LocalFS("convert"))
        check_local_parquet(trace.parquet_files)
        out = Path(LocalFS("convert").path(str(args.out)))
        if args.to == "parquet":
            if not trace.is_jsonl:
                raise InputError(f"{', '.join(args.paths)}: not JSONL (use --to jsonl for a Parquet dataset)")
            read = fmt.read_jsonl(trace.jsonl)
            events, invalid, reasons = len(read.rows), read.invalid, read.reasons
        else:
            if trace.is_jsonl:
                raise InputError(f"{', '.join(args.paths)}: not a Parquet dataset (use --to parquet for JSONL)")
            table = fmt.read_files(trace.parquet_files)
            valid, listed, reasons = fmt.validate_table(table, shared=fmt.shared_positions(trace.parquet_files))
            events, invalid = valid.num_rows, [entry for _, entry in listed]
    except InputError as exc:
        say(f"meshtrace convert: {exc}")
        return 2
    for entry in invalid[:20]:
        say(f"{entry['where']}: {entry['reason']}: {entry['message']}")
    code = _verdict("meshtrace convert", events, reasons, args.tolerate, ", ".join(args.paths), 0)
    if code:
        say("meshtrace convert: nothing written")
        return code
    if args.to == "parquet":
        fmt.write_dataset(fmt.rows_to_table(read.rows), out, args.buckets)
    else:
        fmt.write_jsonl_table(valid, out)
    skipped = sum(reasons.values())
    print(f"{events} events -> {out}" + (f" ({skipped} invalid left out)" if skipped else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
