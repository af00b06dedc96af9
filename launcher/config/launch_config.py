"""The launcher's options, read from the job's hyperparameters.

Every option is a hyperparameter of the same name (``hetero local --hp epochs=3``,
``Estimator(hyperparameters={"epochs": 3})``), a field of one section of :class:`LaunchConfig`
(launcher/config/sections.py): ``epochs`` is ``cfg.train.epochs``. Pipeline builder options can
be given as one JSON object (``pipeline_options='{"blur_kernel": 11}'``) or one by one with a
``pipeline.`` prefix (``pipeline.blur_kernel=11``); the same for ``model.`` and ``model_options``,
and ``autoscale.`` for ``autoscale_options``. Keys starting with ``sagemaker_`` (set by the SDK)
are ignored; any other unknown key is an error naming the known ones, so a typo does not
silently train with a default.
"""
from __future__ import annotations

import contextlib
import dataclasses
import difflib
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from data_service.contract.plugins import import_module
from data_service.errors import ConfigError

from .sections import (AdviceSection, CheckpointSection, DataSection, DnnSection, ElasticSection, EmulateSection,
                       JobSection, ModelSection, RolesSection, ServeSection, TrainSection)

# ``prefix.key`` hyperparameters: one entry each of the options dict named here
PREFIXED = {"pipeline": "pipeline_options", "model": "model_options", "autoscale": "autoscale_options"}
_BOOL_WORDS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False, "": False}


@dataclass(frozen=True)
class LaunchConfig:
    """All launcher options, by section; see docs/launcher.md for each one's meaning."""

    roles: RolesSection = field(default_factory=RolesSection)
    data: DataSection = field(default_factory=DataSection)
    serve: ServeSection = field(default_factory=ServeSection)
    elastic: ElasticSection = field(default_factory=ElasticSection)
    dnn: DnnSection = field(default_factory=DnnSection)
    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = field(default_factory=TrainSection)
    emulate: EmulateSection = field(default_factory=EmulateSection)
    advice: AdviceSection = field(default_factory=AdviceSection)
    checkpoints: CheckpointSection = field(default_factory=CheckpointSection)
    job: JobSection = field(default_factory=JobSection)

    @classmethod
    def sections(cls) -> dict[str, type]:
        """Section name -> its dataclass, in order."""
        return {f.name: f.default_factory for f in dataclasses.fields(cls)}  # type: ignore[misc]

    @classmethod
    def hyperparameters(cls) -> dict[str, tuple[str, dataclasses.Field[Any]]]:
        """Every hyperparameter's name -> (its section, its field)."""
        return {f.name: (name, f) for name, kind in cls.sections().items() for f in dataclasses.fields(kind)}

    @classmethod
    def from_hyperparameters(cls, hps: Mapping[str, Any]) -> "LaunchConfig":
        """Typed, checked options from decoded hyperparameters.

        Raises:
            ConfigError: unknown key, or a value of the wrong type or out of range (naming key and value).
        """
        known = cls.hyperparameters()
        values: dict[str, dict[str, Any]] = {name: {} for name in cls.sections()}
        extra: dict[str, dict[str, Any]] = {options: {} for options in PREFIXED.values()}
        for key, value in hps.items():
            if key.startswith("sagemaker_") or key.startswith("_"):
                continue
            prefix, dot, sub = key.partition(".")
            if dot and prefix in PREFIXED and sub:
                extra[PREFIXED[prefix]][sub] = _maybe_json(value)
                continue
            if key not in known:
                close = difflib.get_close_matches(key, list(known) + [f"{p}." for p in PREFIXED], n=1)
                hint = f"did you mean {close[0]!r}? " if close else ""
                raise ConfigError(f"unknown hyperparameter {key!r}; {hint}known: {sorted(known)} "
                                  "(and pipeline.<option>, model.<option>, autoscale.<option>)")
            section, spec = known[key]
            values[section][key] = _coerce(key, value, str(spec.type))
        for options, more in extra.items():
            section = known[options][0]
            values[section][options] = {**values[section].get(options, {}), **more}
        cfg = cls(**{name: kind(**values[name]) for name, kind in cls.sections().items()})
        cfg.check()
        return cfg

    def to_hyperparameters(self) -> dict[str, Any]:
        """Every option by its hyperparameter name (the inverse of :meth:`from_hyperparameters`)."""
        return {f.name: getattr(getattr(self, name), f.name) for name, kind in self.sections().items()
                for f in dataclasses.fields(kind)}

    def check(self) -> None:
        """Each section's checks, then those that span two. Raises ConfigError naming the value."""
        for name in self.sections():
            getattr(self, name).check()
        from ..autoscale.settings import Settings

        Settings.from_options(self.advice.autoscale_options, registry=self.elastic.registry)


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str):
        with contextlib.suppress(json.JSONDecodeError):
            return json.loads(value)
    return value


def _coerce(key: str, value: Any, kind: str) -> Any:
    kind = kind.split("|")[0].split("[")[0].strip()  # "dict[str, float]" -> "dict"
    try:
        if kind == "bool":
            if isinstance(value, (bool, int)):
                return bool(value)
            if not isinstance(value, str) or value.lower() not in _BOOL_WORDS:
                raise ValueError
            return _BOOL_WORDS[value.lower()]
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind == "ByteSize":
            from data_service.server.batch_window import window_budget

            return window_budget(value)  # a size such as 8GB; ConfigError naming the value
        if kind == "dict":
            value = _maybe_json(value)
            if not isinstance(value, dict):
                raise ValueError
            return value
        return value if isinstance(value, str) else json.dumps(value)
    except ConfigError:
        raise  # a parser's own message (a size's), naming the value and the form
    except (TypeError, ValueError):
        raise ConfigError(f"hyperparameter {key}={value!r} must be a {kind}") from None


def load_object(path: str, what: str) -> Any:
    """Import ``package.module:name`` (a model class, a step function...).

    Raises:
        ConfigError: naming the option and the path that failed.
    """
    module_name, sep, name = path.partition(":")
    if not sep or not module_name or not name:
        raise ConfigError(f"{what}={path!r} must look like 'package.module:name'")
    obj = getattr(import_module(path, what), name, None)
    if obj is None:
        raise ConfigError(f"{what}={path!r}: module {module_name!r} has no attribute {name!r}")
    return obj
