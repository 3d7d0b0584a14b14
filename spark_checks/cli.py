"""`meshtrace`: trace tools. `meshtrace validate FILE...` checks JSONL trace files against spec/schemas/trace."""

from __future__ import annotations

import argparse
import json
import sys
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="meshtrace", description="meshspec trace tools")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("validate", help="validate JSONL trace files against spec/schemas/trace")
    check.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    lines, problems = validate_files(args.files)
    for problem in problems:
        print(problem)
    print(f"{lines} events, {'OK' if not problems else 'INVALID'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
