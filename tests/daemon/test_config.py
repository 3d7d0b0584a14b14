"""config.toml: defaults, type checks, unknown keys, and the README's table generated from the same data."""

from __future__ import annotations

import pytest

from reference.daemon.config import KEYS, ConfigError, load, markdown_table
from spec import SPEC_DIR


def test_defaults_load(tmp_path):
    config = load(tmp_path / "missing.toml")
    assert config["outbox"]["synchronous"] == "FULL"
    assert config["ipc"]["http_bind"] == "127.0.0.1"


@pytest.mark.parametrize("text", [
    "[nope]\nx = 1\n", "[ipc]\nnope = 1\n", "[ipc]\nhttp_port = 'x'\n", "[ipc]\ntcp_enabled = 1\n",
    "[ipc]\nhttp_port = true\n", "[outbox]\nsynchronous = 'OFF'\n", "[ipc]\nthreads = 10\n", "not toml [",
    "[daemon]\nlog_level = 'LOUD'\n", "[ipc]\nmax_inflight = 0\n",
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
    assert block == markdown_table(), "regenerate the README's configuration table from reference/daemon/config.py"
    assert all(f"`{section}.{key}`" in block for section, keys in KEYS.items() for key in keys)
