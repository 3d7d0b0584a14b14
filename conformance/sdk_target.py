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

The same values are in the environment as ``MESHCONFORM_SCENARIO`` and ``MESHCONFORM_RESULTS``. The driver is the
SDK author's adapter: a few lines that call the SDK (reference/client/driver.py is the Python one, the reference
subject, launched by ``--launch reference``).
"""

from __future__ import annotations

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
    """Run the driver on ``scenario`` and return its result lines (fewer than the steps when it stopped early:
    a step with no line has no result, which a case judges as the SDK's failure). A line that is not a JSON object
    of spec/schemas/harness/sdk_result.json ends the list there, with a ``driver_error`` line saying why."""
    validator("harness/sdk_scenario").validate(scenario)
    workdir.mkdir(parents=True, exist_ok=True)
    scenario_file, results_file = workdir / "scenario.json", workdir / "results.jsonl"
    scenario_file.write_text(json.dumps(scenario, indent=2), encoding="utf-8")
    results_file.unlink(missing_ok=True)
    values = {"scenario": shlex.quote(str(scenario_file)), "results": shlex.quote(str(results_file))}
    env = {**os.environ, "MESHCONFORM_SCENARIO": str(scenario_file), "MESHCONFORM_RESULTS": str(results_file)}
    log = (workdir / "driver.log").open("wb")
    try:
        process = subprocess.Popen(template.format(**values), shell=True, stdout=log, stderr=subprocess.STDOUT,
                                   env=env, start_new_session=True, cwd=workdir)
    except OSError as exc:
        raise SdkLaunchError(f"cannot start the driver: {exc}") from exc
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # its whole group: a driver may have started its own children
        process.wait()
    finally:
        log.close()
    return read_results(results_file)


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
