"""The corruption campaign's ``request`` place: one byte of what a consumer sends, flipped on the way.

One server of the pair is reached through a :class:`corrupt.FlipProxy` that flips one byte of the
next connection's client -> server stream: the consumer's hello, its requests or its block hints,
at a random offset within what one epoch sends (learnt from a clean epoch). The server must answer
a damaged frame at once (an error naming it, then it closes) and the consumer ask again on a new
connection: never train on another batch than the one it asked for, never wait out its
``batch_timeout``. A damaged frame the consumer sent after its last batch was asked for (a hint,
a request the other server answered first) is named in the server's log only; the trial counts as
detected when that line appears. So each trial keeps its **seconds**: a stall would show as the campaign
consumer's ``batch_timeout`` (20 s) or more, against well under a second for a clean epoch.
"""
from __future__ import annotations

import random
import statistics
import time
from typing import Callable


def trials(count: int, rng: random.Random, options: dict, seed: int, audit: str, results: list,
           pair: Callable, epoch: Callable) -> None:
    """``count`` trials on a pair started with ``pair(options, proxy=True)``, each an ``epoch(servers,
    ref, seed, audit)`` (benchmarks.corruption's) with one request byte flipped; appended to ``results``
    with ``place="request"`` and ``seconds``."""
    from benchmarks.common.corrupt import PIPELINE
    from hetero.testing import Reference

    if not count:
        return
    ref = Reference(PIPELINE, options, seed).digests(0)
    servers, flip = pair(options, proxy=True)
    try:
        start = time.monotonic()
        epoch(servers, ref, seed, audit)  # warm; and what the consumer sends the proxied server per epoch
        clean_s, sent = time.monotonic() - start, flip.sent
        said_before = _server_log(servers[1]).count(DROPPED)
        for _ in range(count):
            flip.flipped = 0
            flip.arm(rng.randrange(sent), 1 << rng.randrange(8), requests=True)
            start = time.monotonic()
            r = epoch(servers, ref, seed, audit)
            r.update(place="request", seconds=round(time.monotonic() - start, 2), clean_seconds=round(clean_s, 2))
            flip.disarm()
            r["flipped"] = flip.flipped
            if not flip.flipped:
                r["outcome"] = "harmless"  # the offset lay past what this epoch sent that server
            elif r["outcome"] == "harmless":  # the consumer had every batch before the server's answer came
                said = _server_said(servers[1], said_before)
                if said:
                    r.update(outcome="detected", error=said)
            said_before = _server_log(servers[1]).count(DROPPED)
            results.append(r)
    finally:
        for s in servers:
            s.stop()
        flip.close()


DROPPED = "data plane: dropping"  # how a server's log names a consumer's connection it ended


def _server_log(server) -> str:
    return server._log_tail(1 << 24)


def _server_said(server, before: int, wait_s: float = 2.0) -> str:
    """The line in which ``server`` named a damaged frame after its first ``before`` such lines,
    waited for up to ``wait_s`` (a damaged length is named once the frame is 1 s incomplete)."""
    deadline = time.monotonic() + wait_s
    while True:
        lines = [ln for ln in _server_log(server).splitlines() if DROPPED in ln]
        if len(lines) > before or time.monotonic() > deadline:
            return lines[before][:300] if len(lines) > before else ""
        time.sleep(0.1)


def times(results: list[dict]) -> str:
    """One line on the request trials' seconds (empty without any)."""
    secs = [r["seconds"] for r in results if r.get("place") == "request"]
    if not secs:
        return ""
    clean = next(r["clean_seconds"] for r in results if r.get("place") == "request")
    return (f"  request: each trial's seconds: median {statistics.median(secs):.2f}, longest {max(secs):.2f} "
            f"(a clean epoch {clean:.2f}; a stall would be the consumer's batch_timeout, 20 s): "
            + " ".join(f"{s:.2f}" for s in secs))
