"""The `dradriver` command line.

Each public module in this package is one subcommand, named after the module (`dry_run` is
`dry-run`), and provides `COMMAND` (a `Command`: its help), `add_flags(parser)` and `run` (a
callable taking the parsed args and returning the exit code). Subcommands import their heavy
dependencies inside `run`, so that `dradriver serve` and `dradriver --help` stay fast: every
command's module is loaded to build the parser (0.05-0.1 s), and what all the commands' `run`s
import would add 1.25 s to each (measured on 2 cores).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from dradriver import __version__, logs
from dradriver.cli._common import CLIError, Parser, add_command, print_error
from dradriver.signals import defer_stop_signals


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="dradriver",
        description="Kubernetes DRA kubelet plugin for NVIDIA GPUs, and tools that explain it.",
    )
    parser.add_argument("--version", action="version", version=f"dradriver {__version__}")
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", parser_class=Parser)
    for module_info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not module_info.name.startswith("_"):
            module = importlib.import_module(f"{__name__}.{module_info.name}")
            name = module_info.name.replace("_", "-")
            module.add_flags(add_command(subparsers, name, module.COMMAND, module.run))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["serve"]:
        defer_stop_signals()  # a SIGTERM during start-up still ends in a clean exit 0
    parser = build_parser()
    args = parser.parse_args(args_list)
    if not hasattr(args, "run"):
        parser.print_help(sys.stderr)
        return 2
    try:
        if not args.defer_logging:
            logs.configure(args.log_format, args.verbosity)
        code: int = args.run(args)
    except CLIError as err:
        if args.log_format == "json":  # JSON from the first line to the last
            logs.configure("json", args.verbosity)
            logs.get_logger(component="cli").error(str(err), command=args.prog)
        else:
            print_error(args.prog, str(err))
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # e.g. `dradriver slices | head`
        return 0
    return code
