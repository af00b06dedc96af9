"""Run emulated nodes as processes: stream their logs, wait with a deadline, clean up, collect.

Every node is its own process group (``start_new_session``), so on exit, error or Ctrl-C
the whole tree of a node (launcher, data-server workers, trainers, loader workers) ends:
SIGTERM to the launcher, SIGKILL to it after a grace period, then to whatever of its group
is still there after a further wait, multiprocessing resource trackers last (they unlink what
the killed processes left in /dev/shm).

As SageMaker fails a job when any node fails, a node that exits non-zero (other than a
SIGTERM stop, 143) ends the whole run: the runner logs that node's error line and stops the
other nodes after ``fail_grace_s`` (time for a failing DNN node's own shutdown call to land).
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any, Mapping, cast

from .tree import Node, as_hyperparameters, node_command, node_environ

log = logging.getLogger(__name__)

EXIT_STOPPED = 143  # a DNN node stopped by SIGTERM after writing its checkpoint: not a failure
_TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ ")
_LEVEL = re.compile(r"\s(ERROR|CRITICAL)\s")
_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Fault)\b(:|$)")


class LocalCluster:
    """Processes of one emulated job.

    Args:
        nodes: from ``tree.build_nodes``.
        hyperparameters: passed on each node's command line, as SageMaker does (as strings:
            ``tree.as_hyperparameters``).
        log_dir: where each node's full log is written (``<host>.log``).
        echo: print every node's lines, prefixed ``[host role]`` (``[label host role]``), to stdout.
        sigterm_on: a drill: the first time a trainer node's log line matches this regular
            expression, SIGTERM goes to every trainer node's launcher process (not its workers),
            as SageMaker sends it on a spot interruption or StopTrainingJob. Data nodes get none:
            the DNN nodes must shut them down.
    """

    def __init__(self, nodes: list[Node], hyperparameters: Mapping[str, Any], log_dir: Path, echo: bool = True,
                 sigterm_on: str | None = None, label: str = "") -> None:
        self.nodes = nodes
        self.label = label  # echoed before each line's host: the job's name, where several jobs run
        self.hyperparameters = as_hyperparameters(hyperparameters)
        self.log_dir = Path(log_dir)
        self.echo = echo
        self.procs: dict[str, subprocess.Popen] = {}
        self._pumps: dict[str, threading.Thread] = {}
        self._print_lock = threading.Lock()
        self.sigterm_on = re.compile(sigterm_on) if sigterm_on else None
        self.sigterm_sent = threading.Event()
        self._sigterm_lock = threading.Lock()
        self._errors: dict[str, list[str]] = {}   # host -> [last ERROR line, last exception line after it]
        self.failure: str | None = None           # "host (role) exited N: its error line", first failed node

    def start(self) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for node in self.nodes:
            cpus = node.cpus
            proc = subprocess.Popen(
                node_command(sys.executable, self.hyperparameters), env=node_environ(node), cwd=node.root,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                start_new_session=True,
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
            self.procs[node.host] = proc
            t = threading.Thread(target=self._pump, args=(node, proc), name=f"log-{node.host}", daemon=True)
            t.start()
            self._pumps[node.host] = t
            log.info("started %s (%s) pid %d%s", node.host, node.role, proc.pid,
                     f" on CPUs {sorted(cpus)}" if cpus else "")

    def _pump(self, node: Node, proc: subprocess.Popen) -> None:
        prefix = f"[{self.label + ' ' if self.label else ''}{node.host} {node.role}] "
        # line-buffered: `hetero stats --local` reads the logs while the job runs
        with open(self.log_dir / f"{node.host}.log", "w", buffering=1) as f:
            for line in cast(IO[str], proc.stdout):  # started with stdout=PIPE, text=True
                f.write(line)
                self._note_error(node.host, line)
                if (self.sigterm_on is not None and node.role != "data" and not self.sigterm_sent.is_set()
                        and self.sigterm_on.search(line)):
                    self.sigterm_trainers(f"{node.host} logged {line.strip()!r}")
                if self.echo:
                    with self._print_lock:
                        sys.stdout.write(prefix + line)
                        sys.stdout.flush()

    def _note_error(self, host: str, line: str) -> None:
        text = line.strip()
        if _LEVEL.search(text):
            self._errors[host] = [text, ""]
        elif _EXCEPTION.match(text) and host in self._errors:
            self._errors[host][1] = text  # the traceback's last line, after a log.exception line
        elif _EXCEPTION.match(text):
            self._errors[host] = ["", text]

    def error_line(self, host: str) -> str:
        """The node's last ERROR line (and the exception that followed it), or ''; no timestamp."""
        parts = [_TIMESTAMP.sub("", part) for part in self._errors.get(host, ["", ""]) if part]
        return " | ".join(parts)[:2000]

    def sigterm_trainers(self, why: str) -> None:
        """SIGTERM to every trainer node's launcher process (once), as SageMaker stops a job."""
        with self._sigterm_lock:
            if self.sigterm_sent.is_set():
                return
            self.sigterm_sent.set()
            for node in self.nodes:
                proc = self.procs.get(node.host)
                if node.role != "data" and proc is not None and proc.poll() is None:
                    try:
                        os.kill(proc.pid, signal.SIGTERM)
                    except ProcessLookupError:
                        continue
                    log.warning("SIGTERM to %s (%s, pid %d): %s", node.host, node.role, proc.pid, why)

    def wait(self, timeout_s: float, data_grace_s: float = 60.0, fail_grace_s: float = 2.0) -> dict[str, int | None]:
        """Wait for every node; returns host -> exit code (None: killed at the deadline).

        Data nodes get ``data_grace_s`` after the last trainer node ends (the launcher shuts
        them down; this only bounds a broken run). When a node fails (non-zero, not 143), the
        others get ``fail_grace_s`` to end by themselves, then are stopped; ``failure`` says
        which node failed and why.
        """
        deadline = time.monotonic() + timeout_s
        trainers_done_at = None
        failed_at = None
        while True:
            codes = {h: p.poll() for h, p in self.procs.items()}
            if all(c is not None for c in codes.values()):
                break
            now = time.monotonic()
            if failed_at is None and self._first_failure(codes, killed_count=True):
                failed_at = now
            if failed_at is not None and now - failed_at > fail_grace_s:
                log.error("stopping every node: %s", self.failure)
                break
            trainer_codes = [codes[n.host] for n in self.nodes if n.role != "data"]
            if trainers_done_at is None and all(c is not None for c in trainer_codes):
                trainers_done_at = now
            if now > deadline:
                log.error("the job ran past --timeout %.0fs; stopping every node", timeout_s)
                break
            if trainers_done_at is not None and now - trainers_done_at > data_grace_s:
                log.error("data nodes still running %.0fs after the trainers ended; stopping them", data_grace_s)
                break
            time.sleep(0.2)
        self.stop()
        for t in self._pumps.values():
            t.join(5.0)
        codes = {h: p.returncode for h, p in self.procs.items()}
        self._first_failure(codes)  # a failure seen only at the end (every node exited together)
        return codes

    def _first_failure(self, codes: dict[str, int | None], killed_count: bool = False) -> bool:
        """Record and log the first node that exited non-zero (not 143); True once there is one.
        ``killed_count``: a node ended by a signal failed too (not when the runner sent it)."""
        if self.failure is not None:
            return True
        for node in self.nodes:
            code = codes.get(node.host)
            if code is not None and code not in (0, EXIT_STOPPED) and (code > 0 or killed_count):
                pump = self._pumps.get(node.host)
                if pump is not None:
                    pump.join(2.0)  # its last lines, the error among them
                why = self.error_line(node.host) or f"no error line in its log ({self.log_dir / (node.host + '.log')})"
                self.failure = f"{node.host} ({node.role}) exited {code}: {why}"
                log.error("%s", self.failure)
                return True
        return False

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop every node: SIGTERM to its launcher, trainer nodes first; SIGTERM to the rest of
        its group and SIGKILL to the launcher when that has not ended it; after a further few
        seconds SIGKILL to the group, resource trackers last.

        The launcher gets SIGTERM first and alone, as in a container stop: it ends its own workers
        in order (a loader worker killed from outside takes the trainer's clean exit with it).
        Trainer nodes go first, with the data nodes still serving, so the current step finishes
        and its checkpoint is written; data nodes get ``grace_s`` after that (or after the
        trainers' own ``grace_s``).
        """
        trainers = [self.procs[n.host] for n in self.nodes if n.role != "data" and n.host in self.procs]
        data = [p for p in self.procs.values() if p not in trainers]
        for group in (trainers, data):
            live = [p for p in group if p.poll() is None]
            if not live:
                continue
            log.info("stopping %d %s node(s): SIGTERM to their launchers", len(live),
                     "trainer" if group is trainers else "data")
            for p in live:
                with contextlib.suppress(ProcessLookupError):
                    p.send_signal(signal.SIGTERM)
            end = time.monotonic() + grace_s
            for p in live:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(max(0.1, end - time.monotonic()))
        for p in self.procs.values():
            _killpg(p, signal.SIGTERM)  # helpers left behind (forkserver, loader workers)
            if p.poll() is None:
                p.kill()
        # Give the group a moment to exit by itself before SIGKILL (resource trackers ignore SIGTERM).
        settle = time.monotonic() + 5.0
        while any(_group_alive(p) for p in self.procs.values()) and time.monotonic() < settle:
            time.sleep(0.1)
        # SIGKILL what is left, resource trackers last: a tracker unlinks the semaphores and
        # segments of killed processes once the last of them is gone; killed with them, it
        # would leave those in /dev/shm for good.
        for p in self.procs.values():
            for pid in _group_members(p.pid, trackers=False):
                log.info("SIGKILL to pid %d (group %d), still there after SIGTERM", pid, p.pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
        settle = time.monotonic() + 5.0
        while any(_group_members(p.pid, trackers=True) for p in self.procs.values()) and time.monotonic() < settle:
            time.sleep(0.1)
        for p in self.procs.values():
            _killpg(p, signal.SIGKILL)  # stragglers in the group even when the leader exited
            try:
                p.wait(5.0)
            except subprocess.TimeoutExpired:
                log.error("process %d did not die after SIGKILL", p.pid)

    def collect(self, output: Path) -> Path | None:
        """Copy every node's model/ and output/data/ into ``output/<host>/``; the job's
        metrics.json (written by rank 0) to ``output/metrics.json``. Returns its path."""
        output.mkdir(parents=True, exist_ok=True)
        metrics = None
        for node in self.nodes:
            dest = output / node.host
            for name, src in (("model", node.model_dir), ("output", node.output_dir)):
                if src.is_dir():
                    shutil.copytree(src, dest / name, dirs_exist_ok=True)
            if (node.output_dir / "metrics.json").is_file():
                metrics = output / "metrics.json"
                shutil.copy2(node.output_dir / "metrics.json", metrics)
            failure = node.root / "output" / "failure"
            if failure.is_file():
                shutil.copy2(failure, dest / "failure")
        return metrics


def _group_members(pgid: int, trackers: bool) -> list[int]:
    """Live processes of group ``pgid`` that are (``trackers=True``) or are not multiprocessing
    resource trackers. Reads /proc; where there is none, every member counts as a non-tracker
    and is found through the leader only."""
    if not os.path.isdir("/proc/self"):
        return [] if trackers else [pgid]
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2:].split()  # after "pid (comm) "
            if fields[0] == b"Z" or int(fields[2]) != pgid:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                is_tracker = b"multiprocessing.resource_tracker" in f.read()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        if is_tracker == trackers:
            found.append(int(entry))
    return found


def _group_alive(proc: subprocess.Popen) -> bool:
    try:
        os.killpg(proc.pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _killpg(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
