"""``hetero synth``: write synthetic MNIST-format IDX files (train + t10k) for offline use."""
from __future__ import annotations

import argparse
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("synth", help="write synthetic MNIST-format IDX files",
                       description="Drawn seven-segment digits (shifted, scaled, noisy) in MNIST's IDX format: "
                                   "train-images-idx3-ubyte, train-labels-idx1-ubyte and the t10k pair.")
    p.add_argument("out", type=Path, help="folder to write into (created)")
    p.add_argument("--train", type=int, default=60000, help="training images (default 60000)")
    p.add_argument("--test", type=int, default=10000, help="test images (default 10000; 0 = none)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--gzip", action="store_true", help="write .gz files, as MNIST is distributed")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from data_service.errors import ConfigError
    from hetero.synthetic_mnist import write_synthetic

    try:
        paths = write_synthetic(args.out, args.train, args.test, args.seed, args.gzip)
    except ConfigError as exc:
        print(f"hetero synth: {exc}")
        return 2
    for path in paths:
        print(path)
    return 0
