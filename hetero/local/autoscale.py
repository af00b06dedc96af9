"""``hetero local --autoscale``: the autoscaler's settings as hyperparameters, checked before any
node starts, and the servers it started stopped once the job has ended, however it ended."""
from __future__ import annotations

import contextlib
import os


def autoscale_hps(pairs: list[str], prices=None, data_nodes: int = 1) -> dict:
    """``--autoscale KEY=VALUE ...`` as ``autoscale.KEY`` hyperparameters, acting with local processes;
    checked, and the $/h cap against the ``data_nodes`` the job starts with at ``prices`` (``advice_prices``)."""
    from data_service.errors import ConfigError
    from .job import json_dict
    from launcher.autoscale.settings import Settings

    options = {"mode": "act", "actuator": "local"}
    for pair in pairs:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise ConfigError(f"--autoscale {pair!r} must be KEY=VALUE, e.g. max=6")
        options[key] = value
    settings = Settings.from_options(options, registry="--registry")  # bad settings fail before any node starts
    price = json_dict(prices).get("ml.local")  # the emulated nodes' instance type
    try:
        settings.limits.check_group(data_nodes, price)
    except ValueError as exc:
        raise ConfigError(f"--autoscale: {exc}") from None
    return {f"autoscale.{k}": v for k, v in options.items()}


def stop_joined(registry, output) -> None:
    """Ask every server still registered in ``registry`` to leave (servers the autoscaler started
    outlive a job that failed; a job that ends well has already stopped them)."""
    from data_service.membership.registry import RegistryError, read_entries
    from dnn_worker.transport.control import ControlClient

    try:
        entries, _ = read_entries(str(registry))
    except RegistryError:
        return
    token = os.environ.get("HETERO_JOB_TOKEN", "")
    if not token and os.path.exists(os.path.join(output, "job_token")):
        with open(os.path.join(output, "job_token")) as f:
            token = f.read().strip()
    for e in entries:
        with contextlib.suppress(Exception):  # gone already, or another job's: nothing to stop
            with ControlClient(e.address, token, "hetero-local") as ctl:
                ctl.shutdown(grace_s=5.0, reason="hetero local: the job ended", timeout=5.0)
