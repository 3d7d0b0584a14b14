"""Turning case outcomes into requirement verdicts, and writing them as JSON, JUnit XML, Markdown and HTML.

A requirement's verdict comes from the cases that check it and ran: ``fail`` when any failed, else ``pass`` when any
passed, else ``skip`` (with the reason), else ``not_checked`` (no case of this run checks it; it may still be checked
by the repository's own tests, which CONFORMANCE.md lists). The run fails (exit 1) when a MUST fails, or a SHOULD
with --strict; a harness error (an unreachable or unstartable target) is exit 2.
"""

from __future__ import annotations

import html
import json
import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import spec as spec_pkg

from . import registry


def _replay(state: Any, case_id: str) -> str:
    target = state.target_spec
    if target.startswith("broker "):
        spec = target.removeprefix("broker ")
        where = "" if spec == "reference" else (f"--url {spec}" if spec.startswith("ws://") else f"--launch '{spec}'")
        parts = ["meshconform broker", where]
    else:
        parts = ["meshconform run", f"--target {target}" if target != "launch" else "--launch '<your template>'"]
    return " ".join(p for p in [*parts, f"--select {case_id}", f"--seed {state.seed}"] if p)


def build_report(state: Any) -> dict[str, Any]:
    """The report document (valid against spec/schemas/report/conformance_report.json)."""
    requirements = spec_pkg.load_yaml(spec_pkg.SPEC_DIR / "requirements.yaml")["requirements"]
    ran = state.results
    cases_for = registry.by_requirement()
    req_rows = []
    must_failures = should_failures = 0
    for req in requirements:
        cases = [c for c in cases_for.get(req["id"], []) if c in ran]
        outcomes = [ran[c].outcome for c in cases]
        reason = ""
        if any(o in ("failed", "error") for o in outcomes):
            verdict = "fail"
            reason = "; ".join(c for c in cases if ran[c].outcome in ("failed", "error"))
        elif "passed" in outcomes:
            verdict = "pass"
        elif outcomes:
            verdict = "skip"
            reason = ran[cases[0]].detail
        else:
            verdict = "not_checked"
        if req["id"] == "API-CONFORMS" and state.deviations:
            verdict, reason = "fail", f"{len(state.deviations)} response(s) deviate from spec/openapi.yaml"
        if verdict == "fail":
            must_failures += req["level"] == "MUST"
            should_failures += req["level"] == "SHOULD"
        req_rows.append({"id": req["id"], "level": req["level"], "section": req["section"],
                         "text": " ".join(req["text"].split()), "verdict": verdict, "cases": cases,
                         "reason": reason})
    case_rows = [{"id": r.id, "requirements": list(r.requirements), "outcome": r.outcome,
                  "duration_s": round(r.duration_s, 3), "detail": r.detail, "replay": _replay(state, r.id)}
                 for r in ran.values()]
    if state.harness_errors:
        exit_code, verdict = 2, "error"
    elif must_failures or (state.strict and should_failures):
        exit_code, verdict = 1, "fail"
    else:
        exit_code, verdict = 0, "pass"
    count = lambda values, keys: {k: sum(1 for v in values if v == k) for k in keys}  # noqa: E731
    return {
        "tool": "meshconform", "version": spec_pkg.SPEC_VERSION, "spec_version": spec_pkg.SPEC_VERSION,
        "target": state.target_spec, "strict": state.strict, "seed": state.seed,
        "started_at": datetime.fromtimestamp(state.started, UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "duration_s": round(time.time() - state.started, 3),
        "summary": {
            "verdict": verdict, "exit_code": exit_code,
            "cases": count([c["outcome"] for c in case_rows], ("passed", "failed", "skipped", "error")),
            "requirements": count([r["verdict"] for r in req_rows], ("pass", "fail", "skip", "not_checked")),
            "must_failures": must_failures, "should_failures": should_failures,
        },
        "requirements": req_rows,
        "cases": case_rows,
        "deviations": [{"method": d.method, "path": d.path, "status": d.status, "error": d.error}
                       for d in state.deviations],
        "harness_errors": list(state.harness_errors),
    }


def write_reports(report: dict[str, Any], directory: Path) -> dict[str, Path]:
    """Write report.json, junit.xml, report.md and report.html; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    spec_pkg.validator("report/conformance_report").validate(report)
    paths = {"json": directory / "report.json", "junit": directory / "junit.xml", "markdown": directory / "report.md",
             "html": directory / "report.html"}
    paths["json"].write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    paths["junit"].write_bytes(junit_xml(report))
    paths["markdown"].write_text(markdown(report), encoding="utf-8")
    paths["html"].write_text(html_report(report), encoding="utf-8")
    return paths


def junit_xml(report: dict[str, Any]) -> bytes:
    """JUnit XML: one testsuite per case suite (the id's first segment), one testcase per case."""
    root = ET.Element("testsuites", name="meshconform", time=str(report["duration_s"]))
    suites: dict[str, list[dict[str, Any]]] = {}
    for case in report["cases"]:
        suites.setdefault(case["id"].split(".", 1)[0], []).append(case)
    for name, cases in sorted(suites.items()):
        suite = ET.SubElement(root, "testsuite", name=f"meshconform.{name}", tests=str(len(cases)),
                              failures=str(sum(c["outcome"] == "failed" for c in cases)),
                              errors=str(sum(c["outcome"] == "error" for c in cases)),
                              skipped=str(sum(c["outcome"] == "skipped" for c in cases)),
                              time=str(round(sum(c["duration_s"] for c in cases), 3)))
        for case in cases:
            element = ET.SubElement(suite, "testcase", classname=f"meshconform.{name}", name=case["id"],
                                    time=str(case["duration_s"]))
            properties = ET.SubElement(element, "properties")
            for requirement in case["requirements"]:
                ET.SubElement(properties, "property", name="requirement", value=requirement)
            ET.SubElement(properties, "property", name="replay", value=case["replay"])
            if case["outcome"] in ("failed", "error"):
                tag = "failure" if case["outcome"] == "failed" else "error"
                node = ET.SubElement(element, tag, message=case["detail"].strip().splitlines()[-1][:200]
                                     if case["detail"].strip() else case["outcome"])
                node.text = case["detail"]
            elif case["outcome"] == "skipped":
                ET.SubElement(element, "skipped", message=case["detail"][:300])
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def markdown(report: dict[str, Any]) -> str:
    s = report["summary"]
    lines = [
        f"# meshconform report — {report['target']}",
        "",
        f"**Verdict: {s['verdict'].upper()}** (exit {s['exit_code']}) · spec {report['spec_version']} · "
        f"seed {report['seed']} · {report['duration_s']} s · strict: {report['strict']}",
        "",
        "Cases: " + ", ".join(f"{v} {k}" for k, v in s["cases"].items()) + ". Requirements: "
        + ", ".join(f"{v} {k}" for k, v in s["requirements"].items()) + ".",
        "",
        "| Requirement | Level | Verdict | Cases | Reason |",
        "|---|---|---|---|---|",
    ]
    for r in report["requirements"]:
        reason = r["reason"].replace("|", "\\|").replace("\n", " ")[:160]
        lines.append(f"| `{r['id']}` | {r['level']} | {r['verdict']} | {', '.join(r['cases'])} | {reason} |")
    failed = [c for c in report["cases"] if c["outcome"] in ("failed", "error")]
    if failed:
        lines += ["", "## Failures", ""]
        for case in failed:
            lines += [f"### `{case['id']}` ({', '.join(case['requirements'])})", "", "```",
                      case["detail"].strip()[-1500:], "```", "", f"Replay: `{case['replay']}`", ""]
    if report["deviations"]:
        lines += ["", "## Responses deviating from spec/openapi.yaml", ""]
        lines += [f"- {d['method']} {d['path']} → {d['status']}: {d['error']}" for d in report["deviations"]]
    if report["harness_errors"]:
        lines += ["", "## Harness errors", ""] + [f"- {e}" for e in report["harness_errors"]]
    return "\n".join(lines) + "\n"


_COLORS = {"pass": "#1a7f37", "passed": "#1a7f37", "fail": "#cf222e", "failed": "#cf222e", "error": "#8250df",
           "skip": "#9a6700", "skipped": "#9a6700", "not_checked": "#57606a"}


def _badge(value: str) -> str:
    return f'<span class="b" style="background:{_COLORS.get(value, "#57606a")}">{html.escape(value)}</span>'


def _details(text: str) -> str:
    if not text:
        return ""
    return f"<details><summary>detail</summary><pre>{html.escape(text[-3000:])}</pre></details>"


def html_report(report: dict[str, Any]) -> str:
    """A single self-contained HTML file (inline CSS, no scripts, no external resources)."""
    s = report["summary"]
    e = html.escape
    rows = "".join(
        f"<tr><td><code>{e(r['id'])}</code></td><td>{e(r['level'])}</td><td>{_badge(r['verdict'])}</td>"
        f"<td>{e(r['text'])}</td><td>{'<br>'.join(f'<code>{e(c)}</code>' for c in r['cases'])}</td>"
        f"<td>{e(r['reason'][:300])}</td></tr>" for r in report["requirements"])
    cases = "".join(
        f"<tr><td><code>{e(c['id'])}</code></td><td>{_badge(c['outcome'])}</td><td>{c['duration_s']}</td>"
        f"<td>{' '.join(e(x) for x in c['requirements'])}</td>"
        f"<td>{_details(c['detail'])}"
        f"<code class='r'>{e(c['replay'])}</code></td></tr>" for c in report["cases"])
    deviations = "".join(f"<li>{e(d['method'])} {e(d['path'])} → {d['status']}: {e(d['error'])}</li>"
                         for d in report["deviations"])
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>meshconform — {e(report['target'])}</title>
<style>
body{{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#1f2328}} h1{{font-size:1.5em}}
table{{border-collapse:collapse;width:100%;margin:1em 0}} td,th{{border:1px solid #d0d7de;padding:4px 8px;
vertical-align:top;text-align:left}} th{{background:#f6f8fa}} .b{{color:#fff;border-radius:4px;padding:1px 6px;
font-size:12px}} code.r{{display:block;color:#57606a;font-size:11px}} pre{{white-space:pre-wrap;font-size:12px}}
</style></head><body>
<h1>meshconform report — {e(report['target'])}</h1>
<p>{_badge(s['verdict'])} exit {s['exit_code']} · spec {e(report['spec_version'])} · seed {report['seed']} ·
{report['duration_s']} s · strict {report['strict']} · started {e(report['started_at'])}</p>
<p>Cases: {e(json.dumps(s['cases']))} · Requirements: {e(json.dumps(s['requirements']))}</p>
<h2>Requirements</h2><table><tr><th>ID</th><th>Level</th><th>Verdict</th><th>Requirement</th><th>Cases</th>
<th>Reason</th></tr>{rows}</table>
<h2>Cases</h2><table><tr><th>Case</th><th>Outcome</th><th>s</th><th>Requirements</th><th>Detail / replay</th></tr>
{cases}</table>
{'<h2>Responses deviating from spec/openapi.yaml</h2><ul>' + deviations + '</ul>' if deviations else ''}
{''.join('<p><b>Harness error:</b> ' + e(x) + '</p>' for x in report['harness_errors'])}
</body></html>
"""
