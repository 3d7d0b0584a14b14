"""Testing the tester: meshconform must fail every mutant and miniature for the requirement it breaks.

Three layers. The registry is consistent (every expected requirement exists, and the selection runs a case that checks
it). Each in-process patch really deviates: a probe that shows the deviation is false on the reference and true under
the patch, and the patch reverts cleanly. And the suite kills each subject: one module-scoped kill matrix runs
``meshconform run`` against every collected subject (two at a time, the longest first; MESHSPEC_MUTANT_WORKERS
overrides) next to a control, the unpatched reference through the same entry point on the union of the selections,
which must pass. The matrix is printed to the terminal.
"""

from __future__ import annotations

import io
import json
import os
import uuid

import pytest
from rich.console import Console

from conformance import registry
from tests.conformance.mutants import HARNESS_ERROR, MUTANTS, UNDETECTABLE, killmatrix, patched
from tests.conformance.mutants.miniatures import MINIATURES
from spec import SPEC_DIR, load_json, load_yaml

SUBJECTS = killmatrix.subjects()
REQUIREMENTS = {r["id"] for r in load_yaml(SPEC_DIR / "requirements.yaml")["requirements"]}
VECTORS = {v["id"]: v for v in load_json(SPEC_DIR / "vectors" / "fingerprint.json")["vectors"]}


def _selected_cases(selection: tuple[str, ...]) -> list[registry.CaseInfo]:
    """The cases ``--select`` picks (the plugin's rule: an exact id or a prefix of the case id or a requirement)."""
    return [c for c in registry.cases()
            if any(name.startswith(p.rstrip("*")) for p in selection for name in (c.id, *c.requirements))]


# --- the registry ---------------------------------------------------------------------------------------------------


def test_at_least_twenty_mutants_and_the_four_miniatures():
    assert len(MUTANTS) >= 20
    assert set(MINIATURES) == {"accept-everything", "500-everything", "hang", "crash"}
    assert not set(MUTANTS) & set(MINIATURES)


@pytest.mark.parametrize("subject", SUBJECTS + list(UNDETECTABLE.values()), ids=lambda s: s.name)
def test_expected_requirements_exist_and_are_selected(subject):
    assert subject.description and subject.kills
    assert set(subject.kills) <= REQUIREMENTS | {HARNESS_ERROR}, set(subject.kills) - REQUIREMENTS
    if subject.undetectable:
        return
    chosen = _selected_cases(subject.selection)
    assert chosen, f"--select {subject.selection} picks no case"
    expected = set(subject.kills) - {HARNESS_ERROR}
    if expected:
        assert any(expected & set(c.requirements) for c in chosen), "no selected case checks an expected requirement"


# --- each patch deviates, and reverts -------------------------------------------------------------------------------


def _current(owner, attr):
    return vars(owner)[attr] if isinstance(owner, type) else getattr(owner, attr)


@pytest.mark.parametrize("name", sorted({*MUTANTS, *UNDETECTABLE}))
def test_patch_replaces_something_and_reverts(name):
    with patched(name) as patcher:
        replaced = list(patcher.replaced)
        assert replaced, f"{name} patched nothing"
        assert all(_current(owner, attr) is not original for owner, attr, original in replaced)
    assert all(_current(owner, attr) is original for owner, attr, original in replaced)


def _fingerprint(body: bytes) -> str:
    from reference.core import parse_send

    return parse_send(body).fingerprint().hex()


def _vector_fingerprint_differs(vector_id: str) -> bool:
    vector = VECTORS[vector_id]
    return _fingerprint(vector["input"]["body"].encode()) != vector["expected"]["fingerprint"]


def _decision(state: str, same_fingerprint: bool):
    from dataclasses import replace

    from reference.core import OutboxPolicy, new_row
    from reference.daemon import store

    row = replace(new_row("01ARZ3NDEKTSV4RRFFQ69G5FAV", "k", b"a" * 32, b"", 0, OutboxPolicy()), status=state,
                  broker_message_id="b" if state == "done" else None, last_error="why" if state == "dead" else None)
    return store.decide_send(row, b"a" * 32 if same_fingerprint else b"b" * 32, "k")


def _ack(status: int) -> str:
    from reference.daemon import link

    return link.ack_event({"status": status, "error": "x"})[0]


def _negotiates(retention_days: int) -> bool:
    from reference.core import negotiate
    from spec import load_table

    params = {"version": 1, "mode": "retention_scoped", "dedupe_retention_days": retention_days,
              "request_fingerprint": True}
    require = load_table("features")["daemon_defaults"]["require"]
    supported = {bit: {"params": {"version": 1}} for bit in require} | {"client_message_id_dedupe": {"params": params}}
    return negotiate({"supported": supported, "missing_required": []}, require).ok


def _bearer_outcomes(token: str) -> list[str]:
    from reference.daemon import guard
    from reference.daemon.problems import Problem

    checker = guard.Guard(token, 4)
    outcomes = []
    for presented in (token, token[:-1], token + "x", "not-the-token"):
        try:
            checker._check_bearer(f"Bearer {presented}")
            outcomes.append("ok")
        except Problem as problem:
            outcomes.append(problem.code)
    return outcomes


def _requeue_done_outcome() -> str:
    from dataclasses import replace

    from reference.core import OutboxEvent, OutboxPolicy, new_row
    from reference.daemon import store

    row = replace(new_row("01ARZ3NDEKTSV4RRFFQ69G5FAV", "k", b"a" * 32, b"", 0, OutboxPolicy()), status="done")
    event = OutboxEvent("requeue", 1, successor_id="01ARZ3NDEKTSV4RRFFQ69G5FAW", successor_client_message_id="n")
    return store.apply(row, event, OutboxPolicy()).outcome


def _raises_request_error(raw: bytes) -> bool:
    from reference.core import RequestError, parse_send

    try:
        parse_send(raw)
    except RequestError:
        return True
    except Exception:
        return False
    return False


def _minted_is_uuid() -> bool:
    from reference.daemon import app

    cmid = app.parse_send(b'{"to":"#general","message":"x"}').client_message_id
    try:
        return cmid is not None and str(uuid.UUID(cmid)) == cmid
    except ValueError:
        return False


def _dead_event_emitted() -> bool:
    from dataclasses import replace

    from reference.core import OutboxEvent, OutboxPolicy, apply, new_row

    row = replace(new_row("01ARZ3NDEKTSV4RRFFQ69G5FAV", "k", b"a" * 32, b"", 0, OutboxPolicy()), status="inflight")
    return "emit_outbox_dead" in apply(row, OutboxEvent("ack_conflict", 1, error="x"), OutboxPolicy()).effects


def _module_value(module: str, name: str):
    import importlib

    return getattr(importlib.import_module(module), name)


# name -> a probe that is true exactly when the deviation is present (evaluated without and with the patch)
PROBES = {
    "fingerprint-mismatch-202": lambda: _decision("pending", False).http_status == 202,
    "done-match-202": lambda: _decision("done", True).http_status == 202,
    "dead-match-no-reason": lambda: "reason" not in _decision("dead", True).body,
    "header-body-precedence-swapped": lambda: _module_value("reference.core", "parse_send")(
        b'{"to":"#general","message":"x","client_message_id":"body"}', "header").client_message_id == "body",
    "500-on-malformed-json": lambda: not _raises_request_error(b'{"to":'),
    "id-grammar-lax": lambda: _module_value("reference.core", "is_client_message_id")("has space"),
    "minted-uuid": _minted_is_uuid,
    "fingerprint-raw-digest": lambda: _vector_fingerprint_differs("fp-001"),
    "empty-meta-as-braces": lambda: _vector_fingerprint_differs("fp-005"),
    "priority-default-now": lambda: _vector_fingerprint_differs("fp-001"),
    "ignores-409-from-broker": lambda: _ack(409) == "ack_failed",
    "permanent-4xx-retried": lambda: _ack(404) == "ack_failed",
    "no-dead-event": lambda: not _dead_event_emitted(),
    "requeue-done-allowed": lambda: _requeue_done_outcome() == "transition",
    "retention-floor-ignored": lambda: _negotiates(2),
    "negotiation-close-1000": lambda: _module_value("reference.daemon.link", "CLOSE_FEATURE_UNAVAILABLE") != 4010,
    "no-host-check": lambda: _module_value("reference.daemon.guard", "host_is_loopback")("attacker.example"),
    "query-token-accepted": lambda: "token" not in _module_value("reference.daemon.guard", "QUERY_TOKEN_NAMES"),
    "token-prefix-accepted": lambda: _bearer_outcomes("secret-token-value")[1] == "ok",
    "problem-as-plain-json": lambda: _module_value("reference.daemon.problems", "PROBLEM_JSON") != \
        "application/problem+json",
}


@pytest.mark.parametrize("name", sorted(PROBES))
def test_patch_deviates(name):
    """The probe is false on the reference and true under the patch: the mutant really is broken."""
    probe = PROBES[name]
    assert not probe(), f"{name}: the probe already fires on the unpatched reference"
    with patched(name):
        assert probe(), f"{name}: the patch did not produce the deviation"
    assert not probe(), f"{name}: the patch did not revert"


def test_token_compared_with_eq_answers_exactly_like_the_reference():
    """Why it is listed as undetectable: every answer is the reference's; only the comparison's timing differs."""
    reference = _bearer_outcomes("secret-token-value")
    with patched("token-compared-with-eq"):
        assert _bearer_outcomes("secret-token-value") == reference
    assert reference == ["ok", "invalid_bearer_token", "invalid_bearer_token", "invalid_bearer_token"]


# --- the suite kills each subject -----------------------------------------------------------------------------------

CONTROL = killmatrix.control_subject(sorted({item for s in SUBJECTS for item in s.selection}))


@pytest.fixture(scope="module")
def matrix(request) -> dict[str, killmatrix.Verdict]:
    """Run the collected subjects (and the control, when collected) in one pool; print the kill matrix."""
    wanted = []
    for item in request.session.items:
        callspec = getattr(item, "callspec", None)
        if item.module is request.module and callspec is not None and "subject" in callspec.params \
                and item.originalname == "test_killed":
            wanted.append(callspec.params["subject"])
        elif item.module is request.module and item.name == "test_control_passes_the_same_selections":
            wanted.append(CONTROL)
    verdicts = killmatrix.run(wanted, workers=int(os.environ.get("MESHSPEC_MUTANT_WORKERS", "2")))
    text = io.StringIO()
    killmatrix.render(verdicts, Console(file=text, width=160, color_system=None))
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:
        with capture.global_and_fixture_disabled():
            reporter.write_line("")
            for line in text.getvalue().splitlines():
                reporter.write_line(line)
    return {v.name: v for v in verdicts}


def _explain(verdict: killmatrix.Verdict) -> str:
    return json.dumps({k: v for k, v in verdict.as_dict().items() if k != "description"}, indent=1)[-4000:]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("subject", [
    pytest.param(s, marks=pytest.mark.xfail(reason=f"known gap in the suite: {s.known_gap}",
                                            strict=s.name == "token-prefix-accepted"))
    if s.known_gap else s for s in SUBJECTS], ids=lambda s: s.name)
def test_killed(matrix, subject):
    """meshconform fails the subject for (at least) one of the requirements it breaks."""
    verdict = matrix[subject.name]
    assert verdict.killed, f"{subject.name} survived:\n{_explain(verdict)}"
    if HARNESS_ERROR not in subject.kills:
        assert verdict.exit_code == 1, f"a killed subject fails the run with exit 1:\n{_explain(verdict)}"


@pytest.mark.timeout(1800)
def test_control_passes_the_same_selections(matrix):
    """The unpatched reference, through the same entry point, passes everything the subjects were run on."""
    verdict = matrix[CONTROL.name]
    assert verdict.passed, f"the control failed:\n{_explain(verdict)}"
    checked = {r for s in SUBJECTS for r in s.kills} - {HARNESS_ERROR}
    assert all(verdict.verdicts.get(r) == "pass" for r in checked), \
        {r: verdict.verdicts.get(r) for r in checked if verdict.verdicts.get(r) != "pass"}
