"""What a block shuffle costs in randomness against a full shuffle, for several block sizes.

For a labelled data set of ``classes`` x ``per_class`` samples laid out either shuffled once (as
``hetero prepare`` writes shards) or class after class (shards written in folder order), and a
batch size, it prints for the full shuffle and for blocks of 1, 4, 8, 32, 128 batches:

* class entropy per batch, as a share of the full shuffle's (1.00 = as mixed);
* same-class neighbours: how often two consecutive samples of the epoch share a class, over what
  a full shuffle gives (1.00 = no label autocorrelation);
* batch-mates again: of the sample pairs that share a batch in epoch 0, the share that share one
  again in epoch 1 (a full shuffle: about (batch - 1) / (samples - 1); a block of K batches: about 1/K).

    python -m benchmarks.shuffle_quality --classes 1000 --per-class 128 --batch-size 256
"""
from __future__ import annotations

import numpy as np

from benchmarks.common import cli, report
from data_service.contract.sampler import EpochShape, batch_indices


def _order(cfg: EpochShape, epoch: int) -> list[list[int]]:
    return [batch_indices(cfg, 0, epoch, i) for i in range(cfg.num_batches)]


def _entropy(labels: np.ndarray, batches: list[list[int]], classes: int) -> float:
    out = []
    for b in batches:
        p = np.bincount(labels[b], minlength=classes) / len(b)
        p = p[p > 0]
        out.append(-(p * np.log2(p)).sum())
    return float(np.mean(out))


def _neighbours(labels: np.ndarray, batches: list[list[int]]) -> float:
    seq = labels[np.concatenate(batches)]
    return float(np.mean(seq[1:] == seq[:-1]))


def _again(n: int, e0: list[list[int]], e1: list[list[int]]) -> float:
    b0, b1 = np.full(n, -1), np.full(n, -1)
    for i, b in enumerate(e0):
        b0[b] = i
    for i, b in enumerate(e1):
        b1[b] = i
    keep = (b0 >= 0) & (b1 >= 0)
    _, counts = np.unique(b0[keep].astype(np.int64) * len(e1) + b1[keep], return_counts=True)
    pairs_again = (counts * (counts - 1) // 2).sum()
    pairs = sum(len(b) * (len(b) - 1) // 2 for b in e0)
    return float(pairs_again / pairs)


def measure(classes: int, per_class: int, batch: int, blocks: list[int], sorted_layout: bool) -> list[dict]:
    n = classes * per_class
    labels = np.repeat(np.arange(classes), per_class)
    if not sorted_layout:
        labels = labels[np.random.default_rng(0).permutation(n)]
    rows = []
    full = EpochShape(n, batch, True, True)
    e0 = _order(full, 0)
    base = {"entropy": _entropy(labels, e0, classes), "neighbours": _neighbours(labels, e0)}
    for k in [0, *blocks]:
        cfg = full if not k else EpochShape(n, batch, True, True, k * batch, 8)
        e0, e1 = _order(cfg, 0), _order(cfg, 1)
        rows.append({"block_batches": k, "entropy": _entropy(labels, e0, classes) / base["entropy"],
                     "neighbours": _neighbours(labels, e0) / base["neighbours"], "again": _again(n, e0, e1)})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--per-class", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--blocks", default="1,4,8,32,128", help="block sizes in batches")
    args = ap.parse_args(argv)
    blocks = [int(x) for x in args.blocks.split(",")]
    print(f"{args.classes} classes x {args.per_class} samples, batch {args.batch_size}, "
          f"{report.stamp('%Y-%m-%d')}")
    for layout in (False, True):
        print(f"\nshards written {'class after class (--no-shuffle)' if layout else 'shuffled once (hetero prepare)'}:")
        print("| block (batches) | class entropy per batch vs full shuffle | same-class neighbours vs full shuffle "
              "| batch-mates again next epoch |")
        print("|---|---|---|---|")
        for r in measure(args.classes, args.per_class, args.batch_size, blocks, layout):
            name = "full shuffle" if not r["block_batches"] else str(r["block_batches"])
            print(f"| {name} | {r['entropy']:.3f} | {r['neighbours']:.2f} | {r['again']:.4f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
