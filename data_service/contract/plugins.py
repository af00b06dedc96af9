"""Plug-ins named by import path (``mypkg.data:build_pipeline``, a model, a step): one error for a
module that is not there (naming what is missing and the fix) and one for options a plug-in does
not take (listing its parameters), wherever a plug-in is named."""
from __future__ import annotations

import importlib
import importlib.util
import inspect
from types import ModuleType
from typing import Any, Callable, Mapping

from ..errors import ConfigError


def _not_found(what: str, path: str, module_name: str, exc: ImportError) -> ConfigError:
    missing = getattr(exc, "name", None) or ""
    top = module_name.split(".")[0]
    if missing == top:
        fix = (f"run from the folder that holds {top!r}, put that folder on PYTHONPATH or pip install the "
               "package on this node")
    elif missing and (module_name == missing or module_name.startswith(missing + ".")):
        fix = f"check the import path: {missing!r} does not exist"
    else:
        fix = "the module imports something this node lacks: install it, or fix the module's imports"
    return ConfigError(f"{what}={path!r}: cannot import module {module_name!r} ({exc}); {fix}")


def import_module(path: str, what: str) -> ModuleType:
    """The module of ``path`` (``package.module:name``), imported.

    Raises:
        ConfigError: it does not import, naming the option ``what``, the path, what is missing and the fix.
    """
    module_name = path.partition(":")[0]
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise _not_found(what, path, module_name, exc) from exc


def check_findable(path: str, what: str) -> None:
    """That the module of ``path`` exists, without running it (only its parent packages are
    imported): the cheap half of a preflight, for a process that starts others which import it.

    Raises:
        ConfigError: as :func:`import_module`.
    """
    module_name = path.partition(":")[0]
    try:
        found = importlib.util.find_spec(module_name)
    except ImportError as exc:
        raise _not_found(what, path, module_name, exc) from exc
    except ValueError:
        return  # an odd module that find_spec cannot tell about: the import will
    if found is None:
        raise _not_found(what, path, module_name, ModuleNotFoundError(f"No module named {module_name!r}",
                                                                       name=module_name))


def check_call(func: Callable[..., Any], options: Mapping[str, Any], what: str, target: str) -> None:
    """Raise ConfigError when ``func(**options)`` would fail on the option names alone.

    The message keeps Python's own wording (``build_pipeline() got an unexpected keyword
    argument 'batch_sz'``), names the option and the import path, and lists the parameters.
    """
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):
        return  # a builtin or extension without a signature: its call will tell
    try:
        signature.bind(**options)
    except TypeError as exc:
        name = getattr(func, "__name__", target.partition(":")[2])
        raise ConfigError(f"{what}={target!r} rejected options {dict(options)!r}: {name}() {exc}; "
                          f"its parameters are {list(signature.parameters)}") from None
