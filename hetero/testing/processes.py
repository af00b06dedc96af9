"""Data servers and consumers in their own processes, so a test can kill -9 them.

:class:`ServerProc` runs ``hetero serve`` (the one way a data server runs in a subprocess, for
tests and the soak alike); :class:`ConsumerProc` runs ``python -m hetero.testing.consumer``, a
rank that reads epochs with an audit log and resumes from it. Each runs in its own process group
(``start_new_session``), so ``kill()`` takes its workers too, as when a node vanishes.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

from data_service.pool.messages import SPARE_COMM
from data_service.pool.warm_parent import COMM as WARM_PARENT
from hetero.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "test-token"
PIPELINE = "examples.synthetic:build_pipeline"


class _ProcessGroup:
    """A child started in its own session (``start_new_session``): killed as a whole group."""

    proc: subprocess.Popen | None = None
    cmd: list[str]
    log_path: Path | None = None
    _scratch = None  # the output without a log_path (a temporary file)
    starts = 0
    started_at = 0.0
    env: dict[str, str] | None = None  # added to this process's environment

    @property
    def alive(self) -> bool:
        return self._running is not None

    @property
    def _running(self) -> subprocess.Popen | None:
        """The child while it runs (None: not started, or exited)."""
        return self.proc if self.proc is not None and self.proc.poll() is None else None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def _spawn(self) -> None:
        """Start ``cmd`` from the repository root, output appended to ``log_path`` (or, without one, to
        an unnamed temporary file that goes with this object, so an early exit can still say why)."""
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **(self.env or {}))
        out: IO[Any]
        if self.log_path:
            out = open(self.log_path, "a")
        else:
            if self._scratch is None:
                self._scratch = tempfile.TemporaryFile()
            out = self._scratch
        try:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            if self.log_path:
                out.close()
        self.starts += 1
        self.started_at = time.monotonic()

    def kill(self) -> None:
        """kill -9 the whole process group (the process and its workers), like a node that vanishes."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(15)

    def _terminate(self, timeout: float) -> None:
        """SIGTERM, wait up to ``timeout``, then kill -9 whatever is left of the group."""
        proc = self._running
        if proc is not None:
            proc.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout)
        self.kill()

    def _log_tail(self, chars: int = 2000) -> str:
        """The last ``chars`` of the output, after a line break ("" when there is none)."""
        with contextlib.suppress(OSError):
            if self.log_path:
                return "\n" + self.log_path.read_text(errors="replace")[-chars:]
            if self._scratch is not None:
                size = os.fstat(self._scratch.fileno()).st_size
                return "\n" + os.pread(self._scratch.fileno(), chars, max(0, size - chars)).decode(errors="replace")
        return ""


def _wait_bindable(ports: tuple[int, ...], timeout: float) -> None:
    """Wait (up to ``timeout``) until every port can be bound on loopback again: a restart right
    after a kill -9 must not race the kernel releasing the dead server's sockets."""
    deadline = time.monotonic() + timeout
    for port in ports:
        while time.monotonic() < deadline:
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", port))
                    break
                except OSError:
                    time.sleep(0.05)


class ServerProc(_ProcessGroup):
    """``hetero serve`` on loopback in its own process group (so kill -9 takes its workers too).

    Ports are fixed at construction, so ``kill()`` then ``start()`` brings the server back at
    the same address. ``advertise_bulk_port`` makes clients dial that port (a proxy) for the
    data plane instead of ``bulk_port``.

    Args:
        options: the pipeline builder's keyword options.
        workers: worker processes; ``slots``: built batches each worker may hold.
        probe: build batch 0 at start-up (``hetero serve``'s default); off, the server is ready sooner.
        send_timeout_s: ``hetero serve --send-timeout`` (the server's default when None).
        log_path: the server's output is appended here (kept in a temporary file when None).
        env: variables added to its environment (``HETERO_CACHE_DIR``, ``AWS_ENDPOINT_URL``, ...).
        worker_start: ``hetero serve --worker-start`` (``"warm"``, the default, or ``"spawn"``).
        spare_worker: False: ``hetero serve --no-spare-worker`` (a dead worker's replacement is forked then).
        batch_window: ``hetero serve --batch-window`` (a size such as ``"64MB"``; None: no window).
        build_ahead: ``hetero serve --build-ahead`` (None: the server's default).
    """

    def __init__(self, options: dict, *, port: int | None = None, bulk_port: int | None = None,
                 advertise_bulk_port: int = 0, workers: int = 1, slots: int = 2, token: str = TOKEN,
                 pipeline: str = PIPELINE, log_path: str | os.PathLike | None = None, probe: bool = False,
                 send_timeout_s: float | None = None, env: dict[str, str] | None = None,
                 worker_start: str | None = None, spare_worker: bool = True,
                 batch_window: str | int | None = None, build_ahead: int | None = None) -> None:
        self.options = dict(options)
        self.env = dict(env or {})
        self.port = port or free_port()
        self.bulk_port = bulk_port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.advertise_bulk_port = advertise_bulk_port
        self.workers = workers
        self.token = token
        self.cmd = [sys.executable, "-m", "hetero", "--log-level", "WARNING", "serve", pipeline,
                    "--host", "127.0.0.1", "--port", str(self.port), "--bulk-port", str(self.bulk_port),
                    "--advertise-bulk-port", str(advertise_bulk_port), "--workers", str(workers),
                    "--slots-per-worker", str(slots), "--token", token]
        self.cmd += [arg for key, value in self.options.items() for arg in ("-o", f"{key}={json.dumps(value)}")]
        self.cmd += ([] if probe else ["--no-probe"]) + ([] if spare_worker else ["--no-spare-worker"])
        self.cmd += [arg for flag, value in (("--send-timeout", send_timeout_s), ("--worker-start", worker_start),
                                             ("--batch-window", batch_window), ("--build-ahead", build_ahead))
                     if value is not None for arg in (flag, str(value))]
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None

    def start(self, wait: bool = True, timeout: float = 120.0) -> "ServerProc":
        if self.starts:
            _wait_bindable((self.port, self.bulk_port), 10.0)
        self._spawn()
        if wait:
            self.wait_ready(timeout)
        return self

    def healthy(self, timeout: float = 1.0) -> bool:
        from dnn_worker.transport.control import ControlClient

        if not self.alive:
            return False
        with ControlClient(self.address, self.token) as ctl:
            return ctl.healthy(timeout=timeout)

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Return once the server answers health checks; raise if it exits or ``timeout`` passes."""
        from dnn_worker.transport.control import ControlClient

        if self.proc is None:
            raise RuntimeError("ServerProc.wait_ready() before start()")
        proc = self.proc
        deadline = time.monotonic() + timeout
        with ControlClient(self.address, self.token) as ctl:
            while time.monotonic() < deadline:
                if proc.poll() is not None:
                    raise RuntimeError(f"data server {self.address} exited with {proc.returncode}; "
                                       f"{f'log {self.log_path}' if self.log_path else 'its output'}:{self._log_tail()}")
                if ctl.healthy(timeout=1.0):
                    return
                time.sleep(0.2)
        raise TimeoutError(f"data server {self.address} not healthy within {timeout}s")

    def stop(self, timeout: float = 20.0) -> None:
        self._terminate(timeout)

    def worker_pids(self) -> list[int]:
        """PIDs of the server's worker processes (its multiprocessing children, or its warm parent's
        but the spare waiting to replace one)."""
        import psutil

        proc = self._running
        if proc is None:
            return []
        try:
            kids = psutil.Process(proc.pid).children()
        except psutil.Error:
            return []
        out: list[int] = []
        for k in kids:
            try:
                cmd, name = " ".join(k.cmdline()), k.name()
                if k.status() == psutil.STATUS_ZOMBIE:  # a killed worker not yet reaped is no worker
                    continue
            except psutil.Error:
                continue
            if name == WARM_PARENT:  # the workers are the warm parent's children
                try:
                    out.extend(w.pid for w in k.children()
                               if w.name() != SPARE_COMM and w.status() != psutil.STATUS_ZOMBIE)
                except psutil.Error:
                    continue
            elif "multiprocessing" in cmd and "resource_tracker" not in cmd:
                out.append(k.pid)
        return out

    def rss(self) -> tuple[int, int]:
        """(RSS of the server process, RSS of its largest worker) in bytes; (0, 0) when down. The
        largest, not the sum: while a worker is replaced the dying one and its successor (or a
        spare) are both listed for a moment, and a sum would read that as growth."""
        proc = self._running
        main = _rss(proc.pid) if proc is not None else 0
        return (main, max(map(_rss, self.worker_pids()), default=0)) if main else (0, 0)


class ConsumerProc(_ProcessGroup):
    """One consumer rank (``python -m hetero.testing.consumer``) in its own process group.

    It reads ``epochs`` epochs from ``servers`` as rank ``rank`` of ``world``, writing the audit
    log ``audit``; started again after a kill, it resumes where its audit log ends.
    """

    def __init__(self, servers: list[str], rank: int, world: int, audit: Path, *, seed: int, epochs: int,
                 token: str = TOKEN, log_path: Path | None = None, step_s: float = 0.0,
                 connect_timeout: float = 60.0, batch_timeout: float = 15.0, window: int = 4) -> None:
        self.rank = rank
        self.audit = Path(audit)
        self.cmd = [sys.executable, "-m", "hetero.testing.consumer", "--servers", ",".join(servers),
                    "--rank", str(rank), "--world", str(world), "--audit", str(audit), "--seed", str(seed),
                    "--epochs", str(epochs), "--token", token, "--step-s", str(step_s),
                    "--connect-timeout", str(connect_timeout), "--batch-timeout", str(batch_timeout),
                    "--window", str(window)]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> "ConsumerProc":
        self._spawn()
        return self

    def stop(self, timeout: float = 30.0) -> int | None:
        self._terminate(timeout)
        return self.proc.returncode if self.proc else None

    def wait(self, timeout: float) -> int:
        """Wait until the consumer has read all its epochs and exited; returns its exit code.

        Raises:
            TimeoutError: still running after ``timeout`` s (it is left running; ``stop()`` it),
                with the tail of its output.
        """
        if self.proc is None:
            raise RuntimeError("ConsumerProc.wait() before start()")
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"consumer rank {self.rank} still running after {timeout:.0f} s:"
                               f"{self._log_tail()}") from None

    def rss(self) -> int:
        """RSS of the consumer and all its descendants in bytes; 0 when down."""
        import psutil

        proc = self._running
        if proc is None:
            return 0
        try:
            p = psutil.Process(proc.pid)
            return p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))
        except psutil.Error:
            return 0


def _rss(pid: int) -> int:
    """RSS of process ``pid`` in bytes; 0 when it is gone."""
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss
    except psutil.Error:
        return 0
