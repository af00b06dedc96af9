"""One module per ``hetero`` subcommand; each exposes ``register(subparsers)``.

A command's own helpers sit beside it, named after it (``index_parquet.py`` for ``index``);
``hetero.cli.COMMANDS`` lists the commands themselves. Every command's parser comes from
``add_command``: ``HelpFormatter`` (or ``RawHelpFormatter`` for a docstring laid out in lines,
which goes through ``plain`` first), so ``--help`` prints plain text, with each option's default.
"""
from __future__ import annotations

import argparse
import re

# RST a docstring may hold: ``literal``, :role:`target` (with ~ or !), `text`_ links, and the
# escaped space that glues a suffix to a literal (``Error``\ s).
_LITERAL = re.compile(r"``(.+?)``", re.S)
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`[~!]?(.+?)`", re.S)
_LINK = re.compile(r"`([^`]+?)`_")


def plain(text: str | None) -> str:
    """``text`` (a docstring) without its RST markup, as ``--help`` should print it."""
    text = text or ""
    text = _ROLE.sub(r"\1", text)
    text = _LITERAL.sub(r"\1", text)
    text = _LINK.sub(r"\1", text)
    return text.replace("\\ ", "")


def has_default(action: argparse.Action) -> bool:
    """Whether ``action`` has a default worth saying: not unset (None), off (False) or empty."""
    d = action.default
    return not (d is None or d is False or d is argparse.SUPPRESS or (isinstance(d, (str, list)) and not d))


class HelpFormatter(argparse.HelpFormatter):
    """Adds ``(default: X)`` to each option's help, unless the option has no default worth saying
    (unset, off, empty), takes no value, or its help already says its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not text or "default" in text or action.nargs == 0 or not has_default(action):
            return text
        if action.option_strings or action.nargs in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return f"{text} (default: %(default)s)"
        return text


class RawHelpFormatter(argparse.RawDescriptionHelpFormatter, HelpFormatter):
    """``HelpFormatter`` that keeps the description's line breaks (examples, paragraphs)."""


class NoneIsOff(argparse.Action):
    """A choice option whose choice "none" means off: stored as "", the value the code takes for it."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, "" if values == "none" else values)


def add_command(sub, name: str, help: str, description: str, raw: bool = False) -> argparse.ArgumentParser:
    """Subcommand ``name``'s parser (``help``: its line in ``hetero --help``): ``description`` wrapped, or
    with ``raw`` a docstring laid out in lines, its RST dropped; each option's default said."""
    return sub.add_parser(name, help=help, description=plain(description) if raw else description,
                          formatter_class=RawHelpFormatter if raw else HelpFormatter)
