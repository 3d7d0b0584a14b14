"""Testing the tester: meshconform must fail every mutant and miniature for the requirement it breaks.

Three layers. The registry is consistent: every expected requirement exists, the selection runs a case that checks it,
each mutant replaces exactly one ``Components`` field (its seam) with a subclass or wrapper, no module attribute of
``reference`` changes while the catalogue is built, and nothing of the catalogue ships in the wheel. Each replacement
really deviates: a probe that shows the deviation is false with the reference's component and true with the
mutant's. These are cheap and run in ``make test``. And the suite kills each subject (marked ``slow``: ``make
slow-bounded``): one module-scoped kill matrix runs ``meshconform run`` against every collected subject (two at a
time, the longest first; MESHSPEC_MUTANT_WORKERS overrides) next to a control -- the reference through the same entry
point on the union of the selections, which must fail nothing beyond ``killmatrix.REFERENCE_FAILURES``. The matrix is
printed to the terminal; with MESHSPEC_KILLMATRIX_RECORD=tests/conformance/killmatrix.json it is recorded too.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import io
import json
import os
import pkgutil
import re
import time
import tomllib
import uuid
from pathlib import Path

import pytest
from rich.console import Console

import reference
from conformance import registry
from reference.daemon.runtime import Components
from spec import SPEC_DIR, load_json, load_yaml
from tests.conformance.mutants import HARNESS_ERROR, MUTANTS, SEAMS, UNDETECTABLE, killmatrix
from tests.conformance.mutants.miniatures import MINIATURES

REPO = Path(__file__).resolve().parents[2]
SUBJECTS = killmatrix.subjects()
REQUIREMENTS = {r["id"] for r in load_yaml(SPEC_DIR / "requirements.yaml")["requirements"]}
VECTORS = {v["id"]: v for v in load_json(SPEC_DIR / "vectors" / "fingerprint.json")["vectors"]}


def _declared_cases() -> list[tuple[str, tuple[str, ...]]]:
    """Every case id and the requirements its ``@case`` mark declares, read from the imported case modules (the
    marks as pytest sees them, ``*``-expanded lists included)."""
    found = []
    for path in sorted(registry.CASES_DIR.glob("test_*.py")):
        module = importlib.import_module(f"conformance.cases.{path.stem}")
        for function in vars(module).values():
            for mark in getattr(function, "pytestmark", []):
                if mark.name == registry.MARK:
                    found.append((mark.args[0], tuple(mark.args[1:])))
    return found


CASES = _declared_cases()


def _selected_cases(selection: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """The cases ``--select`` picks (the plugin's rule: an exact id or a prefix of the case id or a requirement)."""
    return [(case, reqs) for case, reqs in CASES
            if any(name.startswith(p.rstrip("*")) for p in selection for name in (case, *reqs))]


# --- the registry ---------------------------------------------------------------------------------------------------


def test_the_catalogue_and_the_miniatures():
    assert len(MUTANTS) >= 60
    assert set(MINIATURES) == {"accept-everything", "500-everything", "hang", "hang-everything", "endless-pages",
                               "garbage", "crash"}
    assert not set(MUTANTS) & set(MINIATURES)
    assert [m.name for m in MINIATURES.values() if HARNESS_ERROR in m.kills] == ["crash"]


@pytest.mark.parametrize("subject", SUBJECTS + list(UNDETECTABLE.values()), ids=lambda s: s.name)
def test_expected_requirements_exist_and_are_selected(subject):
    assert subject.description and subject.kills
    assert set(subject.kills) <= REQUIREMENTS | {HARNESS_ERROR}, set(subject.kills) - REQUIREMENTS
    if subject.undetectable:
        return
    chosen = _selected_cases(subject.selection)
    expected = set(subject.kills) - {HARNESS_ERROR}
    checks = bool(chosen) and (not expected or any(expected & set(reqs) for _, reqs in chosen))
    if subject.known_gap and not checks:
        return  # awaiting its case: the gap says which
    assert chosen, f"--select {subject.selection} picks no case"
    assert checks, f"no selected case checks {sorted(expected)}: {chosen}"


@pytest.mark.parametrize("name", sorted({*MUTANTS, *UNDETECTABLE}))
def test_one_deviation_through_one_seam(name):
    """A mutant replaces exactly the Components field it names, with a subclass of the reference's class or a
    callable other than the reference's function."""
    entry = MUTANTS.get(name) or UNDETECTABLE[name]
    if entry.seam is None:
        assert entry.undetectable, f"{name} names no seam and is not listed as undetectable"
        assert "seam" in entry.undetectable, "an entry with no seam says why in its reason"
        return
    assert entry.seam in SEAMS
    reference_parts, mutant_parts = Components(), entry.components()
    changed = [f.name for f in dataclasses.fields(Components)
               if getattr(reference_parts, f.name) is not getattr(mutant_parts, f.name)]
    assert changed == [entry.seam]
    default, replacement = getattr(reference_parts, entry.seam), getattr(mutant_parts, entry.seam)
    if isinstance(default, type):
        assert isinstance(replacement, type) and issubclass(replacement, default) and replacement is not default
    else:
        assert callable(replacement)


def _module_state() -> dict[str, dict[str, int]]:
    """``id`` of every attribute of every loaded ``reference`` module and of every class defined there."""
    state = {}
    for info in pkgutil.walk_packages(reference.__path__, "reference."):
        module = importlib.import_module(info.name)
        state[info.name] = {k: id(v) for k, v in vars(module).items()}
        for cls_name, cls in vars(module).items():
            if isinstance(cls, type) and cls.__module__ == info.name:
                state[f"{info.name}.{cls_name}"] = {k: id(v) for k, v in vars(cls).items()}
    return state


def test_building_the_catalogue_replaces_no_module_attribute():
    _module_state()  # imports every module first: importing a submodule sets an attribute on its package
    before = _module_state()
    for entry in [*MUTANTS.values(), *UNDETECTABLE.values()]:
        entry.components()
    after = _module_state()
    changed = {owner: sorted(k for k in set(before[owner]) | set(after.get(owner, {}))
                             if before[owner].get(k) != after.get(owner, {}).get(k))
               for owner in before}
    assert not {owner: names for owner, names in changed.items() if names}


def test_nothing_of_the_catalogue_ships_in_the_wheel():
    from setuptools import find_namespace_packages

    find = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = find_namespace_packages(str(REPO), include=find["include"])
    assert shipped and not [p for p in shipped if p.startswith("tests") or "mutants" in p], shipped
    assert not (REPO / "conformance" / "mutants").exists()


# --- each replacement deviates --------------------------------------------------------------------------------------


def _parse(name: str | None):
    return (MUTANTS[name].components() if name else Components()).parse_send


def _fingerprint(name: str | None, vector_id: str) -> str:
    return _parse(name)(VECTORS[vector_id]["input"]["body"].encode()).fingerprint().hex()


def _accepts_id(name: str | None, cmid: str) -> bool:
    from reference.core import RequestError

    try:
        return _parse(name)(json.dumps({"to": "#general", "message": "x", "client_message_id": cmid}).encode()) \
            .client_message_id == cmid
    except RequestError:
        return False


def _raises_unexpected(name: str | None, raw: bytes) -> bool:
    from reference.core import RequestError

    try:
        _parse(name)(raw)
    except RequestError:
        return False
    except Exception:
        return True
    return False


SEND = b'{"to":"#general","message":"x"}'
OTHER = b'{"to":"#general","message":"y"}'


def _store(name: str | None, tmp_path: Path):
    from reference.core import OutboxPolicy

    cls = (MUTANTS[name].components() if name else Components()).outbox_store
    return cls(tmp_path / f"{name or 'reference'}-{uuid.uuid4().hex[:8]}.db", OutboxPolicy(retry_base_ms=100,
                                                                                           retry_max_ms=500))


def _settle(store, cmid: str, state: str) -> None:
    from reference.core import OutboxEvent

    if state == "pending":
        return
    store.drain(10**13, 10)
    if state == "inflight":
        return
    event = {"done": OutboxEvent("ack_created", 2, broker_message_id="bm-1", history_id="h-1"),
             "dead": OutboxEvent("ack_rejected", 2, error="404 destination_not_found")}[state]
    store.transition(cmid, event, by="client_message_id")


def _decision(name: str | None, tmp_path: Path, state: str, again: bytes):
    from reference.core import parse_send

    store = _store(name, tmp_path)
    try:
        store.accept(parse_send(SEND), "k", "01ARZ3NDEKTSV4RRFFQ69G5FAV", 1)
        _settle(store, "k", state)
        return store.accept(parse_send(again), "k", "01ARZ3NDEKTSV4RRFFQ69G5FAW", 3)[0]
    finally:
        store.close()


def _recovered(name: str | None, tmp_path: Path) -> list[tuple[str, int]]:
    from reference.core import parse_send

    store = _store(name, tmp_path)
    try:
        for n in range(3):
            store.accept(parse_send(SEND), f"k{n}", f"01ARZ3NDEKTSV4RRFFQ69G5FA{n}", 1)
        store.drain(10**13, 10)
        store.recover(10**13)
        return [(row.status, row.attempts) for row in store.list()[0]]
    finally:
        store.close()


def _retry_delays(name: str | None, tmp_path: Path) -> list[int]:
    from reference.core import OutboxEvent, parse_send

    store = _store(name, tmp_path)
    try:
        store.accept(parse_send(SEND), "k", "01ARZ3NDEKTSV4RRFFQ69G5FAV", 0)
        delays, now = [], 0
        for _ in range(5):
            store.drain(now, 10)
            after = store.transition("k", OutboxEvent("ack_failed", now, error="503"), by="client_message_id").after
            delays.append(after.next_attempt_at - now)
            now = after.next_attempt_at
        return delays
    finally:
        store.close()


def _inbox_filter(name: str | None, tmp_path: Path, **query) -> int:
    from reference.daemon.store import InboxMessage

    cls = (MUTANTS[name].components() if name else Components()).inbox_store
    inbox, _ = cls.open_or_quarantine(tmp_path / f"inbox-{uuid.uuid4().hex[:8]}.db")
    try:
        for n, topic in enumerate(("a", "b")):
            inbox.insert(InboxMessage(id=f"01ARZ3NDEKTSV4RRFFQ69G5FA{n}", client_message_id=f"m{n}", mesh="m",
                                      sender_pubkey="5b" * 32, sender_name="", received_at=1000 + n,
                                      broker_message_id=f"b{n}", topic=topic, body="x", meta=None,
                                      reply_to_id=None, delivery_id=None))
        return len(inbox.page(**query)[0])
    finally:
        inbox.close()


def _wsgi(name: str | None, path: str = "/v1/compat", headers: dict | None = None, transport: str = "tcp",
          query: str | None = None) -> int:
    """Status of one request to the app ``create_app`` builds (a route that needs nothing from the context)."""
    import falcon.testing

    from reference.daemon.app import DaemonContext

    config = {"ipc": {"max_inflight": 64, "max_body_bytes": 1024, "max_streams": 4}, "daemon": {"mesh": "m"},
              "broker": {}}
    ctx = DaemonContext(config=config, token="secret-token-value", outbox=None, inbox=None, link=None, events=None,
                        committer=None, metrics=None, member_pubkey="5b" * 32)
    app = (MUTANTS[name].components() if name else Components()).create_app(ctx, lambda *a: {})
    client = falcon.testing.TestClient(app)
    sent = {"Authorization": "Bearer secret-token-value", "Host": "localhost", **(headers or {})}
    return client.simulate_get(path, headers=sent, query_string=query, extras={"meshd.transport": transport}).status


class _OneFrame:
    """A WebSocket stand-in that has one text frame to read."""

    def __init__(self, frame: dict):
        self.frame = json.dumps(frame).encode()

    def settimeout(self, timeout: float) -> None:
        pass

    def gettimeout(self) -> float:
        return 1.0

    def recv_data(self) -> tuple[int, bytes]:
        import websocket

        return websocket.ABNF.OPCODE_TEXT, self.frame

    def recv(self) -> str:
        return self.frame.decode()


def _negotiated(name: str | None, **spoil) -> dict:
    """What the link judges when the broker's feature_negotiation_response is spoiled by ``spoil`` (a parameter of
    client_message_id_dedupe set, or ``bit=None``: that bit left out)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from conformance.peer import DEFAULT_SUPPORTED
    from reference.daemon.config import load
    from reference.daemon.identity import Keypair

    response = {"type": "feature_negotiation_response", "supported": json.loads(json.dumps(DEFAULT_SUPPORTED)),
                "missing_required": []}
    for key, value in spoil.items():
        if value is None:
            response["supported"].pop(key)
        else:
            response["supported"]["client_message_id_dedupe"]["params"][key] = value
    link_class = (MUTANTS[name].components() if name else Components()).broker_link
    link = link_class(config=load(None, {}).values, keypair=Keypair(Ed25519PrivateKey.generate()), outbox=None,
                      inbox=None, publish=lambda *a: None, on_fatal=lambda *a: None)
    return link._expect(_OneFrame(response), "feature_negotiation_response")


def _negotiates(name: str | None, **spoil) -> bool:
    from reference.core import negotiate
    from spec import load_table

    defaults = load_table("features")["daemon_defaults"]
    return negotiate(_negotiated(name, **spoil), defaults["require"], defaults["optional"]).ok


# name -> a probe that is true exactly when the deviation is present: probe(None) runs the reference's component,
# probe(name) the mutant's. Link, committer and app-level mutants without a cheap in-process probe are proven by
# the kill matrix alone.
PROBES = {
    "header-body-precedence-swapped": lambda n, _: _parse(n)(
        b'{"to":"#general","message":"x","client_message_id":"body"}', "header").client_message_id == "body",
    "500-on-malformed-json": lambda n, _: _raises_unexpected(n, b'{"to":'),
    "id-grammar-lax": lambda n, _: _accepts_id(n, "has space"),
    "id-grammar-trailing-newline": lambda n, _: _accepts_id(n, "valid-id\n"),
    "fingerprint-raw-digest": lambda n, _: _fingerprint(n, "fp-001") != VECTORS["fp-001"]["expected"]["fingerprint"],
    "empty-meta-as-braces": lambda n, _: _fingerprint(n, "fp-005") != VECTORS["fp-005"]["expected"]["fingerprint"],
    "priority-default-now": lambda n, _: _fingerprint(n, "fp-001") != VECTORS["fp-001"]["expected"]["fingerprint"],
    "fingerprint-mismatch-202": lambda n, t: _decision(n, t, "pending", OTHER).http_status == 202,
    "insert-or-ignore": lambda n, t: _decision(n, t, "done", SEND).http_status == 202,
    "done-match-202": lambda n, t: _decision(n, t, "done", SEND).http_status == 202,
    "dead-match-no-reason": lambda n, t: "reason" not in _decision(n, t, "dead", SEND).body,
    "conflict-prefix-of-stored-row": lambda n, t: _decision(n, t, "done", OTHER).body["daemon_fingerprint_prefix"]
    != _parse(None)(OTHER).fingerprint()[:8].hex(),
    "done-duplicate-history-id-wrong": lambda n, t: _decision(n, t, "done", SEND).body["history_id"] != "h-1",
    "done-duplicate-broker-message-id-wrong":
        lambda n, t: _decision(n, t, "done", SEND).body["broker_message_id"] != "bm-1",
    "inflight-never-recovered": lambda n, t: any(s == "inflight" for s, _ in _recovered(n, t)),
    "recovery-first-row-only": lambda n, t: any(s == "inflight" for s, _ in _recovered(n, t)),
    "recovery-increments-attempts": lambda n, t: any(a != 1 for _, a in _recovered(n, t)),
    "backoff-non-growing": lambda n, t: _retry_delays(n, t)[2] < 300,
    "backoff-no-cap": lambda n, t: _retry_delays(n, t)[4] > 500 * 1.25,
    "backoff-wrong-base": lambda n, t: _retry_delays(n, t)[0] > 100 * 1.25,
    "inbox-topic-filter-ignored": lambda n, t: _inbox_filter(n, t, topic="a") != 1,
    "inbox-since-exclusive": lambda n, t: _inbox_filter(n, t, since_ms=1001) != 1,
    "no-host-check": lambda n, _: _wsgi(n, headers={"Host": "attacker.example"}) == "200 OK",
    "host-prefix-match": lambda n, _: _wsgi(n, headers={"Host": "localhost.evil"}) == "200 OK",
    "host-suffix-match": lambda n, _: _wsgi(n, headers={"Host": "evil.localhost"}) == "200 OK",
    "ipv6-loopback-port-refused": lambda n, _: _wsgi(n, headers={"Host": "[::1]:8080"}) != "200 OK",
    "origin-allowed": lambda n, _: _wsgi(n, headers={"Origin": "https://evil.example"}) == "200 OK",
    "origin-null-accepted": lambda n, _: _wsgi(n, headers={"Origin": "null"}) == "200 OK",
    "origin-allowed-on-unix": lambda n, _: _wsgi(n, headers={"Origin": "https://evil.example"},
                                                 transport="unix") == "200 OK",
    "query-token-accepted": lambda n, _: _wsgi(n, query="token=secret-token-value") == "200 OK",
    "query-access-token-accepted": lambda n, _: _wsgi(n, query="access_token=secret-token-value") == "200 OK",
    "token-prefix-accepted": lambda n, _: _wsgi(n, headers={"Authorization": "Bearer secret-token"}) == "200 OK",
    "retention-floor-ignored": lambda n, _: _negotiates(n, dedupe_retention_days=2),
    "integer-param-as-string-accepted": lambda n, _: _negotiates(n, dedupe_retention_days="7"),
    "required-bit-missing-accepted": lambda n, _: _negotiates(n, concurrent_connection_policy=None),
}


@pytest.mark.parametrize("name", sorted(PROBES))
def test_replacement_deviates(name, tmp_path):
    """The probe is false with the reference's component and true with the mutant's: the mutant really is broken."""
    assert name in MUTANTS
    probe = PROBES[name]
    assert not probe(None, tmp_path), f"{name}: the probe already fires on the reference's component"
    assert probe(name, tmp_path), f"{name}: the mutant's component does not deviate"


def test_probes_name_real_mutants():
    assert set(PROBES) <= set(MUTANTS)
    assert all(inspect.isfunction(p) for p in PROBES.values())


def test_the_miniatures_are_stdlib_only():
    source = (Path(killmatrix.__file__).parent / "miniatures.py").read_text()
    imported = set(re.findall(r"^(?:from|import) ([\w.]+)", source, re.M))
    assert imported <= {"__future__", "argparse", "itertools", "json", "os", "shlex", "socketserver", "sys",
                        "threading", "http.server", "pathlib", "."}, imported


# --- the suite kills each subject (slow: make slow-bounded) ---------------------------------------------------------

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
    started = time.monotonic()
    verdicts = killmatrix.run(wanted, workers=int(os.environ.get("MESHSPEC_MUTANT_WORKERS", "2")))
    if os.environ.get("MESHSPEC_KILLMATRIX_RECORD"):  # e.g. tests/conformance/killmatrix.json
        killmatrix.record(verdicts, Path(os.environ["MESHSPEC_KILLMATRIX_RECORD"]), time.monotonic() - started)
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


@pytest.mark.slow
@pytest.mark.timeout(7200)
@pytest.mark.parametrize("subject", [
    pytest.param(s, marks=pytest.mark.xfail(reason=f"known gap in the suite: {s.known_gap}", strict=False))
    if s.known_gap else s for s in SUBJECTS], ids=lambda s: s.name)
def test_killed(matrix, subject):
    """meshconform fails the subject for (at least) one of the requirements it breaks, in verdicts, in time."""
    verdict = matrix[subject.name]
    assert verdict.killed, f"{subject.name} survived:\n{_explain(verdict)}"
    control = matrix.get(CONTROL.name)
    assert killmatrix.confirmed(verdict, control), \
        f"{subject.name} was failed only for requirements the reference (the control) fails too: " \
        f"{ {r: control.verdicts.get(r) for r in verdict.killed_by} }\n{_explain(verdict)}"
    if HARNESS_ERROR in subject.kills:
        assert "before answering" in verdict.output_tail or verdict.harness_errors, _explain(verdict)
    else:
        assert verdict.exit_code == 1, f"a killed subject fails the run with exit 1, not {verdict.exit_code}:\n" \
                                       f"{_explain(verdict)}"
    assert verdict.in_time, f"{subject.name} ran {verdict.duration_s} s, past its {subject.deadline_s:g} s deadline " \
                            f"and {killmatrix.GRACE_S:g} s of grace"


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_control_passes_the_same_selections(matrix):
    """The reference, through the same entry point and with nothing replaced, passes everything the mutants were run
    on, and every requirement they are expected to fail is checked and passes."""
    verdict = matrix[CONTROL.name]
    assert not verdict.harness_errors and verdict.exit_code in (0, 1), f"the control did not run:\n{_explain(verdict)}"
    unexpected = {r: v for r, v in verdict.verdicts.items()
                  if v in ("fail", "error") and r not in killmatrix.REFERENCE_FAILURES}
    assert not unexpected, f"the control failed {unexpected} (known: {sorted(killmatrix.REFERENCE_FAILURES)}):\n" \
                           f"{_explain(verdict)}"
    checked = {r for s in SUBJECTS if not s.known_gap for r in s.kills} - {HARNESS_ERROR} \
        - set(killmatrix.REFERENCE_FAILURES)
    assert all(verdict.verdicts.get(r) == "pass" for r in checked), \
        {r: verdict.verdicts.get(r) for r in checked if verdict.verdicts.get(r) != "pass"}
