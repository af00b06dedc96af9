"""The corruption campaign's ``running`` place: a shard cut short under running servers, mid-epoch.

Each trial starts an epoch from two data servers (``on_corrupt=skip``) and, once the consumer has
a random number of its batches, truncates one shard at a random byte in place, as a copy or an
upload that fails under a running job would (the servers' open files see it). Every sample past
the cut must be a counted skip and every whole sample must still train. A full batch is compared
with the clean data's; a short one with the batch built in-process from the cut shards, which
skips the same samples (a batch whose build the cut interrupted can hold one sample more: it is
counted ``raced``, not compared). **lost** counts the whole samples (still readable in the cut
shards) missing from the batches the consumer got, an epoch stopped by an error included; a
batch whose every sample lies past the cut ends the epoch by design (an error naming the shard),
and only the batches before it count.
"""
from __future__ import annotations

import logging
import os
import random
import shutil

from benchmarks.common import corrupt as cc

PLACE = "running"
ALL_SKIPPED = "samples of this batch was skipped"  # the error of a batch with no sample left


def trials(count: int, rng: random.Random, shards: str, work: str, options: dict, seed: int, audit: str,
           results: list) -> None:
    """``count`` trials on a copy of ``shards`` served by one pair of servers; one result each."""
    from benchmarks.corruption import _pair
    from data_service.contract.pipeline import PipelineSpec
    from data_service.shards.indexfile import read_index
    from hetero.testing import Reference

    if not count:
        return
    folder = os.path.join(work, "running-shards")
    if not os.path.exists(folder):
        shutil.copytree(shards, folder)
    opts = dict(options, shards=folder, on_corrupt="skip")
    ref = Reference(cc.PIPELINE, opts, seed).digests(0)
    pipe = PipelineSpec(cc.PIPELINE, opts).load()  # opened before any cut, as the servers' pipelines are
    index = read_index(folder)
    servers, _ = _pair(opts)
    quiet = logging.getLogger("data_service")
    level, quiet.level = quiet.level, logging.ERROR  # the in-process builds' skip warnings
    try:
        for _ in range(count):
            results.append(dict(trial(servers, ref, pipe, index, folder, rng, seed, audit, opts["batch_size"]),
                                place=PLACE))
    finally:
        quiet.setLevel(level)
        for s in servers:
            s.stop()


def trial(servers, ref: list[str], pipe, index, folder: str, rng: random.Random, seed: int, audit: str,
          batch_size: int) -> dict:
    """One epoch with a shard cut after a random number of its batches; the trial's outcome."""
    from benchmarks.corruption import _stats
    from dnn_worker import RemoteDataset

    before = _stats(servers)
    name = index.shards.name(rng.randrange(len(index.shards)))
    path = os.path.join(folder, name)
    at = rng.randrange(512, os.path.getsize(path))
    damaged = cc.samples_hit(index, name, at, cut=True)
    cut_after = rng.randrange(len(ref) // 2 + 1)  # batches the consumer holds when the cut comes
    got, error, damage = [], "", None
    try:
        ds = RemoteDataset([s.address for s in servers], servers[0].token, seed=seed, audit_path=audit,
                           connect_timeout=20, batch_timeout=20, shared_memory=False)
        for batch in ds:
            got.append(batch)
            if len(got) == cut_after + 1:
                damage = cc.Damage(path, at, cut=True)
    except Exception as exc:  # under on_corrupt=skip a cut must not stop the epoch: its batches count as lost
        error = " ".join(str(exc).split()).split(" --- original traceback")[0][:300]
    try:
        # a batch whose every sample lies past the cut is an error naming the shard, by design: the
        # epoch ends there, and only what came before it is counted; any other error loses the rest
        emptied = ALL_SKIPPED in error and _empty(pipe, seed, len(got))
        silent, raced, lost = _compare(got, ref[:len(got)] if emptied else ref, pipe, seed, batch_size)
    finally:
        if damage is not None:
            damage.undo()
    skipped = _stats(servers)[0] - before[0]
    outcome = ("silent" if silent or (not error and len(got) != len(ref)) else
               "detected" if error or skipped else "harmless")
    return {"outcome": outcome, "error": error, "skipped": skipped, "reread": 0, "raced": raced,
            "lost": lost, "batches": len(got), "damaged": damaged, "emptied": emptied}


def _empty(pipe, seed: int, index: int) -> bool:
    """Batch ``index`` of epoch 0 has no sample left in the cut shards (its build skips them all)."""
    from data_service.contract.pipeline import SampleError, build_batch

    try:
        build_batch(pipe, pipe.epoch_shape(), seed, 0, index)
    except SampleError as exc:
        return ALL_SKIPPED in str(exc)
    return False


def _size(batch) -> int:
    return len(batch[1]) if isinstance(batch, (tuple, list)) else len(next(iter(batch.values())))


def _compare(got: list, ref: list[str], pipe, seed: int, batch_size: int) -> tuple[int, int, int]:
    """(batches whose bytes differ from what they should be, short batches the cut raced, whole
    samples lost: readable in the cut shards, yet in no batch the consumer got)."""
    from data_service.contract.pipeline import SampleError, build_batch
    from data_service.contract.tensor_layout import batch_digest

    cfg = pipe.epoch_shape()
    silent = raced = lost = 0
    for b in range(len(ref)):
        batch = got[b] if b < len(got) else None
        n = _size(batch) if batch is not None else 0
        if n == batch_size:
            silent += batch_digest(batch) != ref[b]
            continue
        try:
            mine = build_batch(pipe, cfg, seed, 0, b)  # from the cut shards: the same samples skipped
        except SampleError:  # every sample of the batch lies past the cut
            mine = None
        whole = _size(mine) if mine is not None else 0
        lost += max(0, whole - n)
        if batch is None:
            continue
        if n > whole:
            raced += 1  # built while the cut came: a sample read before it is whole, and trained
        elif n == whole:
            silent += batch_digest(mine) != batch_digest(batch)
    return silent, raced, lost
