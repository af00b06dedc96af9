"""One module per ``hetero`` subcommand; each exposes ``register(subparsers)``."""
