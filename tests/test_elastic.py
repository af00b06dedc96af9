"""Servers that join and leave a running job through a registry: real servers, real consumers.

Data servers run in this process (real worker processes, real ports) or as ``hetero serve --join``
processes (to kill -9 them); consumer ranks are threads iterating ``RemoteDataset``, each writing
the audit log that ``check_audit`` accounts against the in-process bytes.
"""
from __future__ import annotations

import argparse
import logging
import os
import threading
import time

import pytest

from conftest import TOKEN
from data_service.membership import joining, registry
from data_service.errors import ServerUnavailableError
from data_service.contract.pipeline import PipelineSpec
from data_service.server import DataServer, ServerOptions
from dnn_worker import RemoteDataset
from hetero.testing import ServerProc, check_audit

PIPELINE = "examples.synthetic:build_pipeline"
OPTIONS = {"size": 384, "batch_size": 4}  # 96 batches an epoch


@pytest.fixture
def servers():
    """``servers(options, token=...)`` starts an in-process server; all stop at teardown."""
    started: list[DataServer] = []

    def make(options: dict = OPTIONS, token: str = TOKEN) -> DataServer:
        s = DataServer(PipelineSpec(PIPELINE, options), token, ServerOptions(num_workers=1, probe=False)).start()
        started.append(s)
        return s

    yield make
    for s in started:
        s.leave_delay_s = 0.0
        s.shutdown(grace_s=2.0, block=False)
    for s in started:
        s.wait(10.0)


class Ranks:
    """``world`` consumer ranks on threads, each reading one epoch with a pause per batch."""

    def __init__(self, reg: str, audit, world: int, step_s: float, servers=None, **kw) -> None:
        self.datasets = [RemoteDataset(servers, TOKEN, registry=reg, seed=3, rank=r, world_size=world,
                                       audit_path=audit, connect_timeout=20, batch_timeout=20, **kw)
                         for r in range(world)]
        self.step_s = step_s
        self.count = [0] * world
        self.first_from: dict[str, list[float | None]] = {}
        self.errors: list[BaseException] = []
        self.threads = [threading.Thread(target=self._run, args=(r,), daemon=True) for r in range(world)]

    def watch(self, address: str) -> None:
        """Note when each rank first has a batch from ``address``."""
        self.first_from[address] = [None] * len(self.datasets)

    def _run(self, rank: int) -> None:
        ds = self.datasets[rank]
        try:
            for _ in ds:
                self.count[rank] += 1
                time.sleep(self.step_s)
                stats = ds.fetcher.stats()
                for address, firsts in self.first_from.items():
                    if firsts[rank] is None and stats.get(address, 0) > 0:
                        firsts[rank] = time.monotonic()
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.errors.append(exc)

    def start(self) -> "Ranks":
        for t in self.threads:
            t.start()
        return self

    def wait_batches(self, n: int, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while min(self.count) < n and time.monotonic() < end:
            time.sleep(0.05)

    def join(self, timeout: float = 60.0) -> None:
        for t in self.threads:
            t.join(timeout)
        assert not any(t.is_alive() for t in self.threads), "a rank did not finish its epoch"
        assert not self.errors, self.errors


def exactly_once(audit, world: int) -> None:
    counts = check_audit(audit, OPTIONS, seed=3, world=world, pipeline=PIPELINE)
    assert counts["lost"] == counts["duplicated"] == counts["corrupt"] == 0, counts
    assert counts["delivered"] == 96 // world * world


@pytest.mark.slow
def test_a_server_that_joins_mid_epoch_serves_every_rank_within_5s(servers, tmp_path):
    reg = str(tmp_path / "registry")
    a = servers()
    joining.join(a, reg, a.address)
    b = servers()  # started, not yet registered
    ranks = Ranks(reg, tmp_path / "audit.jsonl", world=4, step_s=0.12).start()
    ranks.watch(b.address)
    ranks.wait_batches(3)
    joined = time.monotonic()
    joining.join(b, reg, b.address)
    ranks.join()
    exactly_once(tmp_path / "audit.jsonl", 4)
    latency = [t - joined if t else None for t in ranks.first_from[b.address]]
    assert all(t is not None and t < 5.0 for t in latency), latency
    assert b.stats.snapshot().batches_sent > 0


@pytest.mark.slow
def test_drain_mid_epoch_unregisters_first_and_loses_nothing(servers, tmp_path):
    from hetero.commands import shutdown

    reg = str(tmp_path / "registry")
    a, b = servers(), servers()
    joining.join(a, reg, a.address)
    joining.join(b, reg, b.address, leave_delay_s=1.0)
    ranks = Ranks(reg, tmp_path / "audit.jsonl", world=2, step_s=0.05).start()
    ranks.wait_batches(8)
    sent_before = b.stats.snapshot().batches_sent
    assert sent_before > 0
    rc = shutdown.run(argparse.Namespace(servers=[b.address], token=TOKEN, grace=10.0, drain=True))
    assert rc == 0 and b.stopped
    assert [e.server_id for e in registry.read_entries(reg)[0]] == [a.server_id]
    ranks.join()
    exactly_once(tmp_path / "audit.jsonl", 2)
    assert min(ranks.count) == 48


@pytest.mark.slow  # a whole process tree: the slow tier
def test_hetero_serve_join_registers_and_unregisters_on_sigterm(tmp_path):
    reg = tmp_path / "registry"
    server = ServerProc(OPTIONS, log_path=tmp_path / "serve.log")
    server.cmd += ["--join", str(reg), "--advertise-host", "127.0.0.1", "--leave-delay", "0.2"]
    server.start()
    try:
        entries, problems = registry.read_entries(str(reg))
        assert [e.address for e in entries] == [server.address] and problems == []
        fingerprint = PipelineSpec(PIPELINE, OPTIONS).fingerprint()
        assert registry.verify(entries[0], TOKEN, fingerprint) is None
    finally:
        server.stop()
    assert server.proc.returncode == 0, (tmp_path / "serve.log").read_text()[-2000:]
    assert registry.read_entries(str(reg)) == ([], [])


@pytest.mark.slow
def test_entries_without_the_token_or_of_another_pipeline_are_refused(servers, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    reg = str(tmp_path / "registry")
    a = servers()
    joining.join(a, reg, a.address)
    other_job = servers(token="another-jobs-token")
    registry.register(reg, "another-jobs-token", other_job.server_id, other_job.address,
                      other_job.dataset_info.fingerprint)
    other_pipe = servers({**OPTIONS, "size": 200})
    joining.join(other_pipe, reg, other_pipe.address)
    # an entry that claims the job's pipeline for a server that runs another one
    registry.register(reg, TOKEN, "claims-the-job-pipeline", f"localhost:{other_pipe.port}",
                      a.dataset_info.fingerprint)
    (tmp_path / "registry" / "servers" / "torn.json").write_text('{"address": ')
    ranks = Ranks(reg, tmp_path / "audit.jsonl", world=2, step_s=0.0).start()
    ranks.join()
    exactly_once(tmp_path / "audit.jsonl", 2)
    # the other job's server never saw this job's token: no call reached it at all
    assert other_job.stats.snapshot().auth_failures == 0
    assert other_job.stats.snapshot().batches_sent == other_pipe.stats.snapshot().batches_sent == 0
    text = caplog.text
    assert text.count("proof does not match the job token") == 1
    assert text.count(f"serves pipeline fingerprint {other_pipe.dataset_info.fingerprint}") == 1
    assert text.count("refused data server claims-the-job-pipeline") == 1  # at its Hello, once for both ranks
    assert text.count("torn.json: not JSON") == 1


@pytest.mark.slow  # the watcher's side of a registry that hangs or fails runs by default in test_registry.py
def test_an_unreadable_registry_leaves_the_job_on_its_servers(servers, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    reg = tmp_path / "registry"
    a = servers()
    joining.join(a, str(reg), a.address)
    ranks = Ranks(str(reg), tmp_path / "audit.jsonl", world=2, step_s=0.12).start()
    ranks.wait_batches(5)
    os.rename(reg, tmp_path / "moved")  # unreachable: reads fail for a few polls
    time.sleep(2.0)
    os.rename(tmp_path / "moved", reg)
    ranks.join()
    exactly_once(tmp_path / "audit.jsonl", 2)
    assert caplog.text.count("cannot be read") == 1  # once per change of state, not per poll
    assert caplog.text.count("can be read again") == 1


def test_registry_only_consumer_waits_for_a_server_then_names_the_registry(tmp_path):
    reg = tmp_path / "registry"
    reg.mkdir()
    ds = RemoteDataset(None, TOKEN, registry=str(reg), connect_timeout=1.5)
    with pytest.raises(ServerUnavailableError, match="registry .* has no usable server.*--join"):
        len(ds)


def test_a_registry_alone_is_enough(servers, tmp_path):
    # RemoteDataset(registry=..., token=...): no server list at all, by keyword only.
    reg = str(tmp_path / "registry")
    a = servers()
    joining.join(a, reg, a.address)
    ds = RemoteDataset(registry=reg, token=TOKEN, seed=3, connect_timeout=20)
    assert len(list(ds)) == 96 and ds.fetcher.stats() == {a.address: 96}


@pytest.mark.slow  # ~19 s on one core; rebalancing itself is unit-tested in test_affinity.py
def test_with_shards_blocks_follow_a_server_that_joins_then_drains(tmp_path):
    """Affinity: a server that joins takes over the blocks it now owns and, when it drains, hands
    them back; every rank still gets each of its batches once, with the in-process bytes."""
    from data_service.contract.tensor_layout import batch_digest
    from dnn_worker import LocalDataset
    from data_service.prepare.writer import prepare
    from hetero.synthetic.images import write_image_folder
    from hetero.testing import read_audit

    write_image_folder(tmp_path / "src", per_class=40, classes=4, seed=1)  # 160 images
    prepare(str(tmp_path / "src"), str(tmp_path / "shards"), shard_size=1_000_000, workers=1, progress=False)
    spec = PipelineSpec("data_service.pipelines.images:build_pipeline",
                        {"batch_size": 4, "image_size": 16, "shuffle_block": 8, "interleave": 2,
                         "drop_last": False, "shards": str(tmp_path / "shards")})
    want = [batch_digest(b) for b in LocalDataset(spec, seed=3)]  # 40 batches in 20 blocks
    reg = str(tmp_path / "registry")
    started = []
    try:
        for i in range(2):
            os.environ["HETERO_CACHE_DIR"] = str(tmp_path / f"cache{i}")
            started.append(DataServer(spec, TOKEN, ServerOptions(num_workers=1, probe=False)).start())
        a, c = started
        joining.join(a, reg, a.address)
        ranks = Ranks(reg, tmp_path / "audit.jsonl", world=2, step_s=0.25).start()
        ranks.wait_batches(2)
        joining.join(c, reg, c.address, leave_delay_s=1.0)
        deadline = time.monotonic() + 5.0
        while c.stats.snapshot().batches_sent < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        c.shutdown(grace_s=10.0, reason="drain", block=False)
        ranks.join()
        assert c.wait(20.0)
        rows = read_audit(tmp_path / "audit.jsonl")
        assert sorted(r["batch"] for r in rows) == list(range(40))
        assert all(r["sha256"] == want[r["batch"]] for r in rows)
        assert c.stats.snapshot().batches_sent >= 2
    finally:
        os.environ.pop("HETERO_CACHE_DIR", None)
        for s in started:
            s.leave_delay_s = 0.0
            s.shutdown(grace_s=2.0)


def test_a_fixed_server_also_registered_under_another_address_is_used_once(servers, tmp_path):
    reg = str(tmp_path / "registry")
    a = servers()
    joining.join(a, reg, f"localhost:{a.port}")  # the same server, under another name
    ds = RemoteDataset([a.address], TOKEN, registry=reg, seed=3, connect_timeout=20)
    assert len(list(ds)) == 96
    delivered = ds.fetcher.stats()
    assert sum(delivered.values()) == 96, delivered
    in_use = [s.address for s in ds.fetcher.servers if not s.refused]
    assert in_use == [a.address], in_use  # the registered name was taken for what it is: the same server


@pytest.mark.slow  # a server process killed -9 and a TTL to wait out: the slow tier
def test_a_server_killed_9_leaves_every_consumers_view_within_its_ttl_and_one_poll(servers, tmp_path):
    from dnn_worker.fetch.registry_watch import registered_servers, watcher_for

    reg = str(tmp_path / "registry")
    a = servers()
    joining.join(a, reg, a.address)
    ttl, poll = 1.0, 0.5
    doomed = ServerProc(OPTIONS, log_path=tmp_path / "serve.log")
    doomed.cmd += ["--join", reg, "--advertise-host", "127.0.0.1", "--ttl", str(ttl)]
    doomed.start()
    try:
        ranks = Ranks(reg, tmp_path / "audit.jsonl", world=2, step_s=0.03, registry_poll_s=poll).start()
        ranks.watch(doomed.address)
        watcher = watcher_for(reg, TOKEN, poll)
        ranks.wait_batches(4)
        assert doomed.address in watcher.snapshot()[1]
        time.sleep(1.5 * ttl)  # beats keep a live server's entry fresh past its TTL
        assert doomed.address in watcher.snapshot()[1]
        doomed.kill()
        killed = time.monotonic()
        while doomed.address in watcher.snapshot()[1] and time.monotonic() - killed < 30:
            time.sleep(0.02)
        gone_after = time.monotonic() - killed
        # its entry is still in the folder: only its age drops it
        assert doomed.address in [e.address for e in registry.read_entries(reg)[0]]
        assert gone_after <= ttl + poll + 1.0, gone_after  # 1 s: a beat lands up to a third of the TTL late
        assert registered_servers(reg, TOKEN) == [a.address]  # the end-of-job shutdown asks only the live one
        ranks.join()
    finally:
        doomed.stop()
    exactly_once(tmp_path / "audit.jsonl", 2)
