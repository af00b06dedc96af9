"""Every ``hetero`` subcommand's --help is plain text and complete: each option says what it does
and, when it has a default, what that default is."""
from __future__ import annotations

import argparse
import re

import pytest

from hetero.cli import build_parser

# RST that --help would print verbatim: ``literal``, :role:`target`, `interpreted text`_ links.
RST = re.compile(r"``|:(?:func|class|meth|mod|attr|data|obj|exc|ref|doc|term|envvar|option):`|`_\b")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


COMMANDS = subcommands()


def options(parser: argparse.ArgumentParser):
    return [a for a in parser._actions if not isinstance(a, (argparse._HelpAction, argparse._SubParsersAction))]


def shows_default(action: argparse.Action) -> bool:
    """Whether the action has a default worth printing (not off, unset or empty)."""
    d = action.default
    unset = d is None or d is False or d is argparse.SUPPRESS or (isinstance(d, (str, list)) and not d)
    return not unset and action.nargs != 0


def expanded_help(parser: argparse.ArgumentParser, action: argparse.Action) -> str:
    formatter = parser._get_formatter()
    return formatter._expand_help(action) if action.help else ""


def test_the_top_level_options_have_help():
    parser = build_parser()
    for action in options(parser):
        assert action.help, f"hetero {action.option_strings[0]}: no help"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_option_has_help(name):
    missing = [a.option_strings[0] if a.option_strings else a.dest for a in options(COMMANDS[name]) if not a.help]
    assert not missing, f"hetero {name}: options without help: {missing}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_default_is_shown(name):
    parser = COMMANDS[name]
    hidden = [a.option_strings[0] if a.option_strings else a.dest for a in options(parser)
              if a.help and shows_default(a) and "default" not in expanded_help(parser, a)]
    assert not hidden, f"hetero {name}: options whose --help does not show their default: {hidden}"


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_no_rst_markup(name):
    parser = COMMANDS[name]
    texts = {"description": parser.description or "", "epilog": parser.epilog or ""}
    texts.update({f"group {g.title}": g.description or "" for g in parser._action_groups})
    texts.update({a.option_strings[0] if a.option_strings else a.dest: a.help or "" for a in options(parser)})
    marked = {where: text for where, text in texts.items() if RST.search(text)}
    assert not marked, f"hetero {name}: RST markup in --help: {marked}"
    assert not RST.search(parser.format_help()), f"hetero {name} --help:\n{parser.format_help()}"


def test_no_rst_markup_in_the_command_list():
    help_text = build_parser().format_help()
    assert not RST.search(help_text), help_text


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_no_empty_choice(name):
    empty = [a.option_strings[0] if a.option_strings else a.dest for a in options(COMMANDS[name])
             if a.choices is not None and any(str(c).strip() == "" for c in a.choices)]
    assert not empty, f"hetero {name}: an empty string among the choices of {empty}"
