"""Soak: many epochs through 2-3 data servers and 2 consumers while faults are injected at random.

    python -m benchmarks.soak --batches 100000 --max-seconds 600 [--servers 3] [--json soak.json]

Runs each data server as its own process (``python -m benchmarks.soak serve``: fixed gRPC and
data-plane ports, the data plane behind a loopback proxy so connections can be cut) and two
consumers (``python -m benchmarks.soak consume``: ranks 0/1 of world 2, each writing the audit log
of ``RemoteDataset``). At random intervals it injects one of:

* ``server_kill``: kill -9 a data server (process group: server and its workers) mid-epoch, then
  restart it on the same ports after a pause (it must rejoin);
* ``worker_kill``: kill -9 one worker process of a data server;
* ``proxy_cut``: sever every data-plane connection through one server's proxy;
* ``consumer_restart``: kill -9 a consumer and start it again; it resumes from its audit log
  (the audit line is written when the batch is handed to the loop, so the log is the checkpoint).

At the end (``--batches`` delivered or ``--max-seconds`` passed) it stops the consumers and
checks every audit line against the epoch plan and the in-process reference bytes, then prints:
batches delivered, lost, duplicated, corrupt, faults injected by kind, max RSS per process at the
start and at the end of the run. Exit status 0 when nothing was lost, duplicated or corrupt.

The building blocks (``ServerProc``, ``FaultProxy``, ``account``) are reused by tests/test_faults.py.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "soak-token"
PIPELINE = "examples.synthetic:build_pipeline"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------ loopback proxy

class FaultProxy:
    """Forwards 127.0.0.1:<port> to ``target`` and injects network faults on demand.

    Args:
        delay_s: sleep before forwarding each server -> client chunk (a slow link).
        cut_after_bytes: close a connection once this many bytes went server -> client.

    ``cut()`` severs every live connection now (a drop mid-stream); ``stall(True)`` stops
    forwarding without closing anything (a half-open link: packets vanish, no RST).
    """

    def __init__(self, target: tuple[str, int], delay_s: float = 0.0, cut_after_bytes: int | None = None,
                 port: int = 0) -> None:
        self.target = target
        self.delay_s = delay_s
        self.cut_after_bytes = cut_after_bytes
        self._lst = socket.socket()
        self._lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._lst.bind(("127.0.0.1", port))
        self._lst.listen(64)
        self.port = self._lst.getsockname()[1]
        self.connections = 0
        self.cuts = 0
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._stalled = threading.Event()
        self._closed = False
        threading.Thread(target=self._accept, name=f"proxy-{self.port}", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._lst.accept()
            except OSError:
                if self._closed:
                    return
                time.sleep(0.05)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self.connections += 1
                self._pairs.append((client, upstream))
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, downstream: bool) -> None:
        sent = 0
        try:
            while True:
                data = src.recv(256 * 1024)
                if not data:
                    break
                while self._stalled.is_set() and not self._closed:
                    time.sleep(0.05)  # hold the bytes: the peer sees silence, not a close
                if downstream and self.delay_s:
                    time.sleep(self.delay_s)
                if downstream and self.cut_after_bytes is not None and sent + len(data) > self.cut_after_bytes:
                    with self._lock:
                        self.cuts += 1
                    break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        self._close_pair(src, dst)

    def _close_pair(self, a: socket.socket, b: socket.socket) -> None:
        for s in (a, b):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        with self._lock:
            self._pairs = [p for p in self._pairs if a not in p]

    def cut(self) -> int:
        """Sever every live connection (both sides see a reset/EOF). Returns how many."""
        with self._lock:
            pairs = list(self._pairs)
            self.cuts += len(pairs)
        for a, b in pairs:
            self._close_pair(a, b)
        return len(pairs)

    def stall(self, on: bool = True) -> None:
        (self._stalled.set if on else self._stalled.clear)()

    @property
    def live(self) -> int:
        with self._lock:
            return len(self._pairs)

    def close(self) -> None:
        self._closed = True
        self._stalled.clear()
        self._lst.close()
        self.cut()


# ------------------------------------------------------------------ server process

class _ProcessGroup:
    """A child started in its own session (``start_new_session``): killed as a whole group."""

    proc: subprocess.Popen | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9 the whole process group (the process and its workers), like a node that vanishes."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            pass

    def _terminate(self, timeout: float) -> None:
        """SIGTERM, wait up to ``timeout``, then kill -9 whatever is left of the group."""
        if self.alive:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        self.kill()


class ServerProc(_ProcessGroup):
    """A data server in its own process group (so kill -9 takes its workers too).

    Ports are fixed at construction, so ``kill()`` then ``start()`` brings the server back at
    the same address. ``advertise_bulk_port`` makes clients dial that port (a proxy) for the
    data plane instead of ``bulk_port``.
    """

    def __init__(self, options: dict, *, port: int | None = None, bulk_port: int | None = None,
                 advertise_bulk_port: int = 0, workers: int = 1, slots: int = 2, token: str = TOKEN,
                 pipeline: str = PIPELINE, log_path: str | os.PathLike | None = None) -> None:
        self.options = dict(options)
        self.port = port or free_port()
        self.bulk_port = bulk_port or free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.advertise_bulk_port = advertise_bulk_port
        self.workers = workers
        self.token = token
        self.cmd = [sys.executable, "-m", "benchmarks.soak", "serve", "--pipeline", pipeline,
                    "--options", json.dumps(self.options), "--port", str(self.port),
                    "--bulk-port", str(self.bulk_port), "--advertise-bulk-port", str(advertise_bulk_port),
                    "--workers", str(workers), "--slots", str(slots), "--token", token]
        self.log_path = Path(log_path) if log_path else None
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.started_at = 0.0

    def start(self, wait: bool = True, timeout: float = 120.0) -> "ServerProc":
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        out = open(self.log_path, "a") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            if self.log_path:
                out.close()
        self.starts += 1
        self.started_at = time.monotonic()
        if wait:
            self.wait_ready(timeout)
        return self

    def healthy(self, timeout: float = 1.0) -> bool:
        from dnn_worker.control import ControlClient

        if not self.alive:
            return False
        with ControlClient(self.address, self.token) as ctl:
            return ctl.healthy(timeout=timeout)

    def wait_ready(self, timeout: float = 120.0) -> None:
        from dnn_worker.control import ControlClient

        deadline = time.monotonic() + timeout
        with ControlClient(self.address, self.token) as ctl:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"data server {self.address} exited with {self.proc.returncode}"
                                       + (f"; log {self.log_path}" if self.log_path else ""))
                if ctl.healthy(timeout=1.0):
                    return
                time.sleep(0.2)
        raise TimeoutError(f"data server {self.address} not healthy within {timeout}s")

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def stop(self, timeout: float = 20.0) -> None:
        self._terminate(timeout)

    def worker_pids(self) -> list[int]:
        """PIDs of the server's worker processes (its multiprocessing children)."""
        import psutil

        if not self.alive:
            return []
        try:
            kids = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return []
        out = []
        for k in kids:
            try:
                cmd = " ".join(k.cmdline())
            except psutil.Error:
                continue
            if "multiprocessing" in cmd and "resource_tracker" not in cmd:
                out.append(k.pid)
        return out

    def rss(self) -> tuple[int, int]:
        """(RSS of the server process, summed RSS of its workers) in bytes; (0, 0) when down."""
        import psutil

        if not self.alive:
            return 0, 0
        try:
            main = psutil.Process(self.proc.pid)
            workers = 0
            for pid in self.worker_pids():
                try:
                    workers += psutil.Process(pid).memory_info().rss
                except psutil.Error:
                    pass
            return main.memory_info().rss, workers
        except psutil.Error:
            return 0, 0


def _serve(args: argparse.Namespace) -> int:
    import logging

    from data_service.pipeline import PipelineSpec
    from data_service.server import DataServer, ServerOptions

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s soak-server %(levelname)s %(message)s")
    spec = PipelineSpec(args.pipeline, json.loads(args.options))
    options = ServerOptions(host="127.0.0.1", port=args.port, bulk_port=args.bulk_port,
                            advertise_bulk_port=args.advertise_bulk_port, num_workers=args.workers,
                            slots_per_worker=args.slots, probe=False)
    server = DataServer(spec, args.token, options).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: server.shutdown(grace_s=5.0, reason="signal", block=False))
    while not server.wait(timeout=1.0):
        pass
    return 0


# ------------------------------------------------------------------ audit accounting

def read_audit(path: str | os.PathLike) -> list[dict]:
    """Audit lines; a torn last line (writer killed mid-write) is ignored."""
    rows = []
    try:
        with open(path) as f:
            for line in f:
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    except FileNotFoundError:
        pass
    return rows


def resume_point(path: str | os.PathLike, rank: int) -> tuple[int, int]:
    """(last epoch in the audit log for ``rank``, batches of it already delivered), read line by
    line: a consumer that kept every row would grow with the log (about 25 MiB per 45,000 rows)."""
    epoch, position = 0, 0
    try:
        with open(path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a torn last line (writer killed mid-write)
                if row["rank"] != rank:
                    continue
                if row["epoch"] > epoch:
                    epoch, position = row["epoch"], 0
                if row["epoch"] == epoch:
                    position += 1
    except FileNotFoundError:
        pass
    return epoch, position


class Reference:
    """In-process (homogeneous mode) digests of every batch, by (epoch, index); cached."""

    def __init__(self, pipeline: str, options: dict, seed: int) -> None:
        from data_service.pipeline import PipelineSpec

        self.spec = PipelineSpec(pipeline, options)
        self.seed = seed
        self._cache: dict[int, list[str]] = {}

    def digests(self, epoch: int) -> list[str]:
        if epoch not in self._cache:
            from data_service.codec import batch_digest
            from dnn_worker import LocalDataset

            ds = LocalDataset(self.spec, seed=self.seed)
            ds.set_epoch(epoch)
            self._cache[epoch] = [batch_digest(b) for b in ds]
        return self._cache[epoch]

    def __call__(self, epoch: int, index: int) -> str:
        return self.digests(epoch)[index]


def account(rows: Iterable[dict], share: Callable[[int], list[int]], ref: Callable[[int, int], str] | None = None,
            complete: bool = False) -> dict[str, Any]:
    """Count delivered, lost, duplicated and corrupt batches in audit lines.

    Args:
        share: rank -> that rank's batch indices of an epoch, in order.
        ref: (epoch, index) -> expected sha256, or None to skip the byte check.
        complete: every epoch seen must be complete (else a rank's last epoch counts up to the
            furthest batch it reached: what lies beyond is not due yet).
    """
    by = collections.defaultdict(list)
    for r in rows:
        by[(r["rank"], r["epoch"])].append(r)
    last_epoch: dict[int, int] = {}
    for rank, epoch in by:
        last_epoch[rank] = max(epoch, last_epoch.get(rank, -1))
    delivered = lost = duplicated = corrupt = foreign = 0
    lost_examples: list[tuple[int, int, int]] = []
    dup_examples: list[tuple[int, int, int]] = []
    for (rank, epoch), lines in sorted(by.items()):
        mine = share(rank)
        pos = {b: i for i, b in enumerate(mine)}
        seen = collections.Counter(x["batch"] for x in lines)
        delivered += len(lines)
        for b, n in seen.items():
            if b not in pos:
                foreign += n
            elif n > 1:
                duplicated += n - 1
                dup_examples.append((rank, epoch, b))
        if complete or epoch < last_epoch[rank]:
            due = mine
        else:
            furthest = max((pos[b] for b in seen if b in pos), default=-1)
            due = mine[:furthest + 1]
        missing = [b for b in due if b not in seen]
        lost += len(missing)
        lost_examples += [(rank, epoch, b) for b in missing[:3]]
        if ref is not None:
            corrupt += sum(1 for x in lines if x["batch"] in pos and x["sha256"] != ref(epoch, x["batch"]))
    # Epochs a rank skipped entirely (between two it reached) are lost too.
    for rank, last in last_epoch.items():
        for epoch in range(last):
            if (rank, epoch) not in by:
                lost += len(share(rank))
                lost_examples.append((rank, epoch, -1))
    return {"delivered": delivered, "lost": lost, "duplicated": duplicated, "corrupt": corrupt,
            "foreign": foreign, "lost_examples": lost_examples[:10], "duplicated_examples": dup_examples[:10]}


# ------------------------------------------------------------------ consumer process

def _consume(args: argparse.Namespace) -> int:
    """One rank: resume from its audit log, then read epochs until told to stop (SIGTERM)."""
    import logging

    from data_service.sampler import rank_share
    from dnn_worker import RemoteDataset

    logging.basicConfig(level=logging.ERROR, format="%(asctime)s soak-consumer %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    servers = args.servers.split(",")
    ds = RemoteDataset(servers, args.token, seed=args.seed, rank=args.rank, world_size=args.world,
                       audit_path=args.audit, connect_timeout=args.connect_timeout,
                       batch_timeout=args.batch_timeout, window=args.window)
    mine = rank_share(ds.num_batches_per_epoch(), args.rank, args.world, "drop")
    epoch, position = resume_point(args.audit, args.rank)
    if position >= len(mine):
        epoch, position = epoch + 1, 0
    while epoch < args.epochs and not stop.is_set():
        ds.load_state_dict({"epoch": epoch, "seed": args.seed, "position": position,
                            "dp_rank": args.rank, "dp_size": args.world})
        for _ in ds:
            if args.step_s:
                time.sleep(args.step_s)
            if stop.is_set():
                return 0
        epoch, position = epoch + 1, 0
    return 0


class ConsumerProc(_ProcessGroup):
    def __init__(self, servers: list[str], rank: int, world: int, audit: Path, *, seed: int, epochs: int,
                 token: str = TOKEN, log_path: Path | None = None, step_s: float = 0.0,
                 connect_timeout: float = 60.0, batch_timeout: float = 15.0, window: int = 4) -> None:
        self.rank = rank
        self.audit = Path(audit)
        self.cmd = [sys.executable, "-m", "benchmarks.soak", "consume", "--servers", ",".join(servers),
                    "--rank", str(rank), "--world", str(world), "--audit", str(audit), "--seed", str(seed),
                    "--epochs", str(epochs), "--token", token, "--step-s", str(step_s),
                    "--connect-timeout", str(connect_timeout), "--batch-timeout", str(batch_timeout),
                    "--window", str(window)]
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.starts = 0
        self.started_at = 0.0

    def start(self) -> "ConsumerProc":
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        out = open(self.log_path, "a") if self.log_path else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(self.cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            if self.log_path:
                out.close()
        self.starts += 1
        self.started_at = time.monotonic()
        return self

    def stop(self, timeout: float = 30.0) -> int | None:
        self._terminate(timeout)
        return self.proc.returncode if self.proc else None

    def rss(self) -> int:
        import psutil

        if not self.alive:
            return 0
        try:
            p = psutil.Process(self.proc.pid)
            return p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))
        except psutil.Error:
            return 0


# ------------------------------------------------------------------ the soak

FAULT_KINDS = ("server_kill", "worker_kill", "proxy_cut", "consumer_restart")


class RssTrack:
    """Max RSS per label in the first and the last ``window_s`` of the run."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, str, int]] = []

    def add(self, t: float, label: str, rss: int) -> None:
        if rss:
            self.samples.append((t, label, rss))

    def summary(self, start: float, end: float) -> dict[str, dict[str, float]]:
        window = max(10.0, 0.2 * (end - start))
        out: dict[str, dict[str, float]] = {}
        for t, label, rss in self.samples:
            e = out.setdefault(label, {"start_max_mib": 0.0, "end_max_mib": 0.0})
            if t - start <= window:
                e["start_max_mib"] = max(e["start_max_mib"], rss / 2**20)
            if end - t <= window:
                e["end_max_mib"] = max(e["end_max_mib"], rss / 2**20)
        return out

    def timeline(self, start: float, bucket_s: float = 60.0) -> dict[str, list[list[float]]]:
        """Max RSS (MiB) per label in each ``bucket_s`` of the run: shows growth that the
        first/last comparison cannot tell from a warm-up."""
        out: dict[str, dict[int, float]] = {}
        for t, label, rss in self.samples:
            b = int((t - start) // bucket_s)
            per = out.setdefault(label, {})
            per[b] = max(per.get(b, 0.0), rss / 2**20)
        return {label: [[b * bucket_s, round(v, 1)] for b, v in sorted(per.items())] for label, per in out.items()}


def run_soak(batches: int, max_seconds: float, nservers: int = 3, seed: int = 0, fault_gap: tuple[float, float] = (2.0, 5.0),
             kinds: tuple[str, ...] = FAULT_KINDS, workdir: Path | None = None, options: dict | None = None,
             verify: bool = True, log=print) -> dict[str, Any]:
    from data_service.pipeline import PipelineSpec
    from data_service.sampler import rank_share

    rnd = random.Random(seed)
    work = Path(workdir or tempfile.mkdtemp(prefix="hetero-soak-"))
    work.mkdir(parents=True, exist_ok=True)
    options = options or {"size": 512, "batch_size": 4, "shape": [3, 16, 16]}
    per_epoch = PipelineSpec(PIPELINE, options).load().plan_config().num_batches
    world = 2
    epochs = max(1, -(-batches // (per_epoch // world * world))) + 1
    proxies, servers = [], []
    for i in range(nservers):
        bulk = free_port()
        proxy = FaultProxy(("127.0.0.1", bulk))
        proxies.append(proxy)
        servers.append(ServerProc(options, bulk_port=bulk, advertise_bulk_port=proxy.port, workers=1,
                                  log_path=work / f"server{i}.log"))
    audits = [work / f"audit-rank{r}.jsonl" for r in range(world)]
    for a in audits:
        a.unlink(missing_ok=True)
    consumers = [ConsumerProc([s.address for s in servers], r, world, audits[r], seed=seed, epochs=epochs,
                              log_path=work / f"consumer{r}.log") for r in range(world)]
    faults = collections.Counter()
    consumer_failures = server_failures = 0
    restarts: list[tuple[float, ServerProc]] = []
    rss = RssTrack()
    max_slots = 0
    t0 = time.monotonic()
    try:
        for s in servers:
            s.start(wait=False)
        for s in servers:
            s.wait_ready()
        t0 = time.monotonic()
        for c in consumers:
            c.start()
        next_fault = t0 + rnd.uniform(*fault_gap) + 2.0
        next_sample = t0
        delivered = 0
        while True:
            now = time.monotonic()
            delivered = sum(len(read_audit(a)) for a in audits) if now >= next_sample else delivered
            if delivered >= batches or now - t0 >= max_seconds:
                break
            for when, s in list(restarts):
                if now >= when:
                    restarts.remove((when, s))
                    s.start(wait=False)
                    s.started_at = now
            for s in servers:  # a server that died unplanned (or failed to start): count it, bring it back
                if not s.alive and not any(s is r for _, r in restarts):
                    server_failures += 1
                    log(f"[soak] data server {s.address} exited with {s.proc.returncode} unplanned; restarting "
                        f"(see {s.log_path})")
                    s.start(wait=False)
                    s.started_at = now
            for c in consumers:
                if not c.alive and c.proc.returncode != 0:  # 0: it read every epoch asked of it
                    consumer_failures += 1
                    log(f"[soak] consumer rank {c.rank} exited with {c.proc.returncode}; restarting "
                        f"(see {c.log_path})")
                    c.start()
            if now >= next_sample:
                next_sample = now + 1.0
                for i, s in enumerate(servers):
                    main, workers = s.rss()
                    rss.add(now, f"server{i}", main)
                    rss.add(now, f"server{i}-workers", workers)
                for c in consumers:
                    rss.add(now, f"consumer{c.rank}", c.rss())
                for s in servers:
                    if s.alive:
                        try:
                            from dnn_worker.control import ControlClient
                            with ControlClient(s.address, s.token) as ctl:
                                max_slots = max(max_slots, ctl.stats(timeout=2.0).slots_in_use)
                        except Exception:
                            pass
            if now >= next_fault:
                next_fault = now + rnd.uniform(*fault_gap)
                # Only faults that can land now: a serving server (never one still loading), a
                # proxy with live connections, a consumer that had time to start.
                ready = [s for s in servers if s.alive and now - s.started_at > 3.0 and s.healthy()]
                applicable = {
                    "server_kill": len(ready) >= 2 and not restarts and len(ready) == len(servers),
                    "worker_kill": bool(ready),
                    "proxy_cut": any(p.live for p in proxies),
                    "consumer_restart": any(c.alive and now - c.started_at > 8.0 for c in consumers),
                }
                choices = [k for k in kinds if applicable[k]]
                if choices:
                    kind = rnd.choice(choices)
                    done = True
                    if kind == "server_kill":
                        victim = rnd.choice(ready)
                        victim.kill()
                        restarts.append((now + rnd.uniform(0.5, 3.0), victim))
                    elif kind == "worker_kill":
                        pids = rnd.choice(ready).worker_pids()
                        try:
                            os.kill(rnd.choice(pids), signal.SIGKILL)
                        except (ProcessLookupError, IndexError):
                            done = False
                    elif kind == "proxy_cut":
                        done = rnd.choice([p for p in proxies if p.live]).cut() > 0
                    else:
                        c = rnd.choice([c for c in consumers if c.alive and now - c.started_at > 8.0])
                        c.kill()
                        c.start()
                    faults[kind] += done
            time.sleep(0.1)
        end = time.monotonic()
        for c in consumers:
            c.stop()
    finally:
        for c in consumers:
            c.kill()
        for s in servers:
            s.stop(timeout=10)
        for p in proxies:
            p.close()
    rows = [r for a in audits for r in read_audit(a)]
    ref = Reference(PIPELINE, options, seed) if verify else None
    acc = account(rows, lambda rank: rank_share(per_epoch, rank, world, "drop"), ref)
    elapsed = end - t0
    return {"batches_target": batches, "max_seconds": max_seconds, "seconds": round(elapsed, 1),
            "servers": nservers, "consumers": world, "batches_per_epoch": per_epoch,
            "epochs_reached": max((r["epoch"] for r in rows), default=-1) + 1,
            **{k: acc[k] for k in ("delivered", "lost", "duplicated", "corrupt", "foreign")},
            "batches_per_s": round(acc["delivered"] / max(elapsed, 1e-9), 1),
            "faults": dict(faults), "faults_total": sum(faults.values()), "consumer_failures": consumer_failures,
            "server_failures": server_failures,
            "server_starts": [s.starts for s in servers], "max_slots_in_use": max_slots,
            "rss_mib": rss.summary(t0, end), "rss_timeline_mib": rss.timeline(t0),
            "lost_examples": acc["lost_examples"],
            "duplicated_examples": acc["duplicated_examples"], "workdir": str(work)}


def print_report(r: dict[str, Any]) -> None:
    print(f"soak: {r['seconds']}s, {r['servers']} servers, {r['consumers']} consumers, "
          f"{r['batches_per_epoch']} batches/epoch, {r['epochs_reached']} epochs reached")
    print(f"batches delivered {r['delivered']} ({r['batches_per_s']}/s), lost {r['lost']}, "
          f"duplicated {r['duplicated']}, corrupt {r['corrupt']}, foreign {r['foreign']}")
    print(f"faults injected: {r['faults_total']} " + ", ".join(f"{k}={v}" for k, v in sorted(r['faults'].items())))
    print(f"consumer failures: {r['consumer_failures']}; unplanned server exits {r['server_failures']}; server starts {r['server_starts']}; "
          f"max slots in use {r['max_slots_in_use']}")
    print("max RSS (MiB)        start      end")
    for label, e in sorted(r["rss_mib"].items()):
        print(f"  {label:<18} {e['start_max_mib']:7.1f}  {e['end_max_mib']:7.1f}")
    if r["lost_examples"] or r["duplicated_examples"]:
        print(f"lost (rank, epoch, batch): {r['lost_examples']}; duplicated: {r['duplicated_examples']}")
    print(f"logs and audit files: {r['workdir']}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["serve"]:
        p = argparse.ArgumentParser(prog="benchmarks.soak serve")
        p.add_argument("--pipeline", default=PIPELINE)
        p.add_argument("--options", default="{}")
        p.add_argument("--port", type=int, required=True)
        p.add_argument("--bulk-port", type=int, default=0)
        p.add_argument("--advertise-bulk-port", type=int, default=0)
        p.add_argument("--workers", type=int, default=1)
        p.add_argument("--slots", type=int, default=2)
        p.add_argument("--token", default=TOKEN)
        return _serve(p.parse_args(argv[1:]))
    if argv[:1] == ["consume"]:
        p = argparse.ArgumentParser(prog="benchmarks.soak consume")
        p.add_argument("--servers", required=True)
        p.add_argument("--rank", type=int, required=True)
        p.add_argument("--world", type=int, required=True)
        p.add_argument("--audit", required=True)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--epochs", type=int, default=1)
        p.add_argument("--token", default=TOKEN)
        p.add_argument("--step-s", type=float, default=0.0)
        p.add_argument("--connect-timeout", type=float, default=60.0)
        p.add_argument("--batch-timeout", type=float, default=15.0)
        p.add_argument("--window", type=int, default=4)
        return _consume(p.parse_args(argv[1:]))
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=100000, help="stop after this many batches delivered")
    p.add_argument("--max-seconds", type=float, default=600.0, help="stop after this long, whatever was delivered")
    p.add_argument("--servers", type=int, default=3, choices=(2, 3))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fault-gap", type=float, nargs=2, default=(2.0, 5.0), metavar=("MIN_S", "MAX_S"),
                   help="seconds between faults, drawn uniformly")
    p.add_argument("--faults", default=",".join(FAULT_KINDS), help=f"kinds to inject (of {','.join(FAULT_KINDS)})")
    p.add_argument("--no-verify", action="store_true", help="skip the byte check against the in-process reference")
    p.add_argument("--workdir", default=None)
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    kinds = tuple(k for k in args.faults.split(",") if k)
    bad = [k for k in kinds if k not in FAULT_KINDS]
    if bad:
        p.error(f"unknown fault kinds {bad}; choose from {FAULT_KINDS}")
    report = run_soak(args.batches, args.max_seconds, args.servers, args.seed, tuple(args.fault_gap), kinds,
                      Path(args.workdir) if args.workdir else None, verify=not args.no_verify)
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    ok = not any(report[k] for k in ("lost", "duplicated", "corrupt", "foreign", "consumer_failures",
                                      "server_failures"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
