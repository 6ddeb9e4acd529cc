"""The ``kame`` console script: one entry point, one module per sub-command.

Each module in :mod:`kame.commands` exposes ``NAME``, ``HELP``,
``add_arguments(parser)`` and ``run(args) -> int``. Every sub-command accepts
``--config``. Errors a user can fix (bad config, missing model) print one
line and exit 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from kame.config import ConfigError
from kame.errors import UserError

#: Sub-command modules under kame.commands, in --help order.
COMMANDS = (
    "serve",
    "run",
    "transcribe",
    "mic",
    "eval",
    "download",
    "plan",
    "make_tiny_checkpoint",
    "config",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kame", description="KAME tandem voice assistant server.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod_name in COMMANDS:
        try:
            mod = importlib.import_module(f"kame.commands.{mod_name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"kame.commands.{mod_name}":
                continue  # not written yet
            raise
        p = sub.add_parser(mod.NAME, help=mod.HELP, description=mod.HELP)
        p.add_argument("--config", default=None, help="YAML config file or built-in name (default, cpu-demo).")
        mod.add_arguments(p)
        p.set_defaults(_run=mod.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "_run", None):
        parser.print_help()
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args._run(args) or 0)
    except (ConfigError, UserError) as exc:
        print(f"kame {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyError as exc:  # kame.backend.errors.UnknownBackend: a back-end name that is not configured
        if type(exc).__name__ != "UnknownBackend":
            raise
        print(f"kame {args.command}: error: {exc.args[0] if exc.args else exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
