"""Command line: `toolscout index | search | eval | train | learn | expand | generate | demo | serve | migrate`
(scripts depend on these flags: keep them stable). One module per group of commands, each adding its parsers
(`add_parsers`) with the function that runs them as the parser's `handler`.

Environment variables are read here, in the CLI, once, and passed down as arguments.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from ..errors import ToolScoutError

# modules whose commands `toolscout --help` lists, in this order
COMMAND_MODULES = ("catalog", "evaluate", "training", "learn", "expand", "generate", "serve", "gateway", "pg_store")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="toolscout", description="Pick the right tools for an LLM agent.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:  # each module imports only argparse-level code until its command runs
        importlib.import_module(f"{__name__}.{name}").add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from ..version import __version__

        print(__version__)
        return 0
    if not args.command:
        parser.print_help()
        return 2
    try:
        with warnings_as_lines():
            return args.handler(args) or 0
    except BrokenPipeError:  # the reader went away (`| head`): what it read is all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush has nowhere to fail
        return 141  # what a shell reports for a command its pipe's reader closed on (128 + SIGPIPE)
    except (ToolScoutError, ValueError, KeyError, FileNotFoundError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"toolscout {args.command}: error: {_tier_flag(args, exc)}{message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"toolscout {args.command}: interrupted", file=sys.stderr)
        return 130


PACKAGE = Path(__file__).resolve().parents[1]


def _tier_flag(args: argparse.Namespace, exc: BaseException) -> str:
    """"--student-queries: " (or --fast-queries) before an error that the fast tier asked for cannot serve
    this pipeline, naming the flag the user gave; "" for any other error."""
    from ..errors import FastQueriesUnavailable
    from .options import FAST_QUERY_FLAGS

    tier = getattr(args, "fast_queries", None)
    return f"{FAST_QUERY_FLAGS[tier]}: " if isinstance(exc, FastQueriesUnavailable) and tier else ""


@contextmanager
def warnings_as_lines() -> Iterator[None]:
    """Within the block, a warning toolscout's own code gives (an LLM reranker that failed, a refiner
    without its vectors) prints as one `warning: ...` line on stderr, as the CLI's other warnings do; a
    library's keeps Python's form, whose file and line help whoever looks into it."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if not Path(filename).resolve().is_relative_to(PACKAGE):
            return shown(message, category, filename, lineno, file, line)
        print(f"warning: {message}", file=file or sys.stderr)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
