"""One module per ``hetero`` subcommand; each exposes ``register(subparsers)``.

A command's own helpers sit beside it, named after it (``submit_spec.py`` for ``submit``);
``hetero.cli.COMMANDS`` lists the commands themselves.
"""
