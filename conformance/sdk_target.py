"""The SDK launch contract of `meshconform sdk`: how the harness runs a client SDK under test on a scenario.

An SDK is described by a command template (``--launch``) whose placeholders the harness fills in:

* ``{scenario}`` -- a JSON file (spec/schemas/harness/sdk_scenario.json): ``state_dir``, the directory the SDK
  discovers the daemon in (``daemon.sock``, ``http.port``, ``local_token``, as a daemon's state directory holds
  them); ``mesh``, the mesh it asks for; and ``steps``, run in order: ``discover``, ``version``,
  ``send`` (``to``, ``message``, optional ``client_message_id``, ``deadline_s``), ``inbox`` (every page of
  ``limit`` items, to the end) and ``events`` (up to ``count`` events, stopping after ``idle_s`` without one);
* ``{results}`` -- the file the driver writes, one JSON line per step as it ends
  (spec/schemas/harness/sdk_result.json): ``ok`` with the ``value`` the SDK returned, or ``error`` with its
  ``kind`` (conflict, refused, unavailable, not_found), ``status``, ``code``, ``conflict`` and
  ``client_message_id``, as the SDK's own error types carry them.

The same values are in the environment as ``MESHCONFORM_SCENARIO`` and ``MESHCONFORM_RESULTS``. The driver runs in
the directory ``meshconform`` was started in (relative paths in the template work as typed), in a process group of
its own, killed with everything it started when it ends or outruns the case's time. The driver is the SDK author's
adapter: a few lines that call the SDK (reference/client/driver.py is the Python one, the reference subject,
launched by ``--launch reference``). A step the driver wrote no result for, or wrote for another step, fails as the
SDK's, with the driver's log.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from spec import validator

REFERENCE_SDK = f"{shlex.quote(sys.executable)} -m reference.client.driver {{scenario}} {{results}}"
PLACEHOLDERS = ("scenario", "results")


class SdkLaunchError(RuntimeError):
    """The template is unusable or the driver could not be started."""


def check_template(template: str) -> None:
    try:
        template.format(**{name: "" for name in PLACEHOLDERS})
    except (KeyError, IndexError, ValueError) as exc:
        raise SdkLaunchError(f"SDK launch template {template!r}: {exc!r}; placeholders: "
                             f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}") from exc


def run_driver(template: str, scenario: dict[str, Any], workdir: Path, timeout: float) -> list[dict[str, Any]]:
    """Run the driver on ``scenario`` and return one result per step: the line it wrote for that step, or a failed
    one (``ok`` false, ``error.kind`` ``missing``) saying why there is none -- the driver stopped, outran ``timeout``,
    wrote a line that is not spec/schemas/harness/sdk_result.json, or wrote the lines of other steps -- with the end
    of the driver's log. A case judges such a step as the SDK's failure."""
    validator("harness/sdk_scenario").validate(scenario)
    workdir.mkdir(parents=True, exist_ok=True)
    scenario_file, results_file = workdir / "scenario.json", workdir / "results.jsonl"
    scenario_file.write_text(json.dumps(scenario, indent=2), encoding="utf-8")
    results_file.unlink(missing_ok=True)
    values = {"scenario": shlex.quote(str(scenario_file)), "results": shlex.quote(str(results_file))}
    env = {**os.environ, "MESHCONFORM_SCENARIO": str(scenario_file), "MESHCONFORM_RESULTS": str(results_file)}
    log_path = workdir / "driver.log"
    log = log_path.open("wb")
    try:
        process = subprocess.Popen(template.format(**values), shell=True, stdout=log, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True)
    except OSError as exc:
        raise SdkLaunchError(f"cannot start the driver: {exc}") from exc
    outran = False
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        outran = True
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)  # its whole group: what a driver started goes with it
        process.wait()
        log.close()
    why = (f"the driver outran {timeout:g} s and was killed" if outran else
           f"the driver exited {process.returncode}")
    return aligned(scenario["steps"], read_results(results_file), why, _tail(log_path))


def aligned(steps: list[dict[str, Any]], lines: list[dict[str, Any]], why: str, log: str) -> list[dict[str, Any]]:
    """One result per step: line ``n`` if it is step ``n``'s (its ``step`` and ``op``), else a failed one."""
    results = []
    for n, step in enumerate(steps):
        line = lines[n] if n < len(lines) else None
        if line is not None and line.get("step") == n and line.get("op") == step["op"]:
            results.append(line)
            continue
        if line is None:
            reason = f"no result for step {n} ({step['op']}): {why}"
        elif "driver_error" in line:
            reason = line["driver_error"]
        else:
            reason = f"line {n + 1} is step {line.get('step')!r} ({line.get('op')!r}), not step {n} ({step['op']})"
        results.append({"step": n, "op": step["op"], "ok": False,
                        "error": {"kind": "missing", "message": f"{reason}; driver.log ends: {log}"}})
    return results


def _tail(path: Path, size: int = 600) -> str:
    try:
        data = path.read_bytes()[-size:]
    except OSError:
        return "(none)"
    return data.decode("utf-8", "replace").strip() or "(empty)"


def read_results(path: Path) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    check = validator("harness/sdk_result")
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return lines
    for number, line in enumerate(text.splitlines(), 1):
        try:
            document = json.loads(line)
            errors = sorted(check.iter_errors(document), key=lambda e: list(e.absolute_path))
        except ValueError as exc:
            errors, document = [exc], None
        if errors:
            lines.append({"ok": False, "driver_error": f"{path.name}:{number}: {errors[0]}"})
            break
        lines.append(document)
    return lines
