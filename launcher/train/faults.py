"""Fault injection for tests and drills: a training step that fails part-way.

``--hp step=launcher.train.faults:crash_step`` trains normally for ``CRASH_AT_STEP - 1`` steps with
the MNIST step, then raises, as a trainer bug or an out-of-memory error would mid-run.
The MNIST step is the launcher's default ``step`` option, loaded by import path like any user's step.
"""
from __future__ import annotations

import torch

from ..config import load_object

MNIST_STEP = "examples.mnist:train_step"

CRASH_AT_STEP = 20
_calls = {"n": 0}


class InjectedFault(RuntimeError):
    """The failure ``crash_step`` raises."""


def crash_step(model: torch.nn.Module, batch, optimizer: torch.optim.Optimizer, device: torch.device) -> float:
    """The MNIST step until step ``CRASH_AT_STEP``, where it raises ``InjectedFault``."""
    _calls["n"] += 1
    if _calls["n"] >= CRASH_AT_STEP:
        raise InjectedFault(f"injected trainer failure at step {_calls['n']} (launcher.train.faults:crash_step)")
    return load_object(MNIST_STEP, "step")(model, batch, optimizer, device)


SIGTERM_AT_STEP = 30
_sigterm_calls = {"n": 0}


def sigterm_step(model: torch.nn.Module, batch, optimizer: torch.optim.Optimizer, device: torch.device) -> float:
    """The MNIST step; during step ``SIGTERM_AT_STEP`` of this process it sends itself SIGTERM,
    as SageMaker does on a spot interruption or StopTrainingJob, then finishes the step."""
    import os
    import signal

    _sigterm_calls["n"] += 1
    if _sigterm_calls["n"] == SIGTERM_AT_STEP:
        os.kill(os.getpid(), signal.SIGTERM)
    return load_object(MNIST_STEP, "step")(model, batch, optimizer, device)


_abort_registered = {"done": False}


def abort_at_exit_step(model: torch.nn.Module, batch, optimizer: torch.optim.Optimizer, device: torch.device) -> float:
    """The MNIST step; the process aborts (SIGABRT) when its interpreter exits, after training, as
    a collective backend's C++ thread can ("terminate called without an active exception")."""
    if not _abort_registered["done"]:
        import atexit
        import os

        _abort_registered["done"] = True
        atexit.register(os.abort)
    return load_object(MNIST_STEP, "step")(model, batch, optimizer, device)
