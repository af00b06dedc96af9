"""Entry point of the ``hetero`` command: one subcommand per module in ``hetero.commands``.

Each command module defines ``register(subparsers)`` which adds its parser and
sets ``func`` to a callable taking the parsed args and returning an exit code.

Errors reach the user as one line on stderr, ``hetero COMMAND: message`` (the message names the
value and the fix), never as a traceback: a command raises the product's errors (``ConfigError``
and the other ``DataServiceError``\\ s), an ``OSError`` or a ``hetero.console.CommandError``, and ``main`` says
them. ``--debug`` (or ``HETERO_DEBUG=1``) shows the traceback instead.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from hetero.console import CommandError

# Subcommand modules, in --help order. A module that fails to import (an optional
# extra missing) only disables its own command.
COMMANDS = ("serve", "local", "launch", "synth", "prepare", "index", "bench", "plan", "prices", "submit", "sweep", "autoscale",
            "stats", "shutdown")
DEBUG_ENV = "HETERO_DEBUG"


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose error is one line (the option, the bad value, where the help is)
    instead of the whole usage, which for most commands is a screenful."""

    def error(self, message: str):  # NoReturn, as argparse's
        self.exit(2, f"{self.prog}: {message}; see {self.prog} --help\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="hetero", description="Data service for heterogeneous PyTorch training")
    parser.add_argument("--log-level", default=os.environ.get("HETERO_LOG_LEVEL", "INFO"),
                        help="log level of this process and the nodes it starts (default: $HETERO_LOG_LEVEL or INFO)")
    parser.add_argument("--debug", action="store_true",
                        help=f"show the traceback behind an error (also: {DEBUG_ENV}=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"hetero.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("hetero"):
                raise  # a module of this package that does not import is a bug to see, not a command to hide
            _register_missing(sub, name, exc.name or str(exc))
            continue
        module.register(sub)
    for command in sub.choices.values():  # `hetero serve --debug ...` as well as `hetero --debug serve ...`
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help=f"show the traceback behind an error (also: {DEBUG_ENV}=1)")
    return parser


def _register_missing(sub, name: str, missing: str) -> None:
    """A command whose optional dependency is absent still shows, and says what to install."""
    p = sub.add_parser(name, help=f"(needs {missing}: pip install -e '.[dev]' in the checkout)", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)

    def run(args) -> int:
        raise CommandError(f"needs the Python package {missing!r}; install it with "
                           "bash scripts/setup.sh dev (or .venv/bin/pip install -e '.[dev]') in the checkout", 2)

    p.set_defaults(func=run)


def _importable_here() -> None:
    """Plug-ins named on the command line (``mypkg.data:build_pipeline``) import from the current
    folder, as with ``python -m``: put it first on the path of this process and of every process
    it starts (data workers, the nodes of ``hetero local``)."""
    here = os.getcwd()
    if here not in sys.path:
        sys.path.insert(0, here)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if here not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *parts])


def one_line(exc: BaseException, max_lines: int = 4) -> str:
    """The message of ``exc`` as the user sees it: its text up to a traceback it carries (a data
    worker's stays behind ``--debug``), at most ``max_lines`` lines; its type when it has no text."""
    text = str(exc).strip()
    for marker in ("--- original traceback", "Traceback (most recent call last)"):
        text = text.split(marker)[0].rstrip()
    if not text:
        return type(exc).__name__
    return "\n".join(text.splitlines()[:max_lines])


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
    except KeyboardInterrupt:  # Ctrl-C while the commands load
        print("hetero: interrupted", file=sys.stderr)
        return 130
    args = parser.parse_args(argv)
    debug = bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    _importable_here()
    if not debug:
        os.environ.setdefault("GRPC_VERBOSITY", "NONE")  # gRPC's own log lines repeat what the error says
    who = f"hetero {args.command}"
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `hetero stats ... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing more to flush at exit
        return 141
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"{who}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001: every error ends as one line, unless --debug asks for more
        if debug:
            raise
        print(f"{who}: {describe(exc)}", file=sys.stderr)
        return exit_code(exc)


def describe(exc: Exception) -> str:
    """One line for any error a command lets through."""
    from data_service.errors import DataServiceError

    if isinstance(exc, (CommandError, DataServiceError)):
        return one_line(exc)
    if isinstance(exc, OSError):
        where = f": {exc.filename}" if getattr(exc, "filename", None) and str(exc.filename) not in str(exc) else ""
        return one_line(exc) + where
    grpc_code = getattr(exc, "code", None)
    if callable(grpc_code) and hasattr(exc, "details"):  # a gRPC error no command translated
        return f"{grpc_code().name}: {exc.details()}"
    return (f"unexpected {type(exc).__name__}: {one_line(exc)} (a bug: rerun with --debug for the traceback "
            "and report it)")


def exit_code(exc: Exception) -> int:
    from data_service.errors import ConfigError

    if isinstance(exc, CommandError):
        return exc.code
    return 2 if isinstance(exc, ConfigError) else 1


if __name__ == "__main__":
    sys.exit(main())
