"""config.toml: defaults, type checks, unknown keys, and the README's table generated from the same data."""

from __future__ import annotations

import pytest

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
    """E-40: every limit of spec/tables/limits.yaml is in the table, as the config key that sets it or as a fixed
    limit, with the value the daemon uses."""
    from reference.core.limits import limits

    block = markdown_table()
    table = load_table("limits")["limits"]
    for name, entry in table.items():
        if "config" in entry:
            section, key = entry["config"].split(".")
            assert f"`{entry['config']}` | `{limits()[name]!r}`" in block, name
            assert KEYS[section][key][0] == limits()[name], name
        else:
            assert f"`limits.{name}` | `{limits()[name]!r}`" in block, name
