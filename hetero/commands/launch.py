"""``hetero launch``: run this node's part of a SageMaker job (same as launcher/entry.py)."""
from __future__ import annotations

import argparse
import sys


def register(sub) -> None:
    from hetero.commands import add_command

    p = add_command(sub, "launch", "run the launcher on this node (SageMaker entry point)",
                    "Read /opt/ml (or $HETERO_SM_ROOT), pick this node's role from its instance "
                    "group and run it: data server, trainer, or in-process training.")
    p.add_argument("--sm-root", default=None, help="SageMaker root (default: $HETERO_SM_ROOT or /opt/ml)")
    p.add_argument("--hp", action="append", metavar="KEY=VALUE", default=[],
                   help="override a hyperparameter (repeatable)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from launcher.node import main

    argv: list[str] = []
    for item in args.hp:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"hetero launch: --hp {item!r} must look like key=value", file=sys.stderr)
            return 2
        argv += [f"--{key}", value]
    return main(argv, root=args.sm_root)
