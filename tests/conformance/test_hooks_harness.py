"""The harness's hook machinery (conformance/hooks.py): the {hooks_dir} placeholder, the hooks.toml and scripts it
installs (in the format the spec's schema and the reference accept), the [hooks] table of the config.toml it writes,
and when the hook cases run -- skipped, never failed, for a daemon that declares no hooks or cannot be given any."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest

from conformance import hooks as hk
from conformance import registry
from conformance.launch import REFERENCE_TEMPLATE, Launched, check_template
from conformance.peer import ScriptedBroker
from conformance.target import HARNESS_CONFIG, Target
from reference.daemon.hooks import load_hooks
from spec import SPEC_DIR, validator

REPO = SPEC_DIR.parent
HOOK_CASES = {c.id for c in registry.cases() if c.module == "test_hooks"}


def meshconform(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "conformance.cli", *args], capture_output=True, text=True,
                          timeout=600, check=False, cwd=REPO)


def test_hooks_dir_is_a_placeholder_beside_the_state_and_in_the_environment(tmp_path):
    check_template("daemon --hooks {hooks_dir} --state {state_dir}")
    instance = Launched(f"{sys.executable} -c pass", tmp_path / "one", "ws://127.0.0.1:9")
    values = instance.values()
    assert values["hooks_dir"] == str(tmp_path / "one.hooks") == str(instance.hooks_dir)
    assert not instance.hooks_dir.is_relative_to(instance.state_dir)
    show = "import os; print(os.environ['MESHCONFORM_HOOKS_DIR'], '{hooks_dir}')"
    printer = Launched(f"{sys.executable} -c \"{show}\"", tmp_path / "two", "ws://127.0.0.1:9").start(wait=False)
    printer.process.wait(30)
    assert printer.log_path.read_text().split() == [str(printer.hooks_dir)] * 2
    assert tomllib.loads((printer.hooks_dir / hk.HOOKS_FILE).read_text()) == {}  # no hooks: valid and empty


def test_installed_hooks_are_what_the_schema_and_the_reference_accept(tmp_path):
    out = tmp_path / "observed"
    hooks = [hk.python_hook("on-topic-mc-a", "record({})", out, {"allow_reply": True, "timeout_s": 1.5,
                                                                 "output_size_limit": 1024}),
             hk.python_hook("on-dm", "pass", out, {"capability_token_scope": ["reply:event",
                                                                              "dm:send:<sender_pubkey>"],
                                                   "network_policy": "deny"}, SENDS=[("a", {"to": "x"})])]
    folder = tmp_path / "hooks"
    hk.install_hooks(folder, hooks)
    document = tomllib.loads((folder / hk.HOOKS_FILE).read_text())
    assert not list(validator("config/hooks").iter_errors(document))
    assert document["on-dm"]["capability_token_scope"] == ["reply:event", "dm:send:<sender_pubkey>"]
    loaded = {hook.name: hook for hook in load_hooks(folder, 30.0)}
    assert loaded["on-topic-mc-a"].timeout_s == 1.5 and loaded["on-topic-mc-a"].allow_reply
    assert loaded["on-topic-mc-a"].output_limit == 1024
    for hook in hooks:
        script = folder / hook.name
        assert os.access(script, os.X_OK) and script.read_text().startswith(f"#!{sys.executable}\n")
        compile(script.read_text(), str(script), "exec")


def test_a_harness_hook_records_what_it_saw(tmp_path):
    """A hook run by hand as a daemon would run it (bare environment, the event on stdin) records its observation."""
    out = tmp_path / "observed"
    out.mkdir()
    hook = hk.python_hook("on-message", "raw, parsed = read_event()\nrecord(observe(raw, parsed))\nreply('hi')", out)
    hk.install_hooks(tmp_path / "hooks", [hook])
    done = subprocess.run([str(tmp_path / "hooks" / "on-message")], input=b'{"_truncated": true, "x": "mc-1"}',
                          env={"PATH": "/usr/bin:/bin", "CLAUDEMESH_HOOK_NAME": "on-message"}, capture_output=True,
                          timeout=30, check=True)
    assert json.loads(done.stdout) == {"reply": "hi"}
    [seen] = hk.observations(out, "on-message")
    assert seen["truncated"] is True and "mc-1" in seen["stdin_head"] and seen["stdin_bytes"] == 33
    assert seen["env"] == {"PATH": "/usr/bin:/bin", "CLAUDEMESH_HOOK_NAME": "on-message"}
    assert seen["pid"] == seen["pgid"] or seen["pid"] > 0


def test_the_config_toml_gets_one_hooks_table_naming_the_folder(tmp_path):
    written = hk.with_hooks(HARNESS_CONFIG, tmp_path / "x.hooks")
    assert tomllib.loads(written)["hooks"] == {"enabled": True, "dir": str(tmp_path / "x.hooks")}
    assert hk.with_hooks(written, tmp_path / "other") == written
    own = "[hooks]\nenabled = false\n"
    assert hk.with_hooks(own, tmp_path / "x") == own


@pytest.mark.parametrize(("declared", "can_restart", "installs", "reason"), [
    (None, True, True, hk.NO_HOOKS),
    (["send", "inbox"], True, True, hk.NO_HOOKS),
    (["send"], False, False, hk.NO_HOOKS),  # no hooks declared: that reason first, whatever else is missing
    (["send", "hooks"], False, True, hk.NO_LAUNCH),
    (["send", "hooks"], True, False, hk.NO_INSTALL),
    (["send", "hooks"], True, True, None),
])
def test_hook_cases_run_only_for_a_daemon_that_declares_hooks_and_can_be_given_them(declared, can_restart, installs,
                                                                                    reason):
    assert hk.skip_reason(declared, can_restart, installs) == reason
    assert hk.features({"ipc_features": declared}) == declared


def test_which_targets_the_harness_can_install_hooks_in():
    assert Target("reference").installs_hooks is False  # no template until it starts: then its config.toml
    assert Target("launch", template="impl --hooks {hooks_dir}").installs_hooks
    assert not Target("launch", template="impl --state {state_dir}").installs_hooks
    assert not Target("unix:///x.sock").installs_hooks


def test_a_daemon_without_hooks_gets_every_hook_case_skipped(tmp_path):
    """The reference with hooks off (its own config.toml, without the harness's [hooks] table): every hook case is
    skipped with the reason, none fails, and the run passes."""
    plain = tmp_path / "plain.toml"
    plain.write_text(HARNESS_CONFIG)
    result = meshconform("run", "--launch", f"{REFERENCE_TEMPLATE} --config {plain}", "--select", "hooks.",
                         "--report-dir", str(tmp_path / "r"), "--quiet")
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    outcomes = {c["id"]: (c["outcome"], c["detail"]) for c in report["cases"]}
    assert set(outcomes) == HOOK_CASES
    assert set(outcomes.values()) == {("skipped", hk.NO_HOOKS)}
    hooks = [r for r in report["requirements"] if r["id"].startswith("HOOK-") and r["verdict"] != "not_checked"]
    assert hooks and {r["verdict"] for r in hooks} == {"skip"}
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_running_daemon_with_hooks_gets_them_skipped_without_a_launch_template(tmp_path):
    """A daemon that declares hooks but was not launched by the harness: the harness cannot install a hook in it."""
    with ScriptedBroker() as elsewhere:
        state = tmp_path / "d"
        state.mkdir()
        (state / "config.toml").write_text("[hooks]\nenabled = true\n")
        hk.install_hooks(state / "hooks", ())
        daemon = Launched(REFERENCE_TEMPLATE, state, elsewhere.url).start()
        try:
            result = meshconform("run", "--target", f"unix://{daemon.socket_path}", "--select", "hooks.",
                                 "--report-dir", str(tmp_path / "r"), "--quiet")
        finally:
            daemon.stop()
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert {(c["outcome"], c["detail"]) for c in report["cases"]} == {("skipped", hk.NO_LAUNCH)}
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow
def test_the_reference_passes_every_hook_case(tmp_path):
    result = meshconform("run", "--target", "reference", "--select", "hooks.", "--report-dir", str(tmp_path),
                         "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert {(c["id"], c["outcome"]) for c in report["cases"]} == {(c, "passed") for c in HOOK_CASES}
