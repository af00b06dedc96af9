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


SIGTERM_AT_STEP = 30
_sigterm_calls = {"n": 0}


def sigterm_step(model: torch.nn.Module, batch, optimizer: torch.optim.Optimizer, device: torch.device) -> float:
    """The MNIST step; during step ``SIGTERM_AT_STEP`` of this process it sends itself SIGTERM,
    as SageMaker does on a spot interruption or StopTrainingJob, then finishes the step."""
    import os
    import signal

    from examples.mnist import train_step

    _sigterm_calls["n"] += 1
    if _sigterm_calls["n"] == SIGTERM_AT_STEP:
        os.kill(os.getpid(), signal.SIGTERM)
    return train_step(model, batch, optimizer, device)
