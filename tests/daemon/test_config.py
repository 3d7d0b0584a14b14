"""config.toml: defaults, type checks, unknown keys, and the README's table generated from the same data."""

from __future__ import annotations

import subprocess
import sys

import pytest

from reference.core.codes import exit_code
from reference.daemon.config import KEYS, ConfigError, load, markdown_table
from spec import SPEC_DIR, load_table


def test_defaults_load(tmp_path):
    config = load(tmp_path / "missing.toml")
    assert config["outbox"]["synchronous"] == "FULL"
    assert config["ipc"]["http_bind"] == "127.0.0.1"


@pytest.mark.parametrize("text", [
    "[nope]\nx = 1\n", "[ipc]\nnope = 1\n", "[ipc]\nhttp_port = 'x'\n", "[ipc]\ntcp_enabled = 1\n",
    "[ipc]\nhttp_port = true\n", "[outbox]\nsynchronous = 'OFF'\n", "[ipc]\nthreads = 10\n", "not toml [",
    "[daemon]\nlog_level = 'LOUD'\n", "[ipc]\nmax_inflight = 0\n", "[ipc]\nmax_connections = 0\n",
    "[ipc]\nheader_read_s = 0\n", "[ipc]\nbody_read_s = -1\n", "[ipc]\nwrite_s = 601\n",
])
def test_bad_configuration_is_refused(tmp_path, text):
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load(path)


@pytest.mark.parametrize(("text", "message"), [
    ('[features]\nrequire = ["concurrent_connection_policy"]\n',
     "features.require must include client_message_id_dedupe: the daemon does not run without it (§15.1)"),
    ("[features]\nrequire = []\n",
     "features.require must include client_message_id_dedupe: the daemon does not run without it (§15.1)"),
    ('[features]\nrequire = ["client_message_id_dedupe", "no_such_bit"]\n',
     "features.require names unknown feature bits: no_such_bit"),
    ('[features]\noptional = ["max_payload", "no_such_bit"]\n',
     "features.optional names unknown feature bits: no_such_bit"),
    ('[features]\nrequire = ["client_message_id_dedupe", 1]\n',
     "features.require must be a list of feature bit names"),
])
def test_feature_lists_are_checked(tmp_path, text, message):
    """NEG-REQUIRE-DEDUPE: no configuration runs a daemon that does not require client_message_id_dedupe."""
    path = tmp_path / "config.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as refused:
        load(path)
    assert str(refused.value) == message


def test_a_require_list_without_dedupe_exits_invalid_config(tmp_path):
    """NEG-REQUIRE-DEDUPE, LIFE-EXIT-CODES (3): meshd up refuses it before it touches the state directory."""
    (tmp_path / "config.toml").write_text('[features]\nrequire = ["concurrent_connection_policy"]\n')
    result = subprocess.run([sys.executable, "-m", "reference.cli", "up", "--state-dir", str(tmp_path),
                             "--broker-url", "ws://127.0.0.1:9"], capture_output=True, text=True, timeout=60,
                            check=False)
    assert result.returncode == exit_code("invalid_config")
    assert result.stderr.strip() == ("meshd: invalid configuration: features.require must include "
                                     "client_message_id_dedupe: the daemon does not run without it (§15.1)")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.toml"]


def test_feature_defaults_are_the_tables():
    defaults = load_table("features")["daemon_defaults"]
    assert KEYS["features"]["require"][0] == defaults["require"]
    assert KEYS["features"]["optional"][0] == defaults["optional"]


def test_overrides_win(tmp_path):
    path = tmp_path / "config.toml"
    path.write_text("[ipc]\nhttp_port = 5000\n")
    assert load(path, {"ipc": {"http_port": 6000}})["ipc"]["http_port"] == 6000


def test_readme_table_is_current():
    readme = (SPEC_DIR.parent / "README.md").read_text()
    block = readme.split("<!-- BEGIN GENERATED: config -->\n", 1)[1].split("\n<!-- END GENERATED: config -->")[0]
    assert block == markdown_table(), "regenerate it: python -m reference.daemon.config"
    assert all(f"`{section}.{key}`" in block for section, keys in KEYS.items() for key in keys)


def test_readme_table_documents_every_limit():
    """E-40: every limit of spec/tables/limits.yaml a daemon or broker enforces is in the table, as the config key
    that sets it or as a fixed limit, with the value the daemon uses; the trace checks' own (E-52) are not."""
    from reference.core.limits import limits

    block = markdown_table()
    table = load_table("limits")["limits"]
    for name, entry in table.items():
        if entry["applies_to"] == ["trace_check"]:
            assert f"`limits.{name}`" not in block, name
            continue
        if "config" in entry:
            section, key = entry["config"].split(".")
            assert f"`{entry['config']}` | `{limits()[name]!r}`" in block, name
            assert KEYS[section][key][0] == limits()[name], name
        else:
            assert f"`limits.{name}` | `{limits()[name]!r}`" in block, name
