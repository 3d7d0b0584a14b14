"""`meshconform`: certify an implementation of the claudemesh daemon protocol v0.9.0 against meshspec.

    meshconform run [--target reference | unix:///path/daemon.sock | http://127.0.0.1:PORT] [--token-file F]
                    [--launch TEMPLATE] [--dialect auto|meshspec|claudemesh] [--timing KEY=VALUE,...]
                    [--strict] [--spec-only] [--select ID ...] [--deselect ID ...] [--seed N]
                    [--case-timeout S] [--deadline S] [--report-dir DIR]
    meshconform broker [--url ws://… | --launch TEMPLATE] [--lease-s S] [...]
    meshconform sdk [--launch 'DRIVER {scenario} {results}'] [...]
    meshconform list [--json] [--write]

Exit codes: 0 every MUST passed (and every SHOULD with --strict), 1 a failure, 2 a fault of the harness itself.
The report keeps the spec's own requirements and meshspec's profile (errata, OpenAPI shape) apart; --spec-only
makes the exit code count the spec's requirements only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from . import plugin, registry

console = Console(stderr=True, soft_wrap=True)  # a long line is never broken inside a word


class _Progress:
    """Live progress with rich; replaces pytest's terminal output."""

    def __init__(self, quiet: bool):
        self.quiet = quiet
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console, disable=quiet, transient=True)
        self.task = None
        self.failed: list[str] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.progress.start()
        self.task = self.progress.add_task("meshconform", total=len(session.items))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            name = report.nodeid.split("::")[-1]
            self.progress.update(self.task, advance=1, description=escape(name[:60]))
            if report.failed:
                self.failed.append(report.nodeid)
                self.progress.console.print(f"[red]FAIL[/red] {escape(name)}")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.progress.stop()


def _pytest_args(args: argparse.Namespace) -> list[str]:
    broker, sdk = args.command == "broker", args.command == "sdk"
    suite = registry.BROKER_CASES_DIR if broker else registry.SDK_CASES_DIR if sdk else registry.CASES_DIR
    argv = [str(suite), "-p", "conformance.plugin",
            "-p", "no:cacheprovider", "-p", "no:terminal", "-o", "addopts=", "-o", "testpaths=",
            "-p", "no:timeout", "--rootdir", str(registry.CASES_DIR.parent), f"--meshspec-deadline={args.deadline}"]
    if args.case_timeout is not None:
        argv.append(f"--meshspec-case-timeout={args.case_timeout}")
    if sdk:
        argv.append(f"--meshspec-sdk-launch={args.launch or 'reference'}")
    elif broker:
        if args.url:
            argv.append(f"--meshspec-broker-url={args.url}")
        else:
            argv.append(f"--meshspec-broker-launch={args.launch or 'reference'}")
        if args.store_dsn:
            argv.append(f"--meshspec-store-dsn={args.store_dsn}")
        if args.lease_s is not None:
            argv.append(f"--meshspec-lease-s={args.lease_s}")
        argv.append(f"--meshspec-mesh-id={args.mesh_id}")
    else:
        argv.append(f"--meshspec-target={args.target}")
        argv.append(f"--meshspec-dialect={args.dialect}")
        for value in args.timing or ():
            argv.append(f"--meshspec-timing={value}")
    if args.launch and not broker and not sdk:
        argv.append(f"--meshspec-launch={args.launch}")
    if getattr(args, "token_file", None):
        argv.append(f"--meshspec-token-file={args.token_file}")
    if getattr(args, "broker_listen", None):
        argv.append(f"--meshspec-broker-listen={args.broker_listen}")
    if args.strict:
        argv.append("--meshspec-strict")
    if args.spec_only:
        argv.append("--meshspec-spec-only")
    for value in args.select or ():
        argv.append(f"--meshspec-select={value}")
    for value in args.deselect or ():
        argv.append(f"--meshspec-deselect={value}")
    if args.seed is not None:
        argv += [f"--meshspec-seed={args.seed}", f"--hypothesis-seed={args.seed}"]
    if args.report_dir:
        argv.append(f"--meshspec-report-dir={args.report_dir}")
    return argv


def run(args: argparse.Namespace) -> int:
    reporter = _Progress(args.quiet)
    capture = _Capture()
    exit_code = pytest.main(_pytest_args(args), plugins=[reporter, capture])
    report = capture.report
    if report is None:
        console.print(f"[red]meshconform: the harness did not complete (pytest exit {exit_code})[/red]")
        return 2
    summarize(report)
    if getattr(args, "record_reference", False):
        reference = (args.command == "broker" and not args.url and not args.launch) or (
            args.command == "run" and args.target == "reference" and not args.launch) or (
            args.command == "sdk" and not args.launch)
        if not reference or args.select or args.deselect:
            console.print("[red]--record-reference needs a full run against the reference[/red]")
            return 2
        record_reference(report)
    return int(report["summary"]["exit_code"])


def record_reference(report: dict) -> Path:
    """Write conformance/reference-results.json (the verdicts CONFORMANCE.md shows) from a full reference run."""
    path = registry.CASES_DIR.parent / "reference-results.json"
    verdicts = {}
    if path.exists():  # the daemon and the broker suites each record the requirements they check
        verdicts = {r["id"]: r["verdict"] for r in json.loads(path.read_text())["requirements"]}
    for row in report["requirements"]:
        if row["verdict"] != "not_checked" or row["id"] not in verdicts:
            verdicts[row["id"]] = row["verdict"]
    rows = [{"id": r["id"], "verdict": verdicts[r["id"]]} for r in report["requirements"]]
    summary = {k: sum(1 for r in rows if r["verdict"] == k) for k in ("pass", "fail", "skip", "not_checked")}
    document = {"spec_version": report["spec_version"], "summary": summary, "requirements": rows}
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    console.print(f"recorded {path}; run `meshd spec conformance-doc` to refresh CONFORMANCE.md")
    return path


class _Capture:
    report: dict | None = None

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        self.report = session.config.stash.get(plugin.REPORT, None)


def summarize(report: dict) -> None:
    """Print both parts of the verdict (spec, profile), every failure with what it violates, and the totals."""
    s = report["summary"]
    colors = {"pass": "green", "fail": "red", "error": "magenta", "skip": "yellow", "not_checked": "dim",
              "not_judged": "dim"}
    for kind, title in (("spec", "spec conformance (the spec's own MUST/SHOULD)"),
                        ("profile", "meshspec profile (errata decisions, OpenAPI shape)")):
        table = Table(title=escape(f"{title} — {report.get('target_name') or report['target']}"))
        for column in ("requirement", "level", "verdict", "reason"):
            table.add_column(column)
        for r in report["requirements"]:
            if r["kind"] != kind or r["verdict"] == "not_checked":
                continue
            table.add_row(r["id"], r["level"], f"[{colors[r['verdict']]}]{r['verdict']}[/]", escape(r["reason"][:90]))
        console.print(table)
    traces = report.get("traces")
    judged = [r for r in (traces or {}).get("invariants", []) if r["verdict"] != "not_judged"]
    if judged:
        table = Table(title=escape(f"trace checks (TRC, the target's trace) — {traces['reason']}"))
        for column in ("invariant", "part", "verdict", "reason"):
            table.add_column(column)
        for r in judged:
            table.add_row(r["id"], f"{r['kind']} {r['level']}", f"[{colors[r['verdict']]}]{r['verdict']}[/]",
                          escape(r["reason"][:90]))
        console.print(table)
    elif traces is not None:
        console.print(f"trace checks: {escape(traces['reason'])}")
    for r in report["requirements"]:
        if r["verdict"] in ("fail", "error"):
            console.print(f"[red]{r['verdict'].upper()}[/red] {r['id']} ({r['level']}, {r['kind']}): "
                          f"{escape(r['reason'][:300])}\n  violates: {escape(r['cite'][:300])}")
    for r in judged:
        if r["verdict"] == "fail":
            console.print(f"[red]FAIL[/red] {r['id']} ({r['level']}, {r['kind']}, trace): {escape(r['reason'][:300])}"
                          f"\n  violates: {escape(r['cite'][:300])}")
    for error in report["harness_errors"]:
        console.print(f"[magenta]harness error:[/magenta] {escape(error)}")
    verdict_color = {"pass": "green", "fail": "red", "error": "magenta"}[s["verdict"]]
    console.print(f"[bold {verdict_color}]{s['verdict'].upper()}[/] — spec {s['spec']['verdict']} "
                  f"{s['spec']['requirements']} — profile {s['profile']['verdict']} {s['profile']['requirements']} — "
                  + (f"traces {traces['verdict']} — " if traces is not None else "")
                  + f"cases {s['cases']} — {report['duration_s']} s")


def list_cases(args: argparse.Namespace) -> int:
    if args.write:
        console.print(f"wrote {registry.write_case_ids()} ({len(registry.case_ids())} cases)")
        return 0
    cases = registry.cases()
    if args.json:
        print(json.dumps([{"id": c.id, "requirements": list(c.requirements)} for c in cases], indent=2))
        return 0
    for info in cases:
        print(f"{info.id:<40} {' '.join(info.requirements)}")
    return 0


#: the options the broker and SDK suites share with `run` (whose own help texts are longer)
SUITE_OPTIONS = (("--strict", {"action": "store_true"}), ("--spec-only", {"action": "store_true"}),
                 ("--select", {"action": "append"}), ("--deselect", {"action": "append"}),
                 ("--seed", {"type": int}), ("--case-timeout", {"type": float, "default": 120.0}),
                 ("--deadline", {"type": float, "default": 1800.0}), ("--report-dir", {"type": Path}),
                 ("--quiet", {"action": "store_true"}))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="meshconform", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    runner = sub.add_parser("run", help="run the conformance suite against a daemon")
    runner.add_argument("--target", default="reference",
                        help="reference (default) | unix:///path/daemon.sock | http://127.0.0.1:PORT")
    runner.add_argument("--launch", help="launch template with {broker_url} {state_dir} {socket} {port} {token_file} "
                        "{target_file} {clock_file} {config} {trace_dir} {hooks_dir} (conformance/launch.py; "
                        "{hooks_dir}: the hooks.toml and hook scripts the hook cases install, which run only "
                        "against a daemon listing hooks in /v1/version)")
    runner.add_argument("--token-file", type=Path, help="bearer token file for an http:// target")
    runner.add_argument("--broker-listen", help="address of the scripted broker (default 127.0.0.1:<free>)")
    runner.add_argument("--strict", action="store_true", help="SHOULD failures fail the run")
    runner.add_argument("--select", action="append", help="case or requirement ids (prefix match), repeatable")
    runner.add_argument("--deselect", action="append", help="case or requirement ids to leave out")
    runner.add_argument("--seed", type=int, help="seed for randomised cases (printed in every replay command)")
    runner.add_argument("--dialect", choices=("auto", "meshspec", "claudemesh"), default="auto",
                        help="the broker dialect the scripted peer speaks (auto: read from the hello)")
    runner.add_argument("--timing", action="append",
                        help="the target's timing, key=value,... (retry_base_ms, retry_max_ms, retry_multiplier, "
                             "retry_jitter, poll_ms, ack_timeout_s, reconnect_initial_ms, reconnect_max_ms, ...)")
    runner.add_argument("--spec-only", action="store_true",
                        help="the exit code counts the spec's own requirements only, not meshspec's profile")
    runner.add_argument("--case-timeout", type=float, help="per test node timeout in seconds (default: the longer of "
                        "90 and what the slowest case may wait on the target's declared timing)")
    runner.add_argument("--deadline", type=float, default=1800.0, help="the whole run's deadline in seconds")
    runner.add_argument("--report-dir", type=Path, help="write report.json, junit.xml, report.md, report.html, and "
                        "keep the target's trace in DIR/trace")
    runner.add_argument("--quiet", action="store_true", help="no progress bar")
    runner.add_argument("--record-reference", action="store_true",
                        help="with --target reference: record the verdicts CONFORMANCE.md shows")
    runner.set_defaults(func=run)
    brokers = sub.add_parser("broker", help="run the broker suite against a broker (the harness plays the daemons)")
    brokers.add_argument("--url", help="ws://127.0.0.1:PORT of a running broker (dev mode admits the harness)")
    brokers.add_argument("--launch", help="launch template with {port}, {state_dir} and {trace_dir}; default: the "
                         "reference broker on SQLite, traced")
    brokers.add_argument("--store-dsn", help="the broker's store (sqlite:///… or postgresql://…) for the inventory")
    brokers.add_argument("--mesh-id", default="meshconform")
    brokers.add_argument("--lease-s", type=float,
                         help="the broker's delivery lease (default: what it advertises, else 30 s)")
    for name, kwargs in SUITE_OPTIONS:
        brokers.add_argument(name, **kwargs)
    brokers.add_argument("--record-reference", action="store_true",
                         help="with the reference broker: record the verdicts CONFORMANCE.md shows")
    brokers.set_defaults(func=run)
    sdks = sub.add_parser("sdk", help="run the SDK suite against a client SDK (the harness plays the daemon)")
    sdks.add_argument("--launch", help="the SDK's driver: a template with {scenario} and {results} "
                      "(conformance/sdk_target.py); default: the Python SDK, reference/client")
    for name, kwargs in SUITE_OPTIONS:
        sdks.add_argument(name, **kwargs)
    sdks.add_argument("--record-reference", action="store_true",
                      help="with the Python SDK: record the verdicts CONFORMANCE.md shows")
    sdks.set_defaults(func=run)
    lister = sub.add_parser("list", help="list the cases and the requirements they check")
    lister.add_argument("--json", action="store_true")
    lister.add_argument("--write", action="store_true",
                        help="write conformance/case_ids.json, the case ids `meshd spec check` reads")
    lister.set_defaults(func=list_cases)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
