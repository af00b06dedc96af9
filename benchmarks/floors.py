"""What the kernel alone charges for moving a batch: the CPU floors under any data plane.

    python -m benchmarks.floors [--sizes 0.0625,4] [--seconds 3] [--repeats 3]

Two processes on loopback, no data service, no Python work beyond the system calls:

* ``raw_tcp_cpu``: one process ``sendall``s ready messages of a size, the other ``recv_into``s a
  preallocated buffer; CPU per message of both (utime + stime from /proc). On loopback the
  sender also does the receiving side's TCP work, and each end copies the bytes once, so no TCP
  data plane on one machine can cost less per batch of that size.
* ``round_trip_cpu``: a small message (a batch header) one way and a smaller one back (a release),
  each side asleep in ``epoll`` until its message arrives; CPU per round trip of both. A batch
  delivered to a consumer that waits for it, from a slot it must give back, costs at least this
  (the shared-memory path), before the server's own exchange with its worker.

benchmarks/dataplane.py prints both beside the service's figures, measured in the same run.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import select
import socket
import sys
import time

from data_service.protocol import framing

from .common import cli, report
from .common.proc import usage

KB, MB = 1 << 10, 1 << 20
HEADER_BYTES, RELEASE_BYTES = 120, 30  # about a shared-memory batch frame and a release frame


def _connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _sender(port: int, size: int) -> None:
    view = memoryview(os.urandom(KB) * (size // KB) + os.urandom(size % KB))
    with _connect(port) as s:
        try:
            while True:
                s.sendall(view)
        except OSError:
            return  # the receiver is done


def _echo(port: int) -> None:
    reply = b"r" * RELEASE_BYTES
    with _connect(port) as s, select.epoll() as ep:
        ep.register(s.fileno(), select.EPOLLIN)
        try:
            while True:
                ep.poll(5.0)
                if not s.recv(4096):
                    return
                s.send(reply)
        except OSError:
            return


def _pair(target, *args) -> tuple[mp.Process, socket.socket, socket.socket]:
    lst = socket.socket()
    lst.bind(("127.0.0.1", 0))
    lst.listen(1)
    lst.settimeout(60)
    proc = mp.get_context("spawn").Process(target=target, args=(lst.getsockname()[1], *args), daemon=True)
    proc.start()
    conn, _ = lst.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.settimeout(10)
    return proc, conn, lst


def _measure(proc: mp.Process, step, seconds: float, warmup: int) -> tuple[float, float, int]:
    for _ in range(warmup):
        step()
    peer0, own0, n, start = usage([proc.pid])[0], usage([os.getpid()])[0], 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step()
        n += 1
    elapsed = time.perf_counter() - start
    return (usage([proc.pid])[0] - peer0) / n, (usage([os.getpid()])[0] - own0) / n, round(n / elapsed)


def _close(proc: mp.Process, conn: socket.socket, lst: socket.socket) -> None:
    conn.close()
    lst.close()
    proc.join(5)
    if proc.is_alive():
        proc.kill()
        proc.join(5)


def raw_tcp_cpu(size: int, seconds: float) -> dict:
    """CPU ms per ``size``-byte message of a raw TCP pair (sender and receiver), and messages/s."""
    proc, conn, lst = _pair(_sender, size)
    view = memoryview(bytearray(size))

    def step() -> None:
        framing.recv_into(conn, view)  # raises PeerClosed if the sender went away

    try:
        send_s, recv_s, rate = _measure(proc, step, seconds, warmup=20)
    finally:
        _close(proc, conn, lst)
    return {"size": size, "per_s": rate, "sender_ms": send_s * 1e3, "receiver_ms": recv_s * 1e3,
            "total_ms": (send_s + recv_s) * 1e3}


def round_trip_cpu(seconds: float) -> dict:
    """CPU ms per small-message round trip of two processes that sleep in epoll between messages."""
    proc, conn, lst = _pair(_echo)
    head = b"h" * HEADER_BYTES
    ep = select.epoll()
    ep.register(conn.fileno(), select.EPOLLIN)

    def step() -> None:
        conn.send(head)
        if not ep.poll(5.0) or not conn.recv(4096):
            raise ConnectionError("round-trip peer went away")

    try:
        peer_s, own_s, rate = _measure(proc, step, seconds, warmup=1000)
    finally:
        ep.close()
        _close(proc, conn, lst)
    return {"per_s": rate, "waiter_ms": own_s * 1e3, "replier_ms": peer_s * 1e3, "total_ms": (own_s + peer_s) * 1e3}


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--sizes", default="0.0625,4", help="raw TCP message sizes in MB")
    cli.add_timing(parser)
    args = parser.parse_args(argv)
    print(f"CPU floors on loopback, {os.cpu_count()} cores, {args.repeats} runs x {args.seconds}s per point (medians)")
    print("| point | per second | CPU ms, one side | other side | both |")
    print("|---|---:|---:|---:|---:|")
    for mb in args.sizes.split(","):
        size = int(float(mb) * MB)
        runs = [raw_tcp_cpu(size, args.seconds) for _ in range(args.repeats)]
        med = report.medians(runs, ("per_s", "sender_ms", "receiver_ms", "total_ms"))
        print(f"| raw TCP, {size // KB} KB messages (sender / receiver) | {med['per_s']:,.0f} | {med['sender_ms']:.3f} "
              f"| {med['receiver_ms']:.3f} | {med['total_ms']:.3f} |", flush=True)
    runs = [round_trip_cpu(args.seconds) for _ in range(args.repeats)]
    med = report.medians(runs, ("per_s", "waiter_ms", "replier_ms", "total_ms"))
    print(f"| round trip, {HEADER_BYTES} B out and {RELEASE_BYTES} B back (waiter / replier) | {med['per_s']:,.0f} "
          f"| {med['waiter_ms']:.3f} | {med['replier_ms']:.3f} | {med['total_ms']:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
