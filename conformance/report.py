"""Turning the checks of every test node into requirement verdicts, and writing them as JSON, JUnit XML, Markdown
and HTML.

A requirement's verdict comes from the evidence recorded against it (plugin.py, verdict.py): ``fail`` when any check
failed, ``error`` when the harness broke while checking it, else ``pass`` when any passed, else ``skip`` (with the
reason), else ``not_checked``. Requirements are reported in two parts that never mix: **spec** (the spec's own
MUST/SHOULD) and **profile** (meshspec's decisions where the spec is silent — an erratum E-nn — and the response shapes
of spec/openapi.yaml). Every failed requirement cites what it violates. Beside them stand the TRC verdicts of the
target's trace (traces.py: ``pass``, ``fail`` or ``not_judged``), each of the spec or the profile part by what it
protects and counted with that part. The run fails (exit 1) when a MUST fails — of either part, or of the spec part
only with ``--spec-only`` — or a SHOULD with ``--strict``; a fault of the harness itself is exit 2.
"""

from __future__ import annotations

import functools
import html
import json
import re
import time
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import spec as spec_pkg

from . import registry

VERDICT_ORDER = ("fail", "error", "pass", "skip")
TRACE_VERDICTS = ("pass", "fail", "not_judged")


@functools.cache
def errata_titles() -> dict[str, str]:
    """E-nn -> its title, from the headings of spec/ERRATA.md."""
    text = (spec_pkg.SPEC_DIR / "ERRATA.md").read_text(encoding="utf-8")
    return {m[1]: m[2].strip() for m in re.finditer(r"^## (E-\d{2}) — (.+)$", text, re.M)}


def kind_of(requirement: dict[str, Any]) -> str:
    return "spec" if requirement.get("source") == "spec" else "profile"


def cite(requirement: dict[str, Any]) -> str:
    """What a failure of ``requirement`` violates, in words a third party can look up."""
    source = str(requirement.get("source", "spec"))
    if source == "spec":
        quote = requirement.get("cite") or {}
        if quote.get("text"):
            return f"{quote.get('ref', '§' + requirement['section'])}: “{' '.join(quote['text'].split())}”"
        return f"v0.9.0 §{requirement['section']}"
    if source.startswith("errata:"):
        erratum = source.removeprefix("errata:")
        return f"meshspec {erratum} — {errata_titles().get(erratum, '(erratum)')}"
    if source == "openapi":
        return "meshspec spec/openapi.yaml (E-29): the response shapes meshspec pinned where the spec is silent"
    return source


def _replay(state: Any, case_id: str) -> str:
    target = state.target_spec
    if target.startswith("sdk "):
        spec = target.removeprefix("sdk ")
        parts = ["meshconform sdk", "" if spec == "reference" else f"--launch '{spec}'"]
    elif target.startswith("broker "):
        spec = target.removeprefix("broker ")
        where = "" if spec == "reference" else (f"--url {spec}" if spec.startswith("ws://") else f"--launch '{spec}'")
        parts = ["meshconform broker", where]
    else:
        parts = ["meshconform run", f"--target {target}" if target != "launch" else "--launch '<your template>'"]
    return " ".join(p for p in [*parts, f"--select {case_id}", f"--seed {state.seed}"] if p)


def _verdict(outcomes: list[str]) -> str:
    for verdict in VERDICT_ORDER:
        if verdict in outcomes:
            return verdict
    return "not_checked"


def build_report(state: Any) -> dict[str, Any]:
    """The report document (valid against spec/schemas/report/conformance_report.json)."""
    requirements = spec_pkg.load_yaml(spec_pkg.SPEC_DIR / "requirements.yaml")["requirements"]
    evidence: dict[str, list[dict[str, str]]] = {}
    for result in state.results.values():
        for node_id, node in result.nodes.items():
            for check in node.checks:
                evidence.setdefault(check.requirement, []).append(
                    {"case": result.id, "node": node_id, "outcome": check.outcome, "detail": check.detail})
    if state.deviations:
        detail = "; ".join(f"{d.method} {d.path} -> {d.status}: {d.error}" for d in state.deviations[:5])
        evidence.setdefault("API-CONFORMS", []).append(
            {"case": "(every response)", "node": "", "outcome": "fail",
             "detail": f"{len(state.deviations)} response(s) outside spec/openapi.yaml: {detail}"})
    cases_for = registry.by_requirement()
    req_rows = []
    for req in requirements:
        found = evidence.get(req["id"], [])
        verdict = _verdict([e["outcome"] for e in found])
        reason = ""
        if verdict in ("fail", "error", "skip"):
            wanted = {"fail": "fail", "error": "error", "skip": "skip"}[verdict]
            matching = [e for e in found if e["outcome"] == wanted]
            reason = matching[0]["detail"].strip().splitlines()[0] if matching[0]["detail"].strip() else wanted
            if len(matching) > 1:
                reason += f" (and {len(matching) - 1} more)"
        ran = [c for c in cases_for.get(req["id"], []) if c in state.results]
        ordered = sorted(found, key=lambda e: VERDICT_ORDER.index(e["outcome"]))[:12]
        req_rows.append({"id": req["id"], "level": req["level"], "section": req["section"], "kind": kind_of(req),
                         "source": req.get("source", "spec"), "cite": cite(req),
                         "text": " ".join(req["text"].split()), "verdict": verdict, "cases": ran,
                         "reason": reason[:500], "evidence": [{**e, "detail": e["detail"][:1500]} for e in ordered]})
    case_rows = [{"id": r.id, "requirements": list(r.requirements), "outcome": r.outcome,
                  "duration_s": round(r.duration_s, 3), "detail": r.detail, "replay": _replay(state, r.id)}
                 for r in state.results.values()]
    traces = getattr(state, "trace_verdicts", None)
    trace_rows = traces["invariants"] if traces else []
    parts = {kind: _part([r for r in req_rows if r["kind"] == kind], [t for t in trace_rows if t["kind"] == kind],
                         state.strict) for kind in ("spec", "profile")}
    counted = [parts["spec"]] if state.spec_only else [parts["spec"], parts["profile"]]
    must_failures = sum(p["must_failures"] for p in counted)
    should_failures = sum(p["should_failures"] for p in counted)
    if state.harness_errors:
        exit_code, verdict = 2, "error"
    elif must_failures or (state.strict and should_failures):
        exit_code, verdict = 1, "fail"
    else:
        exit_code, verdict = 0, "pass"
    target = getattr(state, "target", None)
    timing = getattr(target, "timing", None)
    report = {
        "tool": "meshconform", "version": spec_pkg.SPEC_VERSION, "spec_version": spec_pkg.SPEC_VERSION,
        "target": state.target_spec, "strict": state.strict, "spec_only": state.spec_only, "seed": state.seed,
        "started_at": datetime.fromtimestamp(state.started, UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "duration_s": round(time.time() - state.started, 3),
        "timing": {"source": timing.source if timing else "not applicable",
                   "values": {k: v for k, v in vars(timing).items() if k != "source"} if timing else {}},
        "summary": {
            "verdict": verdict, "exit_code": exit_code,
            "cases": _count([c["outcome"] for c in case_rows], ("passed", "failed", "skipped", "error")),
            "requirements": _count([r["verdict"] for r in req_rows], (*VERDICT_ORDER, "not_checked")),
            "must_failures": must_failures, "should_failures": should_failures,
            "spec": parts["spec"], "profile": parts["profile"], "deadline_skips": state.deadline_hit,
        },
        "requirements": req_rows,
        "cases": case_rows,
        "deviations": [{"method": d.method, "path": d.path, "status": d.status, "error": d.error}
                       for d in state.deviations],
        "harness_errors": list(state.harness_errors),
    }
    if traces is not None:
        report["traces"] = traces
    launched = getattr(target, "launched", None)
    if launched is not None and launched.description.get("name"):
        report["target_name"] = str(launched.description.get("name"))
    broker = getattr(target, "broker", None)
    if broker is not None and broker.links:
        report["dialect"] = ", ".join(sorted({link.dialect for link in broker.links.values() if link.hello}))
    return report


def _count(values: list[str], keys: tuple[str, ...]) -> dict[str, int]:
    return {k: sum(1 for v in values if v == k) for k in keys}


def _part(rows: list[dict[str, Any]], trace_rows: list[dict[str, Any]], strict: bool) -> dict[str, Any]:
    must = sum(1 for r in rows + trace_rows if r["verdict"] in ("fail", "error") and r["level"] == "MUST")
    should = sum(1 for r in rows + trace_rows if r["verdict"] in ("fail", "error") and r["level"] == "SHOULD")
    return {"verdict": "fail" if must or (strict and should) else "pass",
            "requirements": _count([r["verdict"] for r in rows], (*VERDICT_ORDER, "not_checked")),
            "invariants": _count([r["verdict"] for r in trace_rows], TRACE_VERDICTS),
            "must_failures": must, "should_failures": should}


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
    """JUnit XML: one testsuite per part (spec, profile), one testcase per checked requirement."""
    root = ET.Element("testsuites", name="meshconform", time=str(report["duration_s"]))
    for kind in ("spec", "profile"):
        rows = [r for r in report["requirements"] if r["kind"] == kind and r["verdict"] != "not_checked"]
        suite = ET.SubElement(root, "testsuite", name=f"meshconform.{kind}", tests=str(len(rows)),
                              failures=str(sum(r["verdict"] == "fail" for r in rows)),
                              errors=str(sum(r["verdict"] == "error" for r in rows)),
                              skipped=str(sum(r["verdict"] == "skip" for r in rows)))
        for row in rows:
            element = ET.SubElement(suite, "testcase", classname=f"meshconform.{kind}.{row['level']}",
                                    name=row["id"])
            properties = ET.SubElement(element, "properties")
            ET.SubElement(properties, "property", name="source", value=row["source"])
            ET.SubElement(properties, "property", name="cite", value=row["cite"])
            for case in row["cases"]:
                ET.SubElement(properties, "property", name="case", value=case)
            if row["verdict"] in ("fail", "error"):
                tag = "failure" if row["verdict"] == "fail" else "error"
                node = ET.SubElement(element, tag, message=row["reason"][:200] or row["verdict"])
                node.text = "\n\n".join(f"[{e['case']}] {e['detail']}" for e in row["evidence"]
                                        if e["outcome"] == row["verdict"])
            elif row["verdict"] == "skip":
                ET.SubElement(element, "skipped", message=row["reason"][:300])
    if "traces" in report:
        rows = report["traces"]["invariants"]
        suite = ET.SubElement(root, "testsuite", name="meshconform.traces", tests=str(len(rows)),
                              failures=str(sum(r["verdict"] == "fail" for r in rows)), errors="0",
                              skipped=str(sum(r["verdict"] == "not_judged" for r in rows)))
        for row in rows:
            element = ET.SubElement(suite, "testcase", classname=f"meshconform.traces.{row['kind']}.{row['level']}",
                                    name=row["id"])
            properties = ET.SubElement(element, "properties")
            ET.SubElement(properties, "property", name="cite", value=row["cite"])
            for requirement in row["protects"]:
                ET.SubElement(properties, "property", name="protects", value=requirement)
            if row["verdict"] == "fail":
                node = ET.SubElement(element, "failure", message=row["reason"][:200])
                node.text = "\n\n".join(_violation_text(e) for e in row["evidence"])
            elif row["verdict"] == "not_judged":
                ET.SubElement(element, "skipped", message=row["reason"][:300])
    return ET.tostring(root, encoding="utf-8", xml_declaration=True)


def _violation_text(evidence: dict[str, Any]) -> str:
    """One TRC violation: its key, where its event sits, the related event, the detail and the evidence lines."""
    key = ", ".join(f"{k}={v}" for k, v in evidence["key"].items())
    related = f" (related: {evidence['related']})" if evidence["related"] else ""
    return (f"{key} at {evidence['where']}{related}: {evidence['detail']}; evidence: "
            f"{', '.join(evidence['events']) or '—'}")


def _md(text: str, limit: int = 200) -> str:
    return " ".join(text.split()).replace("|", "\\|")[:limit]


def markdown(report: dict[str, Any]) -> str:
    s = report["summary"]
    lines = [
        f"# meshconform report — {report.get('target_name') or report['target']}",
        "",
        f"**Verdict: {s['verdict'].upper()}** (exit {s['exit_code']}) · spec {report['spec_version']} · "
        f"seed {report['seed']} · {report['duration_s']} s · strict: {report['strict']} · "
        f"spec only: {report['spec_only']}" + (f" · broker dialect: {report['dialect']}" if report.get("dialect")
                                                else ""),
        "",
        f"- **Spec conformance** (the spec's own MUST/SHOULD): **{s['spec']['verdict'].upper()}** — "
        + ", ".join(f"{v} {k}" for k, v in s["spec"]["requirements"].items()),
        f"- **meshspec profile** (errata decisions and the OpenAPI shape, where the spec is silent): "
        f"**{s['profile']['verdict'].upper()}** — "
        + ", ".join(f"{v} {k}" for k, v in s["profile"]["requirements"].items()),
        "- Cases: " + ", ".join(f"{v} {k}" for k, v in s["cases"].items())
        + (f"; {s['deadline_skips']} node(s) skipped at the run deadline" if s["deadline_skips"] else ""),
        f"- Timing: {report['timing']['source']}",
        "",
    ]
    for kind, title in (("spec", "Spec conformance"), ("profile", "meshspec profile")):
        lines += [f"## {title}", "", "| Requirement | Level | Verdict | Source | Reason |", "|---|---|---|---|---|"]
        for r in report["requirements"]:
            if r["kind"] != kind:
                continue
            source = r["source"].removeprefix("errata:") if r["source"] != "spec" else f"§{r['section']}"
            lines.append(f"| `{r['id']}` | {r['level']} | {r['verdict']} | {source} | {_md(r['reason'], 160)} |")
        lines.append("")
    traces = report.get("traces")
    if traces is not None:
        kept = f" Kept in `{traces['directory']}`." if traces["directory"] else ""
        lines += ["## Trace checks", "",
                  f"**{traces['verdict'].upper()}** — {_md(traces['reason'], 300)} ({traces['events']} events, "
                  f"sources: {', '.join(traces['sources']) or '—'}).{kept} Each invariant stands in the spec or the "
                  "profile part by what it protects.", "",
                  "| Invariant | Part | Level | Verdict | Protects | Reason |", "|---|---|---|---|---|---|"]
        for r in traces["invariants"]:
            protects = ", ".join(r["protects"] + r["errata"]) or "—"
            lines.append(f"| `{r['id']}` | {r['kind']} | {r['level']} | {r['verdict']} | {protects} | "
                         f"{_md(r['reason'], 160)} |")
        lines.append("")
    failed = [r for r in report["requirements"] if r["verdict"] in ("fail", "error")]
    failed_traces = [r for r in (traces or {}).get("invariants", []) if r["verdict"] == "fail"]
    if failed or failed_traces:
        lines += ["## Failures", ""]
        for r in failed:
            lines += [f"### `{r['id']}` ({r['level']}, {r['kind']})", "", f"Violates: {r['cite']}", "",
                      f"Requirement: {r['text']}", ""]
            for e in r["evidence"]:
                if e["outcome"] in ("fail", "error"):
                    lines += [f"- `{e['case']}` — {_md(e['detail'], 600)}"]
            replays = sorted({c["replay"] for c in report["cases"] if c["id"] in r["cases"]})
            lines += ["", *[f"Replay: `{x}`" for x in replays[:3]], ""]
        for r in failed_traces:
            lines += [f"### `{r['id']}` ({r['level']}, {r['kind']}, trace)", "", f"Violates: {r['cite']}", "",
                      f"Invariant: {r['title']}", ""]
            if r["evidence"]:
                lines += [f"{r['violations']} violation(s), the first {len(r['evidence'])}:", ""]
                lines += [f"- {_md(_violation_text(e), 600)}" for e in r["evidence"]]
            else:
                lines.append(f"- {_md(r['reason'], 600)}")
            lines.append("")
    if report["deviations"]:
        lines += ["## Responses outside spec/openapi.yaml (evidence for API-CONFORMS)", ""]
        lines += [f"- {d['method']} {d['path']} → {d['status']}: {_md(d['error'], 300)}" for d in report["deviations"]]
        lines.append("")
    if report["harness_errors"]:
        lines += ["## Harness errors", ""] + [f"- {_md(e, 600)}" for e in report["harness_errors"]]
    return "\n".join(lines).rstrip() + "\n"


_COLORS = {"pass": "#1a7f37", "passed": "#1a7f37", "fail": "#cf222e", "failed": "#cf222e", "error": "#8250df",
           "skip": "#9a6700", "skipped": "#9a6700", "not_checked": "#57606a", "not_judged": "#57606a"}


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

    def table(kind: str) -> str:
        return "".join(
            f"<tr><td><code>{e(r['id'])}</code></td><td>{e(r['level'])}</td><td>{_badge(r['verdict'])}</td>"
            f"<td>{e(r['text'])}<br><small>{e(r['cite'])}</small></td>"
            f"<td>{'<br>'.join(f'<code>{e(c)}</code>' for c in r['cases'])}</td>"
            f"<td>{e(r['reason'][:300])}{_details(chr(10).join(x['detail'] for x in r['evidence']))}</td></tr>"
            for r in report["requirements"] if r["kind"] == kind)

    cases = "".join(
        f"<tr><td><code>{e(c['id'])}</code></td><td>{_badge(c['outcome'])}</td><td>{c['duration_s']}</td>"
        f"<td>{' '.join(e(x) for x in c['requirements'])}</td>"
        f"<td>{_details(c['detail'])}"
        f"<code class='r'>{e(c['replay'])}</code></td></tr>" for c in report["cases"])
    deviations = "".join(f"<li>{e(d['method'])} {e(d['path'])} → {d['status']}: {e(d['error'])}</li>"
                         for d in report["deviations"])
    traces = report.get("traces")
    trace_section = "" if traces is None else (
        f"<h2>Trace checks</h2><p>{_badge(traces['verdict'])} {e(traces['reason'])} · {traces['events']} events"
        + (f" · kept in <code>{e(traces['directory'])}</code>" if traces["directory"] else "") + "</p>"
        "<table><tr><th>Invariant</th><th>Part / level</th><th>Verdict</th><th>Protects / violates</th>"
        "<th>Reason</th></tr>" + "".join(
            f"<tr><td><code>{e(r['id'])}</code><br><small>{e(r['title'])}</small></td>"
            f"<td>{e(r['kind'])} {e(r['level'])}</td><td>{_badge(r['verdict'])}</td>"
            f"<td>{e(', '.join(r['protects'] + r['errata']) or '—')}<br><small>{e(r['cite'])}</small></td>"
            f"<td>{e(r['reason'][:300])}{_details(chr(10).join(_violation_text(x) for x in r['evidence']))}</td></tr>"
            for r in traces["invariants"]) + "</table>")
    head = ("<tr><th>ID</th><th>Level</th><th>Verdict</th><th>Requirement / violates</th><th>Cases</th>"
            "<th>Reason</th></tr>")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>meshconform — {e(report['target'])}</title>
<style>
body{{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#1f2328}} h1{{font-size:1.5em}}
table{{border-collapse:collapse;width:100%;margin:1em 0}} td,th{{border:1px solid #d0d7de;padding:4px 8px;
vertical-align:top;text-align:left}} th{{background:#f6f8fa}} .b{{color:#fff;border-radius:4px;padding:1px 6px;
font-size:12px}} code.r{{display:block;color:#57606a;font-size:11px}} pre{{white-space:pre-wrap;font-size:12px}}
small{{color:#57606a}}
</style></head><body>
<h1>meshconform report — {e(report.get('target_name') or report['target'])}</h1>
<p>{_badge(s['verdict'])} exit {s['exit_code']} · spec {e(report['spec_version'])} · seed {report['seed']} ·
{report['duration_s']} s · strict {report['strict']} · spec only {report['spec_only']} · started
{e(report['started_at'])} · timing: {e(report['timing']['source'])}</p>
<p>Spec conformance: {_badge(s['spec']['verdict'])} {e(json.dumps(s['spec']['requirements']))}<br>
meshspec profile: {_badge(s['profile']['verdict'])} {e(json.dumps(s['profile']['requirements']))}<br>
Cases: {e(json.dumps(s['cases']))}</p>
<h2>Spec conformance</h2><table>{head}{table('spec')}</table>
<h2>meshspec profile (errata and OpenAPI shape)</h2><table>{head}{table('profile')}</table>
{trace_section}
<h2>Cases</h2><table><tr><th>Case</th><th>Outcome</th><th>s</th><th>Requirements</th><th>Detail / replay</th></tr>
{cases}</table>
{'<h2>Responses outside spec/openapi.yaml</h2><ul>' + deviations + '</ul>' if deviations else ''}
{''.join('<p><b>Harness error:</b> ' + e(x) + '</p>' for x in report['harness_errors'])}
</body></html>
"""
