"""The command line every benchmark starts from, and the options several of them take alike."""
from __future__ import annotations

import argparse


def parser(doc: str, prog: str | None = None) -> argparse.ArgumentParser:
    """A benchmark's parser, described by the first line of its module docstring."""
    return argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])


def add_timing(p: argparse.ArgumentParser, seconds: float = 3.0, repeats: int = 3) -> None:
    """``--seconds`` measured per point and ``--repeats`` runs per point, whose medians are reported."""
    p.add_argument("--seconds", type=float, default=seconds, help="measured time per point")
    p.add_argument("--repeats", type=int, default=repeats, help="runs per point; medians are reported")


def add_json(p: argparse.ArgumentParser, default: str | None = None, help: str = "write all figures here") -> None:
    """``--json PATH``: where the run writes its figures."""
    p.add_argument("--json", default=default, help=help)
