"""The catalogue itself: ids, the requirements they protect, one injection per invariant, docs in sync."""

from __future__ import annotations

from pathlib import Path

import yaml

from spark_checks.catalogue import CATALOGUE, INJECTIONS, KINDS, catalogue_markdown

ROOT = Path(__file__).resolve().parents[2]


def test_ids_are_unique_and_each_invariant_has_one_injection():
    assert len({inv.id for inv in CATALOGUE}) == len(CATALOGUE)
    assert sorted(INJECTIONS.values()) == sorted(inv.id for inv in CATALOGUE)


def test_every_linked_requirement_exists():
    registry = yaml.safe_load((ROOT / "spec" / "requirements.yaml").read_text())
    known = {r["id"] for r in registry["requirements"]}
    for inv in CATALOGUE:
        assert set(inv.requirements) <= known, inv.id
        assert inv.requirements or inv.errata, f"{inv.id} protects nothing"
        assert set(inv.kinds) <= set(KINDS)


def test_the_readme_lists_the_catalogue_as_the_code_defines_it():
    assert catalogue_markdown() in (ROOT / "spark_checks" / "README.md").read_text()


def test_the_checks_derive_a_hook_reply_id_as_the_daemon_does():
    """TRC-HOOK-REPLY-ID's derivation (every engine's: catalogue, DuckDB SQL, Spark columns) is the core's."""
    from reference.core import reply_client_message_id
    from spark_checks.catalogue import hook_reply_id

    for message, hook in (("in-1", "on-message"), ("01JRW0000000000000000000001", "on-topic-a.b"), ("é~x", "on-dm")):
        assert hook_reply_id(message, hook) == reply_client_message_id(message, hook)
