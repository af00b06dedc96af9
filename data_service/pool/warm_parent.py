"""The warm parent: a small process that imports torch and the pipeline module once, then forks
data workers on request (the server's side is forked.py).

It is started with spawn, so it holds nothing of the server: no gRPC, no thread, no socket but
its control socket to the server. Each request carries the server's environment of that moment,
the worker's pickled target and arguments, and the worker's pipe ends as descriptors
(``socket.send_fds``). The child applies the environment first, then unpickles and runs the
target; the parent answers with the child's pid and a pidfd, and writes the child's exit code to
the request's status pipe once it reaps it. It exits when the server closes the socket (or dies).

Only the standard library is imported here at module level: the parent must not load the worker
module, which imports the generated gRPC stubs; a forked child imports it for itself.
"""
from __future__ import annotations

import io
import os
import pickle
import select
import signal
import socket
import struct
import sys
import traceback

HEADER = struct.Struct("!I")  # the length of the pickled message that follows
CODE = struct.Struct("!i")    # an exit code on a status pipe
MAX_FDS = 16
COMM = "hetero-warm"  # its process name (/proc/PID/comm), so that tools tell it from its workers
PARENT_CHECK_S = 5.0  # how often an idle warm parent checks that the server is still its parent


def send_msg(sock: socket.socket, obj, fds: list[int] = ()) -> None:
    body = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    socket.send_fds(sock, [HEADER.pack(len(body))], list(fds))
    sock.sendall(body)


def recv_msg(sock: socket.socket):
    """(message, fds); (None, []) once the other end closed the socket."""
    head, fds, _, _ = socket.recv_fds(sock, HEADER.size, MAX_FDS)
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


def threads() -> list[str]:
    """The names of this process's threads (the kernel's view: native ones count too)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            continue  # ended meanwhile
    return names


def main(ctrl: socket.socket, preload: list[str]) -> None:
    """The warm parent's body (the target of its spawned process)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle; it stops us
    comm = _rename(COMM)
    # OpenBLAS starts a thread pool when numpy loads; a parent with threads could fork one while
    # another holds a lock. Data workers run torch on one thread each (process.py) anyway.
    os.environ["OPENBLAS_NUM_THREADS"] = "1"
    error = None
    for name in preload:
        try:
            __import__(name)
        except BaseException as exc:  # the pipeline's own import error: the server logs it and spawns
            error = f"importing {name!r} failed: " + "".join(traceback.format_exception_only(exc)).strip()
            break
    send_msg(ctrl, {"pid": os.getpid(), "error": error, "threads": threads(), "grpc": "grpc" in sys.modules})
    if error is None:
        _serve(ctrl, comm)


def _rename(name: str) -> str:
    """Set this process's name; returns the one it had."""
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
    while os.getppid() == server:  # a server killed with -9 closes the socket too; this is the backstop
        ready, _, _ = select.select([ctrl, wake_r], [], [], PARENT_CHECK_S)
        if wake_r in ready:
            os.read(wake_r, 4096)
            _reap(children)
        if ctrl in ready:
            msg, fds = recv_msg(ctrl)
            if msg is None:
                return  # the server is done with us, or gone
            _fork(ctrl, msg, fds, children, (wake_r, wake_w), comm)


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
            try:
                os.write(fd, CODE.pack(os.waitstatus_to_exitcode(status)))
            except OSError:
                pass  # the server closed its end: nobody asks any more
            os.close(fd)


def _fork(ctrl: socket.socket, msg: dict, fds: list[int], children: dict[int, int], own: tuple, comm: str) -> None:
    """Fork one worker for request ``msg``; ``fds``: its status pipe's write end, then its pipe ends."""
    status_w, passed = fds[0], fds[1:]
    names = threads()
    if len(names) > 1:  # never fork beside another thread (it may hold a lock the child would inherit held)
        send_msg(ctrl, {"error": f"the warm parent runs {len(names)} threads ({', '.join(names)})"})
        for fd in fds:
            os.close(fd)
        return
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
        _rename(comm)  # named as a spawned worker is
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
