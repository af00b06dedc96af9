"""data_service.storage.filecache: one folder of entries shared by the processes of a host, within a budget."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal

import pytest

from data_service.storage.filecache import COUNTER, FOLDER_LOCK, CacheError, FileCache

CTX = mp.get_context("fork")  # the children run only os calls and FileCache


def _entries(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if not n.startswith(".") and not n.endswith((".lock", ".part")))


def _put_many(directory: str, budget: int, writer: int, names: int, size: int, start) -> None:
    cache = FileCache(directory, budget, evict=False)
    start.wait(30)
    for i in range(names):  # every writer offers every name: each is stored once
        cache.put(f"e{i:03d}", [bytes([writer]) * size])


def test_concurrent_writers_across_processes_keep_the_count_and_the_budget_exact(tmp_path):
    directory, size = str(tmp_path / "c"), 1000
    start = CTX.Event()
    procs = [CTX.Process(target=_put_many, args=(directory, 25 * size, w, 40, size, start)) for w in range(4)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    names = _entries(directory)
    assert len(names) == 25 and FileCache(directory, 0).held() == (25 * size, 25)
    for name in names:  # whole entries, each from one writer
        data = FileCache(directory, 0).read(name)
        assert len(data) == size and len(set(data)) == 1
    assert not [n for n in os.listdir(directory) if n.endswith(".part")]


def test_without_evict_entries_past_the_budget_are_refused(tmp_path):
    cache = FileCache(str(tmp_path), 300, evict=False)
    assert cache.put("a", [b"x" * 100, b"y" * 100]) and cache.put("b", [b"z" * 100])
    assert not cache.put("c", [b"w"]) and cache.full
    assert cache.read("a") == b"x" * 100 + b"y" * 100 and cache.read("c") is None
    assert cache.held() == (300, 2)
    assert FileCache(str(tmp_path), 300, evict=False).put("a", [b"again"])  # stored already: nothing to add


def test_evict_removes_the_least_recently_used_and_recounts(tmp_path):
    cache = FileCache(str(tmp_path), 3000)
    for name in ("a", "b", "c"):
        assert cache.put(name, [b"a" * 1000])
        os.utime(cache.path(name), (1e9 + ord(name), 1e9 + ord(name)))
    os.close(cache.open("a"))  # used again: now the newest
    assert cache.put("d", [b"d" * 1000])
    assert _entries(tmp_path) == ["a", "c", "d"] and cache.held() == (3000, 3)
    os.unlink(cache.path("c"))  # gone behind the cache's back: the next eviction recounts
    fd = cache.fetch("e", 2000, lambda out: os.pwrite(out, b"e" * 2000, 0))
    assert os.pread(fd, 10, 0) == b"e" * 10
    os.close(fd)
    assert _entries(tmp_path) == ["d", "e"] and cache.held() == (3000, 2)


def test_a_stuck_fill_times_out_and_a_short_one_is_not_kept(tmp_path):
    import fcntl

    cache = FileCache(str(tmp_path / "d"), 1 << 20, wait_s=0.2)
    holder = os.open(cache.path("slow") + ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)  # another process's fill that never ends
    with pytest.raises(CacheError, match="slow: another process of this host has been writing it"):
        cache.fetch("slow", 10, lambda out: os.pwrite(out, b"s" * 10, 0))
    with pytest.raises(CacheError, match="filled 3 bytes, expected 10"):
        cache.fetch("short", 10, lambda out: os.pwrite(out, b"abc", 0))
    assert not cache.cached("short") and not [n for n in os.listdir(cache.dir) if n.endswith(".part")]


def test_a_folder_without_a_count_is_counted_from_its_files(tmp_path):
    (tmp_path / "old1").write_bytes(b"1" * 700)
    (tmp_path / "old2").write_bytes(b"2" * 200)
    cache = FileCache(str(tmp_path), 1000, evict=False)
    assert cache.put("new", [b"n" * 100]) and not cache.put("more", [b"m"])
    with open(cache.path(FOLDER_LOCK), "rb") as f:
        assert COUNTER.unpack(f.read(COUNTER.size)) == (1000, 3)


def _use_and_wait(directory: str, ready, done) -> None:
    cache = FileCache(directory, 1 << 20, evict=False, shared=True)
    cache.put("x", [b"x"])
    ready.set()
    done.wait(30)
    cache.close()


def _other_user(directory: str):
    """Another process that stores entry x in the shared folder and uses it until told (the Event)."""
    ready, done = CTX.Event(), CTX.Event()
    other = CTX.Process(target=_use_and_wait, args=(directory, ready, done))
    other.start()
    assert ready.wait(30)
    return other, done


def test_the_folder_goes_with_its_last_user(tmp_path):
    directory = str(tmp_path / "shared")
    other, done = _other_user(directory)
    mine = FileCache(directory, 1 << 20, evict=False, shared=True)
    assert mine.read("x") == b"x"
    assert not mine.close() and os.path.isdir(directory)  # the other process still uses it
    done.set()
    other.join(30)
    assert other.exitcode == 0 and not os.path.exists(directory)  # it was the last


def test_a_killed_user_leaves_the_folder_to_the_last_one_alive(tmp_path):
    directory = str(tmp_path / "shared")
    other, _ = _other_user(directory)
    os.kill(other.pid, signal.SIGKILL)
    other.join(30)
    again = FileCache(directory, 1 << 20, evict=False, shared=True)
    assert again.read("x") == b"x" and again.close() and not os.path.exists(directory)
    later = FileCache(directory, 1 << 20, evict=False, shared=True)  # a user after the removal: a new folder
    assert later.read("x") is None and later.put("y", [b"y"]) and later.held() == (1, 1)
    assert later.close() and not os.path.exists(directory)
