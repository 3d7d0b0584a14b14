"""Daemon lifecycle as a real process: identity, exit codes (E-15), negotiation (§15), limits (§3.4)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from daemon_testkit import FAST, peer_config

from conformance.launch import LaunchError
from conformance.peer import ScriptedBroker
from reference.core.codes import close_code, exit_code
from reference.daemon import guard
from spec import validator


def meshd(*args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "reference.cli", *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_first_start_writes_identity_files(daemon):
    """ID-HOST-FINGERPRINT, ID-KEYPAIR, AUTH-TOKEN-FILE."""
    fingerprint = json.loads((daemon.state_dir / "host_fingerprint.json").read_text())
    assert set(fingerprint) == {"schema_version", "fingerprint", "host_id", "stable_mac", "written_at"}
    assert len(fingerprint["fingerprint"]) == 64
    keypair = json.loads((daemon.state_dir / "keypair.json").read_text())
    with daemon.unix() as client:
        assert client.get("/v1/health").json()["member_pubkey"] == keypair["ed25519_pubkey"]
    for name in ("host_fingerprint.json", "keypair.json", "local_token"):
        assert stat.S_IMODE(os.stat(daemon.state_dir / name).st_mode) == 0o600, name


def test_host_mismatch_refuses_with_exit_4_until_accept_host(broker, make_daemon):
    """ID-MISMATCH-REFUSE, LIFE-EXIT-CODES (4)."""
    daemon = make_daemon(broker.url)
    pubkey = json.loads((daemon.state_dir / "keypair.json").read_text())["ed25519_pubkey"]
    daemon.stop()
    (daemon.state_dir / "config.toml").write_text(FAST + '\n[identity]\nhost_id_override = "linux:another-host"\n')
    with pytest.raises(LaunchError, match=f"exited with {exit_code('host_fingerprint_mismatch')}"):
        daemon.start()
    assert "host fingerprint mismatch" in daemon.tail()
    accepted = meshd("accept-host", "--state-dir", str(daemon.state_dir))
    assert accepted.returncode == 0, accepted.stderr
    daemon.start()
    assert json.loads((daemon.state_dir / "keypair.json").read_text())["ed25519_pubkey"] == pubkey


def test_second_daemon_in_one_state_dir_exits_6(daemon):
    """LIFE-SINGLETON."""
    result = meshd("up", "--state-dir", str(daemon.state_dir), "--broker-url", daemon.broker_url, "--no-tcp")
    assert result.returncode == exit_code("state_dir_locked")
    assert "another daemon" in result.stderr


def test_non_loopback_bind_is_refused_with_exit_3(tmp_path, broker):
    """AUTH-LOOPBACK, LIFE-EXIT-CODES (3)."""
    state = tmp_path / "s"
    state.mkdir()
    (state / "config.toml").write_text('[ipc]\nhttp_bind = "0.0.0.0"\n')
    result = meshd("up", "--state-dir", str(state), "--broker-url", broker.url)
    assert result.returncode == exit_code("invalid_config")
    assert "not loopback" in result.stderr
    (state / "config.toml").write_text("[ipc]\nno_such_key = 1\n")
    assert meshd("up", "--state-dir", str(state), "--broker-url", broker.url).returncode == exit_code("invalid_config")


def test_corrupt_outbox_refuses_with_exit_5(broker, make_daemon):
    """REC-OUTBOX-INTEGRITY, LIFE-EXIT-CODES (5)."""
    daemon = make_daemon(broker.url)
    daemon.stop()
    for suffix in ("-wal", "-shm"):
        (daemon.state_dir / f"outbox.db{suffix}").unlink(missing_ok=True)
    (daemon.state_dir / "outbox.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(LaunchError, match=f"exited with {exit_code('outbox_integrity_failed')}"):
        daemon.start()
    assert "outbox.db" in daemon.tail()


def test_corrupt_inbox_is_quarantined_and_the_daemon_starts(broker, make_daemon):
    """REC-INBOX-QUARANTINE."""
    daemon = make_daemon(broker.url)
    daemon.stop()
    for suffix in ("-wal", "-shm"):
        (daemon.state_dir / f"inbox.db{suffix}").unlink(missing_ok=True)
    (daemon.state_dir / "inbox.db").write_bytes(b"garbage" * 1000)
    daemon.start()
    assert list(daemon.state_dir.glob("inbox.db.corrupt-*"))
    assert "inbox_corruption_recovered" in daemon.tail(200)


@pytest.mark.parametrize(("params", "kind"), [
    ({"dedupe_retention_days": 2}, "feature_param_below_floor"),
    ({"request_fingerprint": False}, "feature_param_invalid"),
    (None, "feature_unavailable"),
])
def test_failed_negotiation_closes_4010_and_exits_10(make_daemon, params, kind):
    """NEG-CLOSE-4010, NEG-CLOSE-REASON-SHAPE, NEG-REQUIRE-DEDUPE, LIFE-EXIT-CODES (10)."""
    config = peer_config()
    if params is None:
        del config.supported["client_message_id_dedupe"]
    else:
        config.supported["client_message_id_dedupe"]["params"].update(params)
    with ScriptedBroker(config) as broker:
        daemon = make_daemon(broker.url, start=False)
        daemon.start(wait=False)
        closed = broker.wait_close(timeout=20)
        assert closed.code == close_code("feature_unavailable")
        assert len(closed.reason.encode()) <= 123
        reason = json.loads(closed.reason)
        assert (reason["kind"], reason["feature"]) == (kind, "client_message_id_dedupe")
        assert daemon.wait_exit(timeout=30) == exit_code("feature_negotiation_failed")
        assert not broker.received("send")


def test_negotiation_precedes_every_other_frame(broker, daemon):
    """NEG-ORDER: hello, then feature_negotiation_request, then anything else."""
    with daemon.unix() as client:
        client.post("/v1/send", json={"to": "#t", "message": "after negotiation"})
    broker.wait_frame("send")
    kinds = [f["type"] for f in broker.received()]
    assert kinds[:2] == ["hello", "feature_negotiation_request"]
    assert list(validator("broker/hello").iter_errors(broker.hellos[0])) == []


def test_sigterm_drains_and_exits_0(broker, make_daemon):
    """LIFE-DRAIN, LIFE-EXIT-CODES (0)."""
    daemon = make_daemon(broker.url)
    assert daemon.stop(timeout=20) == exit_code("ok")
    assert broker.wait_close().code == 1001


def test_oversized_send_is_413(daemon):
    """LIMIT-BODY."""
    with daemon.unix() as client:
        response = client.post("/v1/send", content=b'{"to":"#t","message":"' + b"x" * (1024 * 1024) + b'"}',
                               headers={"Content-Type": "application/json"})
    assert (response.status_code, response.json()["error"]) == (413, "payload_too_large")


BIG = b'{"to":"#t","message":"' + b"x" * (3 * 1024 * 1024) + b'"}'


@pytest.mark.parametrize("transport", ["unix", "tcp"])
def test_an_answer_given_before_the_body_is_read_reaches_the_client(daemon, transport):
    """LIMIT-BODY, ERR-PROBLEM-JSON, E-34: 413, 415 and 401 come back whole although a 3 MiB body was never read,
    and the connection stays usable. Before E-34 the server closed on the unread body and the client, still writing,
    could lose the answer (the CI run of 2026-11-22 saw RemoteProtocolError)."""
    expected = [(413, "payload_too_large", {"Content-Type": "application/json"}),
                (415, "unsupported_media_type", {"Content-Type": "text/plain"})]
    if transport == "tcp":
        expected.append((401, "invalid_bearer_token", {"Content-Type": "application/json",
                                                       "Authorization": "Bearer wrong"}))
    for _ in range(10):
        for status, error, headers in expected:
            with daemon.unix() if transport == "unix" else daemon.tcp() as client:
                response = client.post("/v1/send", content=BIG, headers=headers)
                assert (response.status_code, response.json()["error"]) == (status, error)
                assert client.get("/v1/health").status_code == 200  # the same connection, kept alive


def test_chunked_bodies_are_read_and_limited(daemon):
    """E-34: a chunked body (no Content-Length) is read through the server's reader and held to the same limit."""
    def chunks(payload: bytes):
        for start in range(0, len(payload), 4096):
            yield payload[start:start + 4096]

    with daemon.unix() as client:
        good = client.post("/v1/send", content=chunks(b'{"to":"#t","message":"chunked"}'),
                           headers={"Content-Type": "application/json"})
        assert good.status_code == 202, good.text
        assert good.request.headers.get("Transfer-Encoding") == "chunked"
        big = client.post("/v1/send", content=chunks(BIG), headers={"Content-Type": "application/json"})
        assert (big.status_code, big.json()["error"]) == (413, "payload_too_large")
        assert client.get("/v1/health").status_code == 200


def test_stream_cap_is_429(make_daemon, broker):
    """SSE-STREAM-LIMIT (cap lowered to 2 through config)."""
    daemon = make_daemon(broker.url, config=FAST + "\n[ipc]\nmax_streams = 2\n")
    with (daemon.unix() as a, daemon.unix() as b, daemon.unix() as c,
          a.stream("GET", "/v1/events") as first, b.stream("GET", "/v1/events") as second):
        assert first.status_code == second.status_code == 200
        third = c.get("/v1/events")
        assert (third.status_code, third.json()["error"]) == (429, "too_many_streams")


def test_inflight_cap_is_429(make_daemon):
    """LIMIT-INFLIGHT (cap lowered to 3): requests waiting on a silent broker fill it; streams do not count."""
    with ScriptedBroker(peer_config(answer_peers=False)) as broker:
        config = FAST + "\n[ipc]\nmax_inflight = 3\n[broker]\nrequest_timeout_s = 3.0\n"
        daemon = make_daemon(broker.url, config=config)
        daemon.wait_connected()
        barrier = threading.Barrier(3)

        def slow(_):
            with daemon.unix() as client:
                barrier.wait()
                return client.get("/v1/peers").status_code

        with ThreadPoolExecutor(3) as pool:
            waiting = [pool.submit(slow, i) for i in range(3)]
            broker.wait_frame("list_peers", 3)
            with daemon.unix() as client:
                busy = client.get("/v1/health")
            assert (busy.status_code, busy.json()["error"]) == (429, "daemon_busy")
            assert [f.result() for f in waiting] == [504, 504, 504]
        with daemon.unix() as client:
            assert client.get("/v1/health").status_code == 200


def test_peers_down_is_503(make_daemon, tmp_path):
    """API-PEERS: the link is down -> 503 broker_unavailable."""
    gone = ScriptedBroker()
    gone.start()
    url = gone.url
    gone.stop()
    daemon = make_daemon(url)
    with daemon.unix() as client:
        response = client.get("/v1/peers")
    assert (response.status_code, response.json()["error"]) == (503, "broker_unavailable")


def test_bearer_is_compared_in_constant_time(monkeypatch):
    """AUTH-CONSTANT-TIME: the guard's only token comparison is hmac.compare_digest."""
    calls = []
    real = guard.hmac.compare_digest
    monkeypatch.setattr(guard.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    gate = guard.Guard("secret-token", 4)
    with pytest.raises(guard.Problem):
        gate._check_bearer("Bearer wrong-token")
    gate._check_bearer("Bearer secret-token")
    assert calls == [(b"wrong-token", b"secret-token"), (b"secret-token", b"secret-token")]


@pytest.mark.parametrize(("host", "ok"), [
    (None, True), ("", True), ("localhost", True), ("LOCALHOST:8080", True), ("127.0.0.1:1", True),
    ("[::1]:47823", True), ("[::1]", True), ("127.5.5.5", False), ("127.0.0.2", False), ("[::ffff:127.0.0.1]", False),
    ("0.0.0.0", False), ("evil.example", False), ("localhost.evil", False), ("[::1]x", False), ("localhost:abc", False),
    ("[::1", False), ("10.0.0.1", False),
])
def test_host_header_rule(host, ok):
    assert guard.host_is_loopback(host) is ok


def test_status_and_version_commands(daemon):
    status = meshd("status", "--state-dir", str(daemon.state_dir), "--json")
    assert status.returncode == 0 and json.loads(status.stdout)["running"] is True
    version = json.loads(meshd("version", "--state-dir", str(daemon.state_dir), "--json").stdout)
    assert version["daemon"]["ipc_api"] == "v1"
    assert meshd("status", "--state-dir", str(daemon.state_dir.parent / "nothing")).returncode == exit_code("error")


def test_schema_version_counts_the_migrations_of_both_databases(daemon):
    """E-47: /v1/version and /v1/health answer the migrations applied to outbox.db and inbox.db together."""
    import sqlite3

    from reference.daemon.store import migrations

    applied = 0
    for name in ("outbox.db", "inbox.db"):
        with contextlib.closing(sqlite3.connect(daemon.state_dir / name)) as conn:
            applied += conn.execute("SELECT count(*) FROM schema_version").fetchone()[0]
    # inbox.db 3 is the hook runs (E-48)
    assert applied == migrations("outbox")[-1].version + migrations("inbox")[-1].version == 5
    with daemon.unix() as client:
        assert client.get("/v1/version").json()["schema_version"] == applied
        assert client.get("/v1/health").json()["schema_version"] == applied


def test_cli_send_and_outbox_requeue(broker, daemon):
    from conformance.peer import reject

    broker.answer("cli-1", reject(404, "destination_not_found"))
    sent = meshd("send", "--state-dir", str(daemon.state_dir), "--to", "#t", "--message", "hi", "--id", "cli-1")
    assert sent.returncode == 0, sent.stderr
    broker.wait_frame("send")
    with daemon.unix() as client:
        for _ in range(100):
            rows = client.get("/v1/outbox", params={"status": "dead"}).json()["items"]
            if rows:
                break
            threading.Event().wait(0.05)
    listed = json.loads(meshd("outbox", "list", "--failed", "--json", "--state-dir", str(daemon.state_dir)).stdout)
    assert [r["client_message_id"] for r in listed] == ["cli-1"]
    requeued = meshd("outbox", "requeue", listed[0]["id"], "--new-client-id", "cli-2", "--json",
                     "--state-dir", str(daemon.state_dir))
    assert requeued.returncode == 0, requeued.stderr
    assert json.loads(requeued.stdout)["new_client_message_id"] == "cli-2"
    again = meshd("outbox", "requeue", listed[0]["id"], "--state-dir", str(daemon.state_dir))
    assert again.returncode == exit_code("error") and "outbox_requeue_state_invalid" in again.stderr


def test_install_service_dry_run_and_ci_refusal(tmp_path):
    unit = meshd("install-service", "--kind", "systemd", "--dry-run", "--state-dir", str(tmp_path))
    assert unit.returncode == 0
    for line in ("NoNewPrivileges=true", "ProtectSystem=strict", f"ReadWritePaths={tmp_path}",
                 "RestartPreventExitStatus=3 4 5 10"):
        assert line in unit.stdout
    plist = meshd("install-service", "--kind", "launchd", "--dry-run", "--state-dir", str(tmp_path))
    assert "<key>KeepAlive</key>" in plist.stdout
    env = {**os.environ, "CI": "true", "HOME": str(tmp_path)}
    refused = subprocess.run([sys.executable, "-m", "reference.cli", "install-service", "--no-start"],
                             capture_output=True, text=True, env=env, check=False)
    assert refused.returncode == exit_code("usage") and "CI" in refused.stderr
    forced = subprocess.run([sys.executable, "-m", "reference.cli", "install-service", "--no-start", "--force"],
                            capture_output=True, text=True, env=env, check=False)
    assert forced.returncode == 0
    assert (tmp_path / ".config" / "systemd" / "user" / "meshd.service").exists()


def test_tcp_client_reads_the_port_file(daemon):
    port = int((daemon.state_dir / "http.port").read_text())
    assert port == daemon.port
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", verify=False) as client:
        assert client.get("/v1/version").status_code == 401


def test_every_log_line_is_one_json_object(broker, make_daemon):
    """The daemon's stderr, its own records and gunicorn's, is JSON lines with ts, level, logger and msg -- also for
    a message with quotes and a broker that goes away (it once wrote Python reprs: single quotes, not JSON)."""
    daemon = make_daemon(broker.url)
    with daemon.unix() as client:
        assert client.post("/v1/send", json={"to": "#t", "message": 'say "hi"'}).status_code == 202
    first = broker.wait_connected()
    broker.drop(1011, "going away")
    broker.wait_for(lambda: broker.wait_connected() > first, timeout=15, what="the reconnect")
    daemon.stop()
    lines = [line for line in daemon.log_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    assert all(set(r) >= {"ts", "level", "logger", "msg"} for r in records)
    assert {"meshd", "meshd.link", "gunicorn.error"} <= {r["logger"] for r in records}
    assert any(r["level"] == "WARNING" and r["logger"] == "meshd.link" for r in records)


def test_sighup_rereads_the_log_level_and_keeps_the_worker(broker, make_daemon):
    """config daemon.log_level: SIGHUP re-reads it in the master and the worker. The worker, the broker connection
    and the accepted rows stay as they are (gunicorn's own SIGHUP would boot a second worker, with its own broker
    link, before the first had gone); a configuration that no longer loads keeps the running level."""
    daemon = make_daemon(broker.url)
    connection = broker.wait_connected()
    with daemon.unix() as client:
        assert client.post("/v1/send", json={"to": "#t", "message": "before"}).status_code == 202
    config = daemon.state_dir / "config.toml"
    config.write_text(FAST.replace("[daemon]\n", '[daemon]\nlog_level = "DEBUG"\n'))

    def logged(text: str) -> int:
        return daemon.log_path.read_text().count(text)

    os.kill(daemon.process.pid, signal.SIGHUP)
    broker.wait_for(lambda: logged("sighup: log_level=DEBUG") == 2, timeout=10, what="master and worker re-read")
    broker.drop(1011, "reconnect to log at DEBUG")
    broker.wait_for(lambda: broker.wait_connected() > connection, timeout=15, what="the reconnect")
    broker.wait_for(lambda: logged("feature_negotiation_response"), timeout=10, what="a DEBUG record")
    config.write_text("[daemon\n")  # no longer TOML
    os.kill(daemon.process.pid, signal.SIGHUP)
    broker.wait_for(lambda: logged("configuration not re-read") == 2, timeout=10, what="both to keep their level")
    assert logged("Booting worker") == 1 and logged("Hang up") == 0
    with daemon.unix() as client:
        assert client.get("/v1/health").json()["connected"]
        assert len(client.get("/v1/outbox").json()["items"]) == 1
