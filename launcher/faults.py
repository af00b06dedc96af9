"""Fault injection for tests and drills: a training step that fails part-way.

``--hp step=launcher.faults:crash_step`` trains normally for ``CRASH_AT_STEP - 1`` steps with
the MNIST step, then raises, as a trainer bug or an out-of-memory error would mid-run.
"""
from __future__ import annotations

import torch

CRASH_AT_STEP = 20
_calls = {"n": 0}


class InjectedFault(RuntimeError):
    """The failure ``crash_step`` raises."""


def crash_step(model: torch.nn.Module, batch, optimizer: torch.optim.Optimizer, device: torch.device) -> float:
    """The MNIST step until step ``CRASH_AT_STEP``, where it raises ``InjectedFault``."""
    from examples.mnist import train_step

    _calls["n"] += 1
    if _calls["n"] >= CRASH_AT_STEP:
        raise InjectedFault(f"injected trainer failure at step {_calls['n']} (launcher.faults:crash_step)")
    return train_step(model, batch, optimizer, device)
