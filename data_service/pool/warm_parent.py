"""The warm parent: a small process that imports what the data workers will import, once, then
forks them on request (the server's side is forked.py).

It is started as a fresh interpreter (``python -c``, given the server's ``sys.path``), never
through multiprocessing's spawn: spawn imports the server's ``__main__`` again, and a user's
script (or torchrun's, or Lightning's) imports grpc at its top, which a fork must not copy.
So it holds nothing of the server: no gRPC, no thread, no socket but its control socket.

Its first request says what to preload (preload.py: torch, the worker's code path, the
pipeline's module and what its builder declares); later requests are forks, or more modules to
import (what the first worker imported while building). Each fork request carries the server's
environment of that moment, the worker's pickled target and arguments, and the worker's pipe
ends as descriptors (``socket.send_fds``). The child applies the environment first, then
unpickles and runs the target; the parent answers with the child's pid and a pidfd, and writes
the child's exit code to the request's status pipe once it reaps it. Before each fork it checks
that it holds nothing unsafe (fork_safety.py) and freezes its objects out of the garbage
collector's reach, so that a worker's collections do not write to (and so copy) the pages it
shares. It exits when the server closes the socket (or dies).

Only the standard library is imported here at module level.
"""
from __future__ import annotations

import contextlib
import gc
import io
import os
import pickle
import select
import signal
import socket
import struct
import sys
import traceback
from typing import Sequence

from .fork_safety import hazards
from .preload import BASE, declared, import_all

HEADER = struct.Struct("!I")  # the length of the pickled message that follows
CODE = struct.Struct("!i")    # an exit code on a status pipe
MAX_FDS = 16
COMM = "hetero-warm"  # its process name (/proc/PID/comm), so that tools tell it from its workers
PARENT_CHECK_S = 5.0  # how often an idle warm parent checks that the server is still its parent


def send_msg(sock: socket.socket, obj, fds: Sequence[int] = ()) -> None:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    socket.send_fds(sock, [HEADER.pack(len(body))], list(fds))
    sock.sendall(body)


def recv_msg(sock: socket.socket):
    """(message, fds); (None, []) once the other end closed the socket (or reset it: it exited)."""
    try:
        head, fds, _, _ = socket.recv_fds(sock, HEADER.size, MAX_FDS)
    except ConnectionResetError:
        return None, []
    if not head:
        return None, fds
    head += _exactly(sock, HEADER.size - len(head))
    return pickle.loads(_exactly(sock, HEADER.unpack(head)[0])), fds


def _exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError(f"the socket closed {n - len(buf)} bytes short of a message")
        buf += chunk
    return bytes(buf)


def boot(fd: int) -> None:
    """The entry of the warm parent's ``python -c`` (forked.py), ``fd``: its control socket."""
    main(socket.socket(fileno=fd))


def main(ctrl: socket.socket) -> None:
    """The warm parent's body: preload as the first request says, report, then serve forks."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle; it stops us
    comm = rename(COMM)
    # OpenBLAS starts a thread pool when numpy loads; a parent with threads could fork one while
    # another holds a lock. Data workers run torch on one thread each (process.py) anyway.
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    _server_as_parent()
    msg, _ = recv_msg(ctrl)
    if msg is None:
        return  # the server went away before it asked
    report = _preload(msg["spec"], msg.get("names", BASE))
    try:
        send_msg(ctrl, {"pid": os.getpid(), **report})
    except OSError:
        return  # the server exited while this preloaded (a start-up error): nobody to report to
    if report["error"] is None and report["unsafe"] is None:
        _serve(ctrl, comm)


def _server_as_parent() -> None:
    """``multiprocessing.parent_process()`` in the workers forked from here is the server, as in a
    spawned worker (pipelines tell a worker from the server's own process by it). Its sentinel is
    a pidfd: readable once the server exits."""
    from multiprocessing import process

    server = os.getppid()
    # multiprocessing's internals, which the stubs leave out
    process._parent_process = process._ParentProcess(  # type: ignore[attr-defined]
        "MainProcess", server, os.pidfd_open(server))


def _preload(spec_json: str, base) -> dict:
    """Import ``base``, the pipeline's module and what its builder declares; the merged report."""
    done = import_all(base, required=frozenset(base), why=" (which every data worker imports)")
    names: list[str]
    module, names, bad = None, [], None
    if done.error is None and done.unsafe is None:
        module = declared(spec_json)[0]
        if module:
            more = import_all([module], required=frozenset([module]), why=" (the pipeline's module)")
            done.imported += more.imported
            done.error, done.unsafe = more.error, more.unsafe
    if done.error is None and done.unsafe is None and module:
        _, names, bad = declared(spec_json)
        more = import_all(names, why=" (in the pipeline builder's worker_imports)")
        done.imported += more.imported
        done.failed.update(more.failed)
        done.unsafe = more.unsafe
    _freeze()
    return {**done.report(), "declared": names, "declared_error": bad}


def _freeze() -> None:
    """Move every object this process holds out of the collector's generations: a forked
    worker's collections then never write to the pages it shares with this parent."""
    gc.collect()
    gc.freeze()


def rename(name: str) -> str:
    """Set this process's name (``/proc/self/comm``); returns the one it had."""
    try:
        with open("/proc/self/comm", "r+") as f:
            old = f.read().strip()
            f.seek(0)
            f.write(name)
        return old
    except OSError:
        return name  # no procfs: tools then tell it by its children


def _serve(ctrl: socket.socket, comm: str) -> None:
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that the wakeup fd is written
    signal.set_wakeup_fd(wake_w)
    children: dict[int, int] = {}  # pid -> the write end of its status pipe
    server = os.getppid()
    # poll, not select: the descriptors keep the numbers they had in the server, which may be past 1023
    poller = select.poll()
    poller.register(ctrl, select.POLLIN)
    poller.register(wake_r, select.POLLIN)
    while os.getppid() == server:  # a server killed with -9 closes the socket too; this is the backstop
        ready = {fd for fd, _ in poller.poll(PARENT_CHECK_S * 1000)}
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(children)
        if ctrl.fileno() in ready:
            msg, fds = recv_msg(ctrl)
            if msg is None:
                return  # the server is done with us, or gone
            if msg.get("op") == "import":
                _import(ctrl, msg)
            else:
                _fork(ctrl, msg, fds, children, (wake_r, wake_w), comm)


def _import(ctrl: socket.socket, msg: dict) -> None:
    """Import more modules (what a worker imported while building), so later forks share them."""
    done = import_all(msg["names"], why=msg.get("why", ""))
    _freeze()
    send_msg(ctrl, done.report())


def _reap(children: dict[int, int]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = children.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):  # the server closed its end: nobody asks any more
                os.write(fd, CODE.pack(os.waitstatus_to_exitcode(status)))
            os.close(fd)


def _fork(ctrl: socket.socket, msg: dict, fds: list[int], children: dict[int, int], own: tuple, comm: str) -> None:
    """Fork one worker for request ``msg``; ``fds``: its status pipe's write end, then its pipe ends."""
    status_w, passed = fds[0], fds[1:]
    found = hazards(own_sockets=1 + len(passed))  # its control socket, and the worker's pipe ends
    if not found.clean:  # e.g. a thread may hold a lock the child would inherit held, for good
        send_msg(ctrl, {"error": f"the warm parent {found}"})
        for fd in fds:
            os.close(fd)
        return
    gc.freeze()  # what the last request left behind, too
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(msg, passed, ctrl, [status_w, *own, *children.values()], comm)
    children[pid] = status_w
    for fd in passed:
        os.close(fd)
    pidfd = os.pidfd_open(pid)  # race-free: the child cannot be reaped before we wait for it
    try:
        send_msg(ctrl, {"pid": pid}, [pidfd])
    finally:
        os.close(pidfd)


def _child(msg: dict, passed: list[int], ctrl: socket.socket, inherited: list[int], comm: str) -> None:
    """The forked worker: the server's environment first, then its target; never returns."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(msg["env"])
        rename(comm)  # named as a spawned worker is
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        ctrl.close()
        for fd in inherited:
            os.close(fd)
        import multiprocessing

        multiprocessing.current_process().name = msg["name"]
        if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator from the OS
            sys.modules["numpy"].random.seed()
        target, args = _FdUnpickler(io.BytesIO(msg["payload"]), passed).load()
        target(*args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class _FdUnpickler(pickle.Unpickler):
    """Rebuilds the pipe ends the server pickled as persistent ids (forked.py) from passed fds."""

    def __init__(self, file, fds: list[int]) -> None:
        super().__init__(file)
        self._fds = fds

    def persistent_load(self, pid):
        from multiprocessing.connection import Connection

        kind, index, readable, writable = pid
        if kind != "connection":
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return Connection(self._fds[index], readable, writable)
