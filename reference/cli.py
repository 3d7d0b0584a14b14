"""`meshd`: the spec tools, the reference daemon and the reference broker."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path

SPEC_TOOLS = {
    "check": "validate the whole spec (the CI gate)",
    "diff": "list breaking changes between two spec trees",
    "diagrams": "render the state tables as Mermaid diagrams",
    "model-check": "explore the formal model exhaustively",
    "vectors": "run every test vector against the core",
    "conformance-doc": "regenerate CONFORMANCE.md from the registry",
    "fingerprint": "print the canonical preimage and fingerprint of a send request",
}


def fingerprint_cli(argv: list[str]) -> int:
    """`meshd spec fingerprint [FILE] [--idempotency-key K] [--json]`: for SDK authors."""
    from reference.core import RequestError, canonical_preimage, meta_canonical, parse_send

    parser = argparse.ArgumentParser(
        prog="meshd spec fingerprint",
        description="Read a POST /v1/send body (JSON, from FILE or stdin) and print its canonical preimage and "
        "request fingerprint (§4.4).",
    )
    parser.add_argument("file", nargs="?", type=Path, help="the request body; stdin when omitted")
    parser.add_argument("--idempotency-key", help="the Idempotency-Key header, if the client sends one")
    parser.add_argument("--json", action="store_true", help="print {meta_canonical, canonical, fingerprint}")
    args = parser.parse_args(argv)
    raw = args.file.read_bytes() if args.file else sys.stdin.buffer.read()
    try:
        request = parse_send(raw, args.idempotency_key)
    except RequestError as exc:
        print(f"invalid request: {exc.code}: {exc.detail}", file=sys.stderr)
        return 1
    item = request.fingerprint_input()
    preimage = canonical_preimage(item)
    fingerprint = request.fingerprint().hex()
    if args.json:
        print(json.dumps({
            "meta_canonical": meta_canonical(item.meta).decode("utf-8"),
            "canonical": preimage.hex(),
            "fingerprint": fingerprint,
        }))
        return 0
    shown = preimage.decode("utf-8", errors="backslashreplace").replace("\x00", "\\x00")
    print(f"destination     {request.destination_kind}:{request.destination_ref}")
    print(f"preimage        {shown}")
    print(f"preimage (hex)  {preimage.hex()}")
    print(f"fingerprint     {fingerprint}")
    return 0


def spec_tool(name: str) -> Callable[[list[str]], int]:
    """The ``cli`` behind ``meshd spec <name>``; the tools that run the spec against a core are handed this one."""
    from reference import core
    from spec.tools import check, conformance_doc, diagrams, diff, model, vectors

    tools: dict[str, Callable[[list[str]], int]] = {
        "check": functools.partial(check.cli, core=core),
        "diff": diff.cli,
        "diagrams": diagrams.cli,
        "model-check": functools.partial(model.cli, core=core),
        "vectors": functools.partial(vectors.cli, core=core),
        "conformance-doc": conformance_doc.cli,
        "fingerprint": fingerprint_cli,
    }
    return tools[name]


def spec_main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print("usage: meshd spec <tool> [args]\n\ntools:")
        for name, summary in SPEC_TOOLS.items():
            print(f"  {name:<16} {summary}")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SPEC_TOOLS:
        print(f"meshd spec: unknown tool {name!r}; see `meshd spec --help`", file=sys.stderr)
        return 2
    return spec_tool(name)(rest)


def build_parser() -> argparse.ArgumentParser:
    from reference.broker.cli import add_commands as broker_commands
    from reference.daemon.cli import add_commands as daemon_commands
    from reference.sandbox import add_command as sandbox_command

    parser = argparse.ArgumentParser(prog="meshd", description="meshspec: the spec tools, the reference daemon "
                                     "and the reference broker for the claudemesh daemon protocol v0.9.0")
    parser.add_argument("--version", action="store_true", help="print the meshd version")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    sub.add_parser("spec", help="the specification tools: " + ", ".join(SPEC_TOOLS), add_help=False)
    daemon_commands(sub)
    broker_commands(sub)
    sandbox_command(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "spec":
        return spec_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from spec import SPEC_VERSION

        print(f"meshd (meshspec) {SPEC_VERSION}")
        return 0
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
