"""The ``zonemeter`` command line: the dispatcher over one module per verb.

Each verb lives in its own module, which exposes ``register(subparsers)``; that function
adds the verb's parser and sets ``func`` to a callable ``(args) -> int`` exit code. The
agent's verbs live here (``agent.cli.agent``, ``agent.cli.top``, ``agent.cli.report``, ...);
``lab`` and ``demo`` dispatch into ``tools/``.

Exit codes: 0 success, 1 runtime failure, 2 bad input (one line naming the file,
object and field), 130 interrupted (Ctrl-C), 141 standard output closed early (a pager or
``head`` quit: 128 + SIGPIPE, as a shell reports a command killed by SIGPIPE).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from agent.errors import InputError, ZonemeterError

#: verb modules, in the order ``--help`` lists them
VERB_MODULES: tuple[str, ...] = (
    "agent.cli.agent",
    "agent.cli.top",
    "agent.cli.explain",
    "agent.cli.whatif",
    "agent.cli.report",
    "tools.lab.cli",
    "tools.demo.cli",
)


class _Parser(argparse.ArgumentParser):
    """argparse that exits 2 with a single ``zonemeter: ...`` line on bad usage."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    """Return the top-level parser with every verb registered."""
    parser = _Parser(
        prog="zonemeter",
        description="Per-Service cross-zone traffic for Kubernetes: who sends the bytes your "
        "cloud bills, and whether topology-aware routing was in effect.",
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks on failure")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", parser_class=_Parser)
    for name in VERB_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the process exit code (0, 1 or 2; `explain` also 3: see agent.cli.explain)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args) or 0)
    except InputError as err:
        if args.debug:
            raise
        print(f"zonemeter: error: {err}", file=sys.stderr)
        return 2
    except ZonemeterError as err:
        if args.debug:
            raise
        print(f"zonemeter: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `zonemeter lab status | head`: the reader left; say nothing more, and keep the
        # interpreter's exit-time flush of stdout from raising (and printing) again
        if args.debug:
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141
