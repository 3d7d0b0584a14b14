"""``python -m tests.conformance.mutants NAME [meshd arguments]``: run the reference daemon with mutant NAME applied.

NAME ``reference`` applies nothing (the control). The patch is applied in this process before ``meshd`` parses its
arguments, so the gunicorn worker forked from it inherits the deviation.
"""

from __future__ import annotations

import sys

from . import MUTANTS, UNDETECTABLE, Patcher


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\nmutants:\n" + "\n".join(f"  {m.name:<32} {m.description}"
                                                             for m in {**MUTANTS, **UNDETECTABLE}.values()))
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name != "reference":
        entry = MUTANTS.get(name) or UNDETECTABLE.get(name)
        if entry is None or entry.apply is None:
            print(f"tests.conformance.mutants: unknown mutant {name!r}", file=sys.stderr)
            return 2
        entry.apply(Patcher())
    from reference.cli import main as meshd

    return meshd(rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
