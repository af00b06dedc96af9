"""The server's side of a pool's warm parent (warm_parent.py): starting it, asking it to import
what the workers import and to fork workers, and the handle of each forked worker.

``WarmParent.Process`` stands in for ``multiprocessing.get_context("spawn").Process`` (what
lifecycle.py calls): the handle has ``start``, ``pid``, ``sentinel``, ``exitcode``, ``is_alive``,
``join`` and ``kill``. A forked worker is the warm parent's child, not the server's, so its
sentinel is a pidfd (readable once it exits, whoever its parent is) and its exit code comes
on a status pipe from the warm parent, which reaps it.
"""
from __future__ import annotations

import atexit
import contextlib
import io
import json
import math
import multiprocessing as mp
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from multiprocessing import spawn
from multiprocessing.connection import Connection
from typing import cast

from .preload import BASE
from .warm_parent import CODE, recv_msg, send_msg

ANSWER_TIMEOUT_S = 30.0  # a fork takes milliseconds; this long means the warm parent is stuck
CODE_WAIT_S = 2.0        # from a worker's exit to the warm parent writing its code (it reaps at once)
UNKNOWN_EXIT = 255       # the exit code of a worker whose warm parent died before it could tell


class WarmParentGone(OSError):
    """The warm parent cannot fork (it exited, or refused); workers are spawned instead."""


def _readable(fd, timeout: float | None) -> bool:
    """Is ``fd`` readable within ``timeout`` seconds? poll, not select: a server in a process that
    holds a thousand descriptors (a trainer's files, a test run's) gets numbers select cannot take."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000))))


# The warm parent's interpreter runs this, not multiprocessing's spawn entry (which would import
# the server's __main__ again): the server's sys.path first (-c itself adds only ""), then its body.
_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from data_service.pool.warm_parent import boot; boot(int(sys.argv[2]))")


class WarmParent:
    """One pool's warm parent: a fresh interpreter that imports what the workers of pipeline
    ``spec_json`` will import (preload.py), then forks them."""

    def __init__(self, spec_json: str, base: tuple[str, ...] = BASE) -> None:
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._lock = threading.Lock()  # one request and its answer at a time (start-up and replacements)
        self.gone = False
        try:
            flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]  # private: no stub
            self.process = subprocess.Popen(
                [spawn.get_executable(), *flags, "-c", _BOOT,
                 json.dumps(sys.path), str(theirs.fileno())], pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL)
        finally:
            theirs.close()
        send_msg(self._sock, {"spec": spec_json, "names": list(base)})
        self.spec = json.loads(spec_json)

    @property
    def pid(self) -> int:
        return self.process.pid

    def ready(self, timeout: float) -> dict | None:
        """What the warm parent reported once it preloaded (pid; error: the pipeline's module did
        not import; unsafe: the module that left a hazard, and what; failed: declared modules that
        did not import); None if it did not within ``timeout`` seconds.

        Raises:
            WarmParentGone: it exited before reporting.
        """
        if not _readable(self._sock, timeout):
            return None
        try:
            report, _ = recv_msg(self._sock)
        except (OSError, EOFError):
            report = None
        if report is None:
            raise WarmParentGone(f"the warm parent exited with code {self._exit_code(1.0)} while preloading")
        return report

    def _exit_code(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def preload(self, names: list[str], why: str, timeout: float) -> dict:
        """Have the warm parent import ``names`` (what a worker imported), so that later forks
        share them; its report (imported, failed, unsafe). An unsafe report leaves it refusing
        forks: workers are spawned from then on.

        Raises:
            WarmParentGone: the warm parent exited, or did not answer within ``timeout`` seconds.
        """
        with self._lock:
            if self.gone:
                raise WarmParentGone("the warm parent was closed")
            try:
                send_msg(self._sock, {"op": "import", "names": list(names), "why": why})
                if not _readable(self._sock, timeout):
                    raise WarmParentGone(f"the warm parent did not import {len(names)} modules within {timeout:.0f}s")
                report, _ = recv_msg(self._sock)
            except (OSError, EOFError) as exc:
                report, why_gone = None, str(exc)
            else:
                why_gone = "it exited"
            if report is None:
                self.gone = True
                raise WarmParentGone(f"the warm parent cannot import what the workers did: {why_gone}")
            if report["unsafe"]:
                self.gone = True
            return report

    def Process(self, target, name: str, args: tuple = (), daemon: bool = True):  # noqa: N802 (multiprocessing's name)
        """A handle like ``multiprocessing.Process``; once this warm parent is gone, a spawned one."""
        if self.gone:
            return mp.get_context("spawn").Process(target=target, name=name, args=args, daemon=daemon)
        return ForkedProcess(self, target, name, args)

    def fork(self, target, args: tuple, name: str) -> tuple[int, int, int]:
        """Fork a worker running ``target(*args)``; (pid, its pidfd, the read end of its status pipe).

        Raises:
            WarmParentGone: the warm parent exited, refused or did not answer.
        """
        buf = io.BytesIO()
        pickler = _FdPickler(buf)
        pickler.dump((target, args))
        msg = {"env": dict(os.environ), "name": name, "payload": buf.getvalue()}  # spawn's environment: today's
        status_r, status_w = os.pipe()
        try:
            with self._lock:
                if self.gone:
                    raise WarmParentGone("the warm parent was closed")
                send_msg(self._sock, msg, [status_w, *pickler.fds])
                if not _readable(self._sock, ANSWER_TIMEOUT_S):
                    raise WarmParentGone(f"the warm parent did not answer a fork within {ANSWER_TIMEOUT_S:.0f}s")
                answer, fds = recv_msg(self._sock)
        except (OSError, EOFError) as exc:
            self.gone = True
            os.close(status_r)
            raise WarmParentGone(f"the warm parent cannot fork: {exc}") from exc
        finally:
            os.close(status_w)
        if answer is None or "error" in answer:
            self.gone = True
            os.close(status_r)
            for fd in fds:
                os.close(fd)
            raise WarmParentGone((answer or {}).get("error") or "the warm parent exited")
        return answer["pid"], fds[0], status_r

    def close(self, timeout: float) -> None:
        """Stop the warm parent (its workers are the pool's to stop first)."""
        with self._lock:  # a fork under way finishes first
            self.gone = True
            self._sock.close()
        if self._exit_code(timeout) is None:
            self.process.kill()
            self._exit_code(2.0)


_EARLY: list[WarmParent] = []  # started by prestart(), not yet adopted by a pool
_EARLY_LOCK = threading.Lock()


@atexit.register
def _stop_early() -> None:
    """A warm parent no pool adopted (the server failed to start) dies with this process, not
    seconds later once its imports are done."""
    with _EARLY_LOCK:
        early, _EARLY[:] = list(_EARLY), []
    for parent in early:
        parent.process.kill()
        parent.close(1.0)


def prestart(spec_json: str) -> None:
    """Start the warm parent of pipeline ``spec_json`` now, before this process imports the rest
    of a data server (grpc, numpy: half a second of CPU), so that the warm parent's imports run
    beside them. The pool that starts next with the same spec adopts it (``adopt``); one never
    adopted exits with this process."""
    with _EARLY_LOCK:
        _EARLY.append(WarmParent(spec_json))


def adopt(spec_json: str) -> WarmParent | None:
    """A warm parent ``prestart`` started for the same pipeline spec (the same JSON value), or None."""
    wanted = json.loads(spec_json)
    with _EARLY_LOCK:
        for parent in _EARLY:
            if parent.spec == wanted:
                _EARLY.remove(parent)
                return parent
    return None


class _FdPickler(pickle.Pickler):
    """Pickles pipe ends as persistent ids; their descriptors travel beside (``socket.send_fds``)."""

    def __init__(self, file) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.fds: list[int] = []

    def persistent_id(self, obj):
        if isinstance(obj, Connection):
            self.fds.append(obj.fileno())
            return ("connection", len(self.fds) - 1, obj.readable, obj.writable)
        return None


class ForkedProcess:
    """A worker forked by a warm parent, handled like a ``multiprocessing.Process``."""

    def __init__(self, parent: WarmParent, target, name: str, args: tuple) -> None:
        self._parent, self._target, self._args, self.name = parent, target, args, name
        self.pid: int | None = None
        self.sentinel: int | None = None  # the worker's pidfd, once started
        self._status: int | None = None   # the read end of its status pipe, once started
        self._code: int | None = None
        self._finalizer: weakref.finalize | None = None

    def start(self) -> None:
        self.pid, self.sentinel, self._status = self._parent.fork(self._target, self._args, self.name)
        self._finalizer = weakref.finalize(self, _close_fds, self.sentinel, self._status)

    def close(self) -> None:
        """Close its pidfd and status pipe; ValueError while it runs (as ``multiprocessing.Process``).
        Its exit code, unknown now if the warm parent has not told it, reads ``UNKNOWN_EXIT`` after."""
        if self.sentinel is None:
            return
        if self.is_alive():
            raise ValueError(f"data worker {self.name} (pid {self.pid}) still runs: it cannot be closed")
        if self._code is None:
            self._read_code(0)
        self._code = UNKNOWN_EXIT if self._code is None else self._code
        if self._finalizer is not None:  # set by start, as the sentinel is
            self._finalizer()
        self.sentinel = self._status = None

    @property
    def exitcode(self) -> int | None:
        """The exit code once the warm parent has told it; None before, and never waits for it (the
        data plane's event loop reads this: ``join`` is the call that waits)."""
        if self._code is None and _readable(self.sentinel, 0):
            self._read_code(0)
        return self._code

    def _read_code(self, timeout: float) -> None:
        if _readable(self._status, timeout):
            data = os.read(cast(int, self._status), CODE.size)  # readable: started
            # an empty read: the pipe closed without a code, the warm parent is gone
            self._code = CODE.unpack(data)[0] if len(data) == CODE.size else UNKNOWN_EXIT
        elif timeout >= CODE_WAIT_S:
            self._code = UNKNOWN_EXIT  # the warm parent reaps at once: it did not tell within CODE_WAIT_S

    def is_alive(self) -> bool:
        """Whether the worker still runs (its pidfd not yet readable); never waits."""
        return self._code is None and not _readable(self.sentinel, 0)

    def join(self, timeout: float | None = None) -> None:
        """Wait up to ``timeout`` for the worker to end and for its exit code."""
        if self._code is None:
            deadline = None if timeout is None else time.monotonic() + timeout
            if _readable(self.sentinel, timeout):
                left = CODE_WAIT_S if deadline is None else max(0.0, deadline - time.monotonic())
                self._read_code(min(left, CODE_WAIT_S))

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def _signal(self, sig: int) -> None:
        if self.is_alive():
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(cast(int, self.sentinel), sig)  # by pidfd: never a reused pid


def _close_fds(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
