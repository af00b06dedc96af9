"""The autoscaler's settings: the ``autoscale.*`` hyperparameters, checked at start.

    --hp autoscale.mode=act --hp autoscale.actuator=local --hp autoscale.min=1 --hp autoscale.max=6 \\
    --hp autoscale.usd_per_hour=3.0 --hp autoscale.cooldown_s=60

``mode``: ``off`` (no advice and no decisions), ``advise`` (the default: the live advice is
logged, nothing acts on it) or ``act`` (the autoscaler adds and drains data nodes). ``actuator``
(``act`` only): ``local`` (``hetero serve --join`` processes on this machine), ``command``
(``scale_out_cmd`` / ``scale_in_cmd`` for any fleet) or ``sagemaker`` (data-only jobs that join
this one, from the template ``hetero autoscale JOB`` writes: Managed Spot and warm pools are set
there). The policy's limits are ``launcher.autoscale.policy.Limits``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from data_service.errors import ConfigError

from .policy import Limits

MODES = ("off", "advise", "act")
ACTUATORS = ("local", "command", "sagemaker")
_LIMITS = {"min": "min_nodes", "max": "max_nodes", "usd_per_hour": "usd_per_hour", "cooldown_s": "cooldown_s",
           "in_after": "in_after", "out_wait_share": "out_wait_share", "in_wait_share": "in_wait_share",
           "join_timeout_s": "join_timeout_s", "drain_timeout_s": "drain_timeout_s"}
_OWN = {"mode": str, "actuator": str, "scale_out_cmd": str, "scale_in_cmd": str, "hook_timeout_s": float,
        "workers": int, "ttl_s": float, "drain_grace_s": float}

# Bounds of the settings that reach a started server or a wait: above these a value is a
# mistake (a TTL of a day keeps a dead server listed that long), not a choice.
_RANGES = {"hook_timeout_s": (0.0, 86400.0), "ttl_s": (0.0, 3600.0), "drain_grace_s": (0.0, 3600.0)}
MAX_WORKERS = 256


@dataclass(frozen=True)
class Settings:
    """Checked autoscaler settings (see the module docstring)."""

    mode: str = "advise"
    actuator: str = ""
    limits: Limits = field(default_factory=Limits)
    scale_out_cmd: str = ""
    scale_in_cmd: str = ""
    hook_timeout_s: float = 600.0   # a hook still running after this is stopped and reported
    workers: int = 1                # local actuator: worker processes per started server
    ttl_s: float = 15.0             # local actuator: the started servers' registry TTL
    drain_grace_s: float = 30.0     # a drained server finishes what it owes within this

    @property
    def acting(self) -> bool:
        return self.mode == "act"

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, registry: str = "") -> "Settings":
        """Settings from the ``autoscale.*`` options. ``registry``: the job's (``act`` needs one).

        Raises:
            ConfigError: an unknown key, a value of the wrong type, min > max, an unknown mode or
                actuator, ``act`` without a registry or a hook it needs; each names the fix.
        """
        limits: dict[str, Any] = {}
        own: dict[str, Any] = {}
        for key, value in options.items():
            if key in _LIMITS:
                kind = int if key in ("min", "max", "in_after") else float
                limits[_LIMITS[key]] = _typed(key, value, kind)
            elif key in _OWN:
                own[key] = _typed(key, value, _OWN[key])
            else:
                raise ConfigError(f"unknown autoscale option {key!r}; known: {sorted(set(_LIMITS) | set(_OWN))}")
        s = cls(limits=Limits(**limits), **own)
        if s.mode not in MODES:
            raise ConfigError(f"autoscale.mode={s.mode!r} must be one of {', '.join(MODES)} (advise: the advice is "
                              "logged and nothing acts on it)")
        try:
            s.limits.check()
        except ValueError as exc:
            text = str(exc)
            for short, name in _LIMITS.items():
                text = text.replace(f"{name}=", f"autoscale.{short}=")
            raise ConfigError(text) from None
        if s.actuator and s.actuator not in ACTUATORS:
            raise ConfigError(f"autoscale.actuator={s.actuator!r} is unknown: use one of {', '.join(ACTUATORS)}")
        if s.acting:
            if not s.actuator:
                raise ConfigError(f"autoscale.mode=act needs autoscale.actuator: one of {', '.join(ACTUATORS)}")
            if not registry:
                raise ConfigError("autoscale.mode=act needs the job's registry (hyperparameter registry): the "
                                  "data nodes it adds join the job there")
            if s.actuator == "command" and not s.scale_out_cmd:
                raise ConfigError("autoscale.actuator=command needs autoscale.scale_out_cmd (and scale_in_cmd to "
                                  "release drained nodes): shell commands given the count and the registry")
        for name, (low, high) in _RANGES.items():
            value = getattr(s, name)
            # NaN fails both comparisons, inf the upper one: neither reaches a server or a wait
            if not (low < value <= high):
                raise ConfigError(f"autoscale.{name}={value!r} must be a finite number in ({low:g}, {high:g}] "
                                  f"(default {getattr(Settings, name)!r})")
        if not 1 <= s.workers <= MAX_WORKERS:
            raise ConfigError(f"autoscale.workers={s.workers} must be 1..{MAX_WORKERS} worker processes per server")
        return s

    def describe(self) -> dict[str, Any]:
        """The settings for metrics.json (no hook command text: it may carry secrets)."""
        lim = self.limits
        return {"mode": self.mode, "actuator": self.actuator, "min": lim.min_nodes, "max": lim.max_nodes,
                "usd_per_hour": lim.usd_per_hour, "cooldown_s": lim.cooldown_s, "in_after": lim.in_after}


def _typed(key: str, value: Any, kind: type) -> Any:
    try:
        if kind is bool:
            if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
                return value.lower() in ("true", "1", "yes")
            if isinstance(value, bool):
                return value
            raise ValueError
        if kind is int and (isinstance(value, bool) or (isinstance(value, float) and not value.is_integer())):
            raise ValueError
        if kind is str:
            return value if isinstance(value, str) else str(value)
        return kind(value)
    except (TypeError, ValueError):
        raise ConfigError(f"autoscale.{key}={value!r} must be a {kind.__name__}") from None
