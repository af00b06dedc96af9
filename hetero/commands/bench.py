"""``hetero bench``: step time, data wait and $ cost, homogeneous vs heterogeneous, on this machine.

The benchmark itself is hetero/bench/step_time.py (see docs/benchmarks.md).
"""
from __future__ import annotations

import argparse

# At import: where psutil (the bench extra) is absent, hetero.cli lists the command with what to
# install, and every other command (serve, local, ...) still runs.
from hetero.bench.step_time import add_arguments


def register(sub) -> None:
    from hetero.commands import add_command

    p = add_command(sub, "bench", "benchmark: homogeneous vs heterogeneous step time and cost",
                    "Run one training job, the --workload (mnist: synthetic MNIST with a blur loop; "
                    "images: a synthetic JPEG image folder, decoded, cropped and flipped), "
                    "homogeneous (trainer CPUs only) and heterogeneous (plus data CPUs), pinned, "
                    "alternating over rounds; print step time, data wait, CPU busy share, $/step and "
                    "the speed-up (docs/benchmarks.md).")
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hetero.bench.step_time import run_from_args
    from launcher.log_setup import setup_logging

    setup_logging("bench", args.log_level)
    return run_from_args(args)
