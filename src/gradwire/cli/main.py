"""`gradwire` command line: one sub-command per module in this package.

Each command module exposes ``add_parser(subparsers)`` which registers its own
parser and sets ``func`` to the function that runs it. Heavy imports (torch)
happen inside those functions, so ``gradwire --version`` stays instant.

Exit codes: 0 done; 1 the work ran and something failed (wrong data, a failed
check, a file that could not be written); 2 bad input, refused before any work
with one line ``gradwire <command>: error: ...`` (argparse's convention);
130 interrupted (Ctrl-C). No traceback for any of these.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

#: command modules, in the order `gradwire --help` lists them
COMMAND_MODULES: tuple[str, ...] = (
    "gradwire.cli.compare",
    "gradwire.cli.bench",
    "gradwire.cli.profile",
    "gradwire.cli.predict",
    "gradwire.cli.doctor",
    "gradwire.cli.net",
    "gradwire.cli.demo",
    "gradwire.cli.emulate",
)


def build_parser() -> argparse.ArgumentParser:
    from gradwire import __version__

    from gradwire.cli._args import Parser

    parser = Parser(
        prog="gradwire",
        description="Simulate, measure and cut the cost of the network in PyTorch distributed training.",
    )
    parser.add_argument("--version", action="version", version=f"gradwire {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a refused argument (its one line is printed)
        return exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    from gradwire.cli._args import fail

    try:
        return int(args.func(args) or 0)
    except ValueError as exc:  # bad input: say what was wrong, no traceback
        return fail(args.command, exc)
    except OSError as exc:  # the machine refused (a file, a port, a timeout): one line too
        return fail(args.command, exc, code=1)
    except KeyboardInterrupt:
        print(f"gradwire {args.command}: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
