"""Trace-check benchmark: generate 10M (and with --full 100M) events, then run the invariant catalogue with Spark,
with DuckDB (the single-machine tool a user would otherwise reach for) and with the Python oracle (10M only), each in
its own process, and print events per second, peak memory (the whole process tree: the Spark JVM included) and the
ratios against Spark.

    .venv/bin/python bench/trace_check.py               # 10M
    .venv/bin/python bench/trace_check.py --full        # 10M and 100M (the 100M run takes a while)

Targets (issue #6, on the 2-core reference machine): the catalogue over 100M events in at most 10 minutes with peak
memory at most 12 GB and at least 0.25 of DuckDB's rate; the generator writes 100M events in at most 10 minutes.
Needs the ``spark`` and ``bench`` extras (pyspark, pyarrow, duckdb, psutil) and Java 17.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_SECONDS = 600
TARGET_MEMORY = 12 * 1024**3
TARGET_RATIO = 0.25


def _count(text: str) -> int:
    text = text.strip().lower()
    return int(float(text[:-1]) * {"k": 1e3, "m": 1e6, "g": 1e9}[text[-1]]) if text[-1] in "kmg" else int(text)


def _label(n: int) -> str:
    return f"{n // 1_000_000}M" if n % 1_000_000 == 0 else f"{n:,}"


class TreeMemory:
    """Samples the summed RSS of a process and all its descendants; ``peak`` is the largest sum seen."""

    def __init__(self, pid: int, interval: float = 0.2):
        import psutil

        self.process = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            total = 0
            try:
                for process in [self.process, *self.process.children(recursive=True)]:
                    with contextlib.suppress(psutil.Error):
                        total += process.memory_info().rss
            except psutil.Error:
                return
            self.peak = max(self.peak, total)
            self._stop.wait(self.interval)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def measured(argv: list[str]) -> dict[str, Any]:
    """Run ``argv`` (a child that prints one JSON line last) while sampling its memory; returns its JSON + peak."""
    started = time.monotonic()
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    with TreeMemory(process.pid) as memory:
        out, _ = process.communicate()
    if process.returncode not in (0, 1):
        raise RuntimeError(f"{argv} exited with {process.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    result.update(peak_rss=memory.peak, wall=time.monotonic() - started)
    return result


# --- the children -----------------------------------------------------------------------------------------------

def child_generate(path: Path, events: int, daemons: int, seed: int) -> None:
    from spark_checks.generate import Params, generate

    manifest = generate(path, Params(events=events, daemons=daemons, seed=seed))
    print(json.dumps({"events": manifest["events"], "seconds": manifest["seconds"]}))


def child_check(engine: str, path: Path, driver_memory: str) -> None:
    if engine == "spark":
        from spark_checks.session import build_session
        from spark_checks.spark import SparkChecker

        started = time.monotonic()
        spark = build_session("local[*]", driver_memory=driver_memory)
        startup = time.monotonic() - started
        report = SparkChecker(spark).check(path)
        extra = {"startup": round(startup, 1), "timings": report.settings["timings"]}
    elif engine == "duckdb":
        from spark_checks.duck import check

        report, extra = check(path), {}
    else:
        from spark_checks.oracle import check

        report, extra = check(path), {}
    print(json.dumps({"engine": engine, "events": report.events, "seconds": report.seconds,
                      "violations": sum(report.counts.values()), **extra}))


# --- the bench --------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="also run 100M events (long)")
    parser.add_argument("--sizes", default=None, help="comma-separated event counts (default 10M, or 10M,100M)")
    parser.add_argument("--engines", default="spark,duckdb,oracle")
    parser.add_argument("--oracle-max", type=_count, default=10_000_000, help="largest size the oracle runs on")
    parser.add_argument("--daemons", type=int, default=128)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--workdir", type=Path, default=None, help="keep traces here (default: a temp directory)")
    parser.add_argument("--reuse", action="store_true", help="reuse a trace already in --workdir")
    parser.add_argument("--driver-memory", default="8g", help="heap of the local Spark driver")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.child:
        if args.child[0] == "generate":
            child_generate(Path(args.child[1]), int(args.child[2]), args.daemons, args.seed)
        else:
            child_check(args.child[0], Path(args.child[1]), args.driver_memory)
        return 0
    sizes = [_count(s) for s in (args.sizes or ("10M,100M" if args.full else "10M")).split(",")]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    scratch = None if args.workdir else tempfile.TemporaryDirectory(prefix="meshtrace-bench-")
    workdir = args.workdir or Path(scratch.name)  # type: ignore[union-attr]
    me = [sys.executable, str(Path(__file__).resolve()), "--daemons", str(args.daemons), "--seed", str(args.seed),
          "--driver-memory", args.driver_memory, "--child"]
    results: list[dict[str, Any]] = []
    try:
        for size in sizes:
            trace = workdir / f"trace-{_label(size)}"
            if not (args.reuse and (trace / "manifest.json").exists()):
                if trace.exists():
                    import shutil

                    shutil.rmtree(trace)
                print(f"generating {_label(size)} events …", flush=True)
                generated = measured([*me, "generate", str(trace), str(size)])
                results.append({"size": size, "engine": "generator", **generated})
                _row(results[-1])
            for engine in engines:
                if engine == "oracle" and size > args.oracle_max:
                    continue
                print(f"checking {_label(size)} events with {engine} …", flush=True)
                results.append({"size": size, **measured([*me, engine, str(trace)])})
                _row(results[-1])
    finally:
        if scratch is not None:
            scratch.cleanup()
    _summary(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _row(result: dict[str, Any]) -> None:
    rate = result["events"] / result["seconds"] if result["seconds"] else 0
    print(f"  {result['engine']:<9} {result['events']:>13,} events  {result['seconds']:8.1f} s  {rate:>12,.0f} ev/s  "
          f"peak {result['peak_rss'] / 1024**3:5.2f} GB" + (f"  (startup {result['startup']} s, {result['timings']})"
                                                            if "startup" in result else ""), flush=True)


def _summary(results: list[dict[str, Any]]) -> None:
    print(f"\nloadavg at the end: {' '.join(Path('/proc/loadavg').read_text().split()[:3])}"
          if Path("/proc/loadavg").exists() else "")
    print("size   engine     events/s      seconds   wall s   peak GB   Spark rate / this rate")
    for size in sorted({r["size"] for r in results}):
        rows = {r["engine"]: r for r in results if r["size"] == size}
        spark = rows.get("spark")
        for engine, r in rows.items():
            rate = r["events"] / r["seconds"]
            ratio = ""
            if spark is not None and engine in ("duckdb", "oracle"):
                ratio = f"{(spark['events'] / spark['seconds']) / rate:.2f}"
            print(f"{_label(size):<6} {engine:<10} {rate:>11,.0f} {r['seconds']:>11.1f} {r['wall']:>8.1f} "
                  f"{r['peak_rss'] / 1024**3:>9.2f}   {ratio}")
        if size >= 100_000_000:
            checks = []
            if spark is not None:
                # the whole child process: JVM start, session, catalogue, evidence
                checks.append(("catalogue in ≤ 10 min (wall)", spark["wall"] <= TARGET_SECONDS))
                checks.append(("peak memory ≤ 12 GB", spark["peak_rss"] <= TARGET_MEMORY))
                if "duckdb" in rows:
                    duck = rows["duckdb"]
                    checks.append(("≥ 0.25 of DuckDB's rate", spark["seconds"] <= duck["seconds"] / TARGET_RATIO))
            if "generator" in rows:
                checks.append(("generator ≤ 10 min (wall)", rows["generator"]["wall"] <= TARGET_SECONDS))
            for name, ok in checks:
                print(f"  target {name}: {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
