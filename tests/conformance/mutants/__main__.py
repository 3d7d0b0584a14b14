"""``python -m tests.conformance.mutants NAME [--target-file F] up [meshd up arguments]``: run mutant NAME.

The reference daemon's own ``cmd_up`` runs with ``Components`` carrying the mutant's one replacement (NAME
``reference``: nothing replaced, the control). With ``--target-file`` it first writes the launch description
(spec/schemas/harness/target.json) the reference would deserve: it reads the harness's config.toml and honours the
clock hook, so the harness times it from that file exactly as it times ``--target reference``. Run it from the
repository root (the kill matrix does), so ``tests`` is importable.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from . import MUTANTS, UNDETECTABLE, Mutant


def describe(path: Path, name: str) -> None:
    document = {"name": f"meshspec reference daemon, mutant {name}", "config_toml": True, "clock_hook": True}
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(document), encoding="utf-8")
    os.replace(partial, path)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        listing = "\n".join(f"  {m.name:<36} [{m.seam}] {m.description}" for m in {**MUTANTS, **UNDETECTABLE}.values())
        print(__doc__.strip() + "\n\nmutants:\n" + listing)
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if rest[:1] == ["--target-file"] and len(rest) >= 2:
        target_file, rest = Path(rest[1]), rest[2:]
    else:
        target_file = None
    if rest[:1] != ["up"]:
        print("tests.conformance.mutants: only `up` is supported", file=sys.stderr)
        return 2
    entry = Mutant("reference", "the control", ()) if name == "reference" else (MUTANTS | UNDETECTABLE).get(name)
    if entry is None:
        print(f"tests.conformance.mutants: unknown mutant {name!r}", file=sys.stderr)
        return 2
    from reference.cli import build_parser
    from reference.daemon.cli import cmd_up

    args = build_parser().parse_args(rest)
    if target_file is not None:
        describe(target_file, name)
    return cmd_up(args, components=entry.components())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
