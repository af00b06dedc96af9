"""Entry point of the ``hetero`` command: one subcommand per module in ``hetero.commands``.

Each command module defines ``register(subparsers)`` which adds its parser and
sets ``func`` to a callable taking the parsed args and returning an exit code.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

# Subcommand modules, in --help order. A module that fails to import (an optional
# extra missing) only disables its own command.
COMMANDS = ("serve", "local", "launch", "synth", "prepare", "index", "bench", "plan", "prices", "submit", "sweep", "autoscale",
            "stats", "shutdown")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hetero", description="Data service for heterogeneous PyTorch training")
    parser.add_argument("--log-level", default=os.environ.get("HETERO_LOG_LEVEL", "INFO"))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"hetero.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("hetero.commands"):
                continue  # not written yet
            _register_missing(sub, name, exc.name or str(exc))
            continue
        module.register(sub)
    return parser


def _register_missing(sub, name: str, missing: str) -> None:
    """A command whose optional dependency is absent still shows, and says what to install."""
    p = sub.add_parser(name, help=f"(needs {missing}: pip install 'hetero-data-service[dev]')", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)

    def run(args) -> int:
        print(f"hetero {name}: needs the Python package {missing!r}; install it with "
              f"pip install 'hetero-data-service[dev]' (or [bench])")
        return 2

    p.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
