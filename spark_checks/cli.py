"""`meshtrace`: trace tools.

* ``meshtrace validate FILE...`` checks JSONL trace files against spec/schemas/trace;
* ``meshtrace generate --events N --daemons D ... --out DIR`` writes a generated trace (Parquet) with a manifest;
* ``meshtrace check PATH... [--master URL] [--report FILE]`` runs the invariant catalogue (Spark by default; the
  single-process oracle or DuckDB with ``--engine``) and exits 1 when anything is violated;
* ``meshtrace convert`` turns JSONL into the Parquet layout and back; ``meshtrace catalogue`` prints the catalogue.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from spec import validator


def validate_files(paths: list[Path], limit: int = 20) -> tuple[int, list[str]]:
    """Validate every line of every file; returns (lines read, problems) with at most ``limit`` problems listed."""
    check = validator("trace/event")
    lines = 0
    problems: list[str] = []
    last_seq: dict[tuple[str, str], int] = {}
    for path in paths:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                lines += 1
                where = f"{path}:{number}"
                try:
                    event = json.loads(line)
                except json.JSONDecodeError as exc:
                    problems.append(f"{where}: not JSON: {exc.msg}")
                    continue
                errors = sorted(check.iter_errors(event), key=lambda e: e.path)
                if errors:
                    problems.append(f"{where}: {errors[0].message}")
                    continue
                key = (event["source"], event["node"])
                if key in last_seq and event["seq"] <= last_seq[key]:
                    problems.append(f"{where}: seq {event['seq']} does not increase after {last_seq[key]} for {key}")
                last_seq[key] = event["seq"]
    return lines, problems[:limit] + ([f"... and {len(problems) - limit} more"] if len(problems) > limit else [])


def _count(text: str) -> int:
    """``100M``, ``10m``, ``20k``, ``1_000`` -> an integer."""
    text = text.strip().replace("_", "").lower()
    scale = {"k": 1_000, "m": 1_000_000, "g": 1_000_000_000}.get(text[-1:], 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def _parser() -> argparse.ArgumentParser:
    from .catalogue import DEFAULT_REDELIVERY_GRACE_MS, INJECTIONS
    from .format import DEFAULT_BUCKETS

    parser = argparse.ArgumentParser(prog="meshtrace", description="meshspec trace tools")
    sub = parser.add_subparsers(dest="command", required=True)

    validate = sub.add_parser("validate", help="validate JSONL trace files against spec/schemas/trace")
    validate.add_argument("files", nargs="+", type=Path)

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

    check = sub.add_parser("check", help="check the invariant catalogue over a trace (Parquet or JSONL)")
    check.add_argument("paths", nargs="+", type=Path, help="trace directories, Parquet datasets or JSONL files")
    check.add_argument("--engine", choices=("spark", "oracle", "duckdb"), default="spark")
    check.add_argument("--master", default="local[*]", help="Spark master URL (local[*], spark://host:7077, …)")
    check.add_argument("--driver-memory", default=None, help="driver heap of a local Spark session (default 6g)")
    check.add_argument("--driver-host", default=None,
                       help="Spark, a master on another machine: the address its executors connect back to this "
                            "driver at (spark.driver.host; default 127.0.0.1 for local and spark://127.0.0.1 masters)")
    check.add_argument("--driver-bind-address", default=None,
                       help="Spark: the address this driver listens on (spark.driver.bindAddress; default: the driver "
                            "host)")
    check.add_argument("--report", type=Path, help="write the JSON report here")
    check.add_argument("--limit", type=int, default=100, help="violations listed per invariant")
    check.add_argument("--chunk", type=int, default=None, help="Spark: events per window chunk of a heavy subject")
    check.add_argument("--redelivery-grace-ms", type=int, default=DEFAULT_REDELIVERY_GRACE_MS)

    convert = sub.add_parser("convert", help="JSONL trace files -> Parquet dataset, or a dataset -> JSONL")
    convert.add_argument("paths", nargs="+", type=Path)
    convert.add_argument("--to", choices=("parquet", "jsonl"), default="parquet")
    convert.add_argument("--buckets", type=int, default=DEFAULT_BUCKETS)
    convert.add_argument("--out", type=Path, required=True)

    sub.add_parser("catalogue", help="print the invariant catalogue (Markdown)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "validate":
        lines, problems = validate_files(args.files)
        for problem in problems:
            print(problem)
        print(f"{lines} events, {'OK' if not problems else 'INVALID'}")
        return 1 if problems else 0
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
        print(f"meshtrace generate: {exc}", file=sys.stderr)
        return 2
    rate = manifest["events"] / manifest["seconds"] if manifest["seconds"] else 0
    print(f"{manifest['events']} events in {manifest['seconds']:.1f} s ({rate:,.0f}/s) -> {args.out / 'events'}")
    for injection in manifest["injections"]:
        print(f"  injected {injection['kind']:<26} {injection['invariant']:<24} {injection['key']}")
    for injection in manifest["dropped_injections"]:
        print(f"  NOT injected {injection['kind']} (no eligible send, or the trace ended first)", file=sys.stderr)
    return 0


def _check(args: argparse.Namespace) -> int:
    from . import format as fmt

    paths: list[Path] = args.paths
    if _missing("check", paths):
        return 2
    with tempfile.TemporaryDirectory(prefix="meshtrace-") as scratch:
        skipped: list[str] = []
        if args.engine != "oracle" and fmt.is_jsonl(paths):
            root = Path(scratch) / "events"
            _, skipped = fmt.convert_jsonl(paths, root)
            paths = [root]
        if args.engine == "spark":
            from .session import DriverUnreachable, build_session
            from .spark import DEFAULT_CHUNK, SparkChecker

            try:
                spark = build_session(args.master, driver_memory=args.driver_memory, driver_host=args.driver_host,
                                      driver_bind_address=args.driver_bind_address)
            except DriverUnreachable as exc:
                print(f"meshtrace check: {exc}", file=sys.stderr)
                return 2
            report = SparkChecker(spark, chunk=args.chunk or DEFAULT_CHUNK,
                                  redelivery_grace_ms=args.redelivery_grace_ms, limit=args.limit).check(paths)
        elif args.engine == "duckdb":
            from .duck import check as duck_check

            report = duck_check(paths, redelivery_grace_ms=args.redelivery_grace_ms)
        else:
            from .oracle import Oracle

            report = Oracle(redelivery_grace_ms=args.redelivery_grace_ms).check(paths)
        if skipped and not report.invalid:
            report.invalid = [{"where": item.rsplit(": ", 1)[0], "reason": "not_json",
                               "message": item.rsplit(": ", 1)[1]} for item in skipped]
            report.invalid_count = len(skipped)
    document = report.as_dict()
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(document, indent=2, default=str) + "\n")
    _print_report(document)
    if not report.events:  # nothing checked is not a pass
        print(f"meshtrace check: no trace events found in {', '.join(map(str, args.paths))}", file=sys.stderr)
        return 2
    return 1 if report.violations else 0


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


def _missing(command: str, paths: list[Path]) -> bool:
    """Say so and return True when a path does not exist."""
    missing = [str(path) for path in paths if not path.exists()]
    if missing:
        print(f"meshtrace {command}: no such file or directory: {', '.join(missing)}", file=sys.stderr)
    return bool(missing)


def _convert(args: argparse.Namespace) -> int:
    from . import format as fmt

    if _missing("convert", args.paths):
        return 2
    if args.to == "parquet":
        events, skipped = fmt.convert_jsonl(args.paths, args.out, args.buckets)
        print(f"{events} events -> {args.out}" + (f" ({len(skipped)} unparsable lines skipped)" if skipped else ""))
    else:
        events = sum(fmt.write_jsonl(path, args.out) for path in args.paths)
        print(f"{events} events -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
