"""Rendezvous hashing of shuffle blocks over live servers: only an arriving or departing server's blocks move."""
from __future__ import annotations

import collections

from dnn_worker.fetch.affinity import rendezvous_owner

BLOCKS = range(2000)
SALT = "0123456789abcdef"


def owners(servers) -> dict[int, str]:
    return {b: rendezvous_owner(b, tuple(servers), SALT) for b in BLOCKS}


def test_a_joining_server_takes_only_blocks_it_now_owns_and_a_fair_share():
    before = owners([f"10.0.0.{i}:6000" for i in range(4)])
    new = "10.0.0.9:6000"
    after = owners([f"10.0.0.{i}:6000" for i in range(4)] + [new])
    moved = [b for b in BLOCKS if before[b] != after[b]]
    assert moved and all(after[b] == new for b in moved)  # nothing moves between the old servers
    assert 0.12 < len(moved) / len(BLOCKS) < 0.28  # about 1/5 of the blocks


def test_a_departing_server_gives_up_only_its_own_blocks_spread_over_the_rest():
    servers = [f"10.0.0.{i}:6000" for i in range(5)]
    before = owners(servers)
    gone = servers.pop(2)
    after = owners(servers)
    moved = [b for b in BLOCKS if before[b] != after[b]]
    assert moved == [b for b in BLOCKS if before[b] == gone]
    spread = collections.Counter(after[b] for b in moved)
    assert set(spread) == set(servers) and min(spread.values()) > len(moved) / 8  # spread, not dumped on one


def test_owner_does_not_depend_on_server_order_and_comes_back_with_its_server():
    servers = [f"h{i}:1" for i in range(6)]
    assert owners(servers) == owners(list(reversed(servers)))
    assert owners(servers) == owners(servers[:3] + servers[3:])
    assert owners(servers[:5] + ["h5:1"]) == owners(servers)  # leave then rejoin: the same blocks again


def test_weighted_owners_follow_the_weights_and_equal_weights_change_nothing():
    servers = ("big:1", "small:1")
    counts = collections.Counter(rendezvous_owner(b, servers, SALT, (3.0, 1.0)) for b in BLOCKS)
    assert 0.68 < counts["big:1"] / len(BLOCKS) < 0.82  # about 3/4
    assert {b: rendezvous_owner(b, servers, SALT, (2.0, 2.0)) for b in BLOCKS} == owners(servers)
    # a third server joining takes blocks from both, and moves none between them
    before = {b: rendezvous_owner(b, servers, SALT, (3.0, 1.0)) for b in BLOCKS}
    after = {b: rendezvous_owner(b, servers + ("new:1",), SALT, (3.0, 1.0, 2.0)) for b in BLOCKS}
    assert all(after[b] in (before[b], "new:1") for b in BLOCKS)
