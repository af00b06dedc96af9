"""What a warm parent imports before it forks, so that its workers share those pages instead of
each importing them for itself (private memory per worker, seconds per replacement).

Three sources, in this order:

* what every worker imports whatever its pipeline (``BASE``): torch and the worker's own code
  path, which loads the protocol's messages but never the gRPC runtime;
* the pipeline's module, and what its builder declares it imports while it builds and runs
  (``builder.worker_imports``: module names, or a function of the pipeline's options returning
  them; ``declared``);
* what the first worker actually imported while it built the pipeline, and then while it built
  its first batch (``ImportRecorder``, sent to the warm parent by the pool): a user's builder
  that imports inside its body is covered without declaring anything.

Each module is imported in turn, and after each the parent checks that it holds nothing a fork
must not copy (fork_safety.py): the first one that brought a hazard in is named, and the parent
forks no worker after it. Only the standard library at module level: the warm parent imports
this before torch.
"""
from __future__ import annotations

import importlib
import json
import sys
import traceback
from dataclasses import dataclass, field

from .fork_safety import hazards

# What every worker imports whatever its pipeline (process.py and what it imports: torch, the
# pipeline contract, the protocol's messages), without grpc or a thread.
BASE = ("torch", "data_service.contract.pipeline", "data_service.contract.tensor_layout",
        "data_service.contract.compression", "data_service.pool.process")
# Never imported again by name: a process's own main module, however it was started.
_MAINS = frozenset({"__main__", "__mp_main__", "__parents_main__"})


@dataclass
class Preloaded:
    """What one round of imports did in the warm parent."""

    imported: list[str] = field(default_factory=list)      # names it imported (not there before)
    failed: dict[str, str] = field(default_factory=dict)   # name -> why it did not import (skipped)
    error: str | None = None    # a required module (the pipeline's) did not import: no fork at all
    unsafe: str | None = None   # the first module after which the parent held a hazard, and what

    def report(self) -> dict:
        return {"imported": len(self.imported), "failed": dict(self.failed), "error": self.error,
                "unsafe": self.unsafe}


def import_all(names, required: frozenset = frozenset(), own_sockets: int = 1, why: str = "") -> Preloaded:
    """Import ``names`` in order, checking after each newly imported module that this process
    still holds no hazard; stops at the first that brought one in, or failed to import while
    ``required``. ``why`` says where the names came from, for the reasons given back."""
    done = Preloaded()
    for name in names:
        if name in sys.modules or name in _MAINS:
            continue
        try:
            importlib.import_module(name)
        except BaseException as exc:  # the module's own error: reported, never raised here
            reason = "".join(traceback.format_exception_only(exc)).strip()
            if name in required:
                done.error = f"importing {name!r} failed: {reason}"
                return done
            done.failed[name] = reason
            continue
        done.imported.append(name)
        found = hazards(own_sockets)
        if not found.clean:
            done.unsafe = f"importing {name!r}{why} {found}"
            return done
    return done


def declared(spec_json: str) -> tuple[str | None, list[str], str | None]:
    """(the pipeline's module, the modules its builder declares, why the declaration is unusable)
    from the spec's JSON. Imports the module: call it where that is meant to happen."""
    try:
        spec = json.loads(spec_json)
        module, _, builder = spec["target"].partition(":")
        options = dict(spec.get("options") or {})
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, [], None  # the workers report what is wrong with the spec as they load it
    wanted = getattr(getattr(sys.modules.get(module), builder, None), "worker_imports", None)
    if wanted is None:
        return module, [], None
    try:
        names = wanted(**options) if callable(wanted) else wanted
        names = [names] if isinstance(names, str) else list(names)
    except BaseException as exc:
        return module, [], f"{spec['target']}.worker_imports failed: {type(exc).__name__}: {exc}"
    bad = [n for n in names if not isinstance(n, str) or not n]
    if bad:
        return module, [], f"{spec['target']}.worker_imports gave {bad!r}; it must give module names (str)"
    return module, names, None


class ImportRecorder:
    """Notes each module this process imports from when it is installed (first in
    ``sys.meta_path``, finding nothing itself), in the order the imports began.

    A forked worker must not list ``sys.modules`` to tell what is new: walking it touches the
    reference count of every module's name, and so copies every page the warm parent holds one on.
    """

    def __init__(self) -> None:
        self._names: list[str] = []
        sys.meta_path.insert(0, self)

    def find_spec(self, fullname: str, path=None, target=None):
        self._names.append(fullname)
        return None  # the next finder finds it

    def take(self) -> tuple[str, ...]:
        """The modules imported since the last ``take`` (those whose import failed left out)."""
        names, self._names = self._names, []
        return tuple(n for n in names if n in sys.modules and n not in _MAINS)

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
