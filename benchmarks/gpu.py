"""A real model on a GPU fed by our data servers, against resident batches, the homogeneous loader and GPU decode.

    python -m benchmarks.gpu --k 4,8,12 --json gpu.json               # a CUDA machine: ResNet-50
    python -m benchmarks.gpu --device cpu --model small --steps 4     # anywhere: checks that it works

It trains torchvision's ResNet-50 (random initialisation: nothing is downloaded; channels_last,
bf16 autocast on CUDA, SGD) for ``--steps`` measured steps after ``--warmup`` steps, on the same
folder of photo-like JPEGs (:mod:`benchmarks.photos`: ImageNet's size mix; 224 px random crops,
flipped at random), from each feed (:mod:`benchmarks._gpu_feeds`, :mod:`benchmarks._gpu_decode`):

1. ``resident``: synthetic batches already on the GPU: the limit;
2. ``servers``: our data server on ``k`` of the machine's cores (one worker each), the trainer
   on the others reading ``RemoteDataset -> ResumableLoader -> DeviceFeeder`` (TCP on loopback,
   as from a data node; ``--shared-memory`` for a server on the trainer's own host);
3. ``local``: the homogeneous path on the same ``k`` cores: ``LocalDataset`` in ``k`` DataLoader
   workers, then ``ResumableLoader -> DeviceFeeder``;
4. ``gpu-decode``: the peer: a thread on the ``k`` cores reads each batch's files and decodes them
   with ``torchvision.io.decode_jpeg(device="cuda")`` in one call, then crops, resizes and flips
   on the GPU; ``dali``: DALI's GPU decoder, where its wheel is installed.

Per feed and ``k``: images/s (and the share of the limit's), step time, data wait (host time the
loop spent getting the next batch, per step), the GPU's busy share (CUDA events around every
step on the compute stream, summed, over the wall time; NVML's utilisation beside it where
pynvml is installed; n/a on CPU), and CPU per image of the data side (the server's processes,
the DataLoader workers, the decode thread) and of the trainer process. ``--k`` sweeps the cores
and the summary names, per feed, the smallest ``k`` within 5 % of the limit's images/s.

It prints whether the fused decoder's C extension is built here: without it the data servers
and the homogeneous path decode whole images (the fallback), and the figures are those.
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from . import _gpu_decode as peers
from . import _gpu_feeds as feeds
from .common import cli, report
from .photos import photo_sources, write_photo_folder

WITHIN = 0.05  # "reaches the limit": images/s within 5 % of the resident feed's
FEEDS = ("resident", "servers", "local", "gpu-decode", "dali")


def make_model(name: str, classes: int = 1000) -> torch.nn.Module:
    """``resnet50`` (torchvision, random initialisation) or ``small`` (a few convolutions, for CPU checks)."""
    if name == "resnet50":
        from torchvision.models import resnet50

        return resnet50(weights=None, num_classes=classes)
    if name == "small":
        nn = torch.nn
        return nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU(), nn.Conv2d(16, 32, 3, 2, 1),
                             nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(32, classes))
    raise SystemExit(f"--model {name!r} must be resnet50 or small")


class Trainer:
    """The model, SGD and one training step (bf16 autocast on CUDA)."""

    def __init__(self, model: str, device: torch.device) -> None:
        self.device = device
        self.model = make_model(model).to(device, memory_format=torch.channels_last).train()
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        self.autocast = device.type == "cuda"
        self.loss: torch.Tensor | None = None

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            loss = torch.nn.functional.cross_entropy(self.model(images), labels)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.loss = loss.detach()


def measure(feed: feeds.Feed, trainer: Trainer, dev: feeds.Device, steps: int, warmup: int, batch: int) -> dict:
    """Train ``warmup`` then ``steps`` steps from ``feed``; the figures of the ``steps``."""
    it = feed.batches
    for _ in range(warmup):
        trainer.step(*next(it))
    dev.synchronize()
    data_clock = feed.data_cpu or (lambda: 0.0)
    data0, proc0 = data_clock(), time.process_time()  # process_time: every thread of the trainer process
    pairs, util, waits = [], [], []
    start = time.perf_counter()
    for i in range(steps):
        t = time.perf_counter()
        images, labels = next(it)
        waits.append(time.perf_counter() - t)
        begin = dev.event()
        trainer.step(images, labels)
        if begin is not None:
            pairs.append((begin, dev.event()))
        if i % 10 == 0 and (u := dev.utilization()) is not None:
            util.append(u)
    dev.synchronize()
    wall = time.perf_counter() - start
    data_cpu, proc_cpu = data_clock() - data0, time.process_time() - proc0
    n = steps * batch
    busy = dev.busy_s(pairs)
    loss = trainer.loss.float().item() if trainer.loss is not None else float("nan")
    return {"feed": feed.name, "images_per_s": n / wall, "step_ms": wall / steps * 1000,
            "data_wait_ms": sum(waits) / steps * 1000, "data_wait_share": sum(waits) / wall,
            "data_wait_p99_ms": sorted(waits)[min(steps - 1, int(steps * 0.99))] * 1000,
            "gpu_busy_share": busy / wall if busy is not None else None,
            "nvml_utilization": statistics.mean(util) if util else None,
            "data_cpu_ms_per_image": data_cpu / n * 1000 if feed.data_cpu else None,
            "trainer_cpu_ms_per_image": (proc_cpu - (data_cpu if feed.in_trainer else 0.0)) / n * 1000,
            "loss": loss, "steps": steps, "wall_s": wall, **feed.notes}


def smallest_k(results: list[dict], limit: float, within: float = WITHIN) -> dict[str, dict]:
    """Per feed: the smallest k whose images/s is within ``within`` of ``limit``, or the best share reached."""
    out: dict[str, dict] = {}
    for name in dict.fromkeys(r["feed"] for r in results if r.get("k") is not None):
        runs = sorted((r for r in results if r["feed"] == name and "images_per_s" in r), key=lambda r: r["k"])
        hit = next((r["k"] for r in runs if r["images_per_s"] >= (1 - within) * limit), None)
        best = max(runs, key=lambda r: r["images_per_s"], default=None)
        out[name] = {"k": hit, "best_share": best["images_per_s"] / limit if best else None,
                     "best_k": best["k"] if best else None}
    return out


def parse_ks(text: str, cores: int) -> list[int]:
    """The ``--k`` core counts, sorted; each leaves the trainer at least one of ``cores``."""
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise SystemExit(f"--k {text!r} must be comma-separated core counts, e.g. 2,4,8") from None
    bad = [k for k in ks if not 1 <= k < cores]
    if not ks or bad:
        raise SystemExit(f"--k {text!r}: each k must be 1..{cores - 1} (this process may use {cores} cores; the "
                         "trainer keeps at least one)")
    return ks


def describe(dev: feeds.Device) -> dict[str, Any]:
    """The device, the library versions, the cores, and whether the fused decoder is built."""
    import torchvision

    from data_service.pipelines import crop_decode

    info = {"device": torch.cuda.get_device_name(dev.device) if dev.cuda else "cpu",
            "torch": torch.__version__, "torchvision": torchvision.__version__,
            "cuda": torch.version.cuda if dev.cuda else None, "cores": len(os.sched_getaffinity(0)),
            "fused_decoder": crop_decode.available()}
    return info


def _fmt(value: float | None, spec: str, scale: float = 1.0) -> str:
    return "n/a" if value is None else format(value * scale, spec)


def print_table(results: list[dict], limit: float) -> None:
    """Every run's figures, against the limit's images/s."""
    print("\n| feed | k | images/s | vs limit | step ms | data wait ms/step | GPU busy | NVML util | "
          "data CPU ms/img | trainer CPU ms/img |\n|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "skipped" in r:
            print(f"| {r['feed']} | {r.get('k') or '-'} | skipped: {r['skipped']} |||||||||")
            continue
        print(f"| {r['feed']} | {r.get('k') or '-'} | {r['images_per_s']:.0f} | {r['images_per_s'] / limit:.2f} | "
              f"{r['step_ms']:.1f} | {r['data_wait_ms']:.1f} | {_fmt(r['gpu_busy_share'], '.0%')} | "
              f"{_fmt(r['nvml_utilization'], '.0f')} | {_fmt(r['data_cpu_ms_per_image'], '.2f')} | "
              f"{r['trainer_cpu_ms_per_image']:.2f} |")


@dataclass
class Settings:
    """The run's settings: the command line's, with the defaults of the device it runs on."""

    device: torch.device
    on_gpu: bool
    model: str
    batch: int
    steps: int
    warmup: int
    count: int              # JPEGs used
    image_size: int
    images_dir: str
    cores: list[int]        # the cores this process may use
    ks: list[int]           # data cores swept
    feeds: list[str]
    shared_memory: bool
    json: str               # where the figures go ("": nowhere)

    @property
    def epochs(self) -> int:
        """Epochs every feed is made with: each run reads fresh epochs, with a margin for the prefetch."""
        return -(-(self.steps + self.warmup) * 2 // (self.count // self.batch)) + 2


def parse_args(argv: list[str] | None) -> Settings:
    """The settings of the command line ``argv``; a bad one ends the run, saying why."""
    cuda = torch.cuda.is_available()
    ap = cli.parser(__doc__, prog="python -m benchmarks.gpu")
    ap.add_argument("--device", default="cuda" if cuda else "cpu", help="cuda, cuda:N or cpu")
    ap.add_argument("--model", default=None, help="resnet50 (default on CUDA) or small (default on CPU)")
    ap.add_argument("--batch-size", type=int, default=None, help="default: 256 on CUDA, 8 on CPU")
    ap.add_argument("--image-size", type=int, default=224)
    ap.add_argument("--steps", type=int, default=None, help="measured steps (default: 100 on CUDA, 4 on CPU)")
    ap.add_argument("--warmup", type=int, default=None, help="steps before measuring (default: 20 on CUDA, 2 on CPU)")
    ap.add_argument("--k", default=None, help="data cores to sweep, e.g. 4,8,12 (default: 4,8,12 on CUDA, 1 on CPU)")
    ap.add_argument("--feeds", default=",".join(FEEDS), help="comma-separated, of " + ", ".join(FEEDS))
    ap.add_argument("--images-dir", default="/tmp/gpu-bench-photos")
    ap.add_argument("--images", type=int, default=None, help="JPEGs used (written if missing; default 2560, CPU 64)")
    ap.add_argument("--shared-memory", action="store_true", help="servers: shared memory instead of TCP")
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not cuda:
        raise SystemExit(f"--device {args.device} but CUDA is not available here; use --device cpu")
    on_gpu = device.type == "cuda"
    cores = sorted(os.sched_getaffinity(0))
    s = Settings(device, on_gpu, model=args.model or ("resnet50" if on_gpu else "small"),
                 batch=args.batch_size or (256 if on_gpu else 8), steps=args.steps or (100 if on_gpu else 4),
                 warmup=args.warmup if args.warmup is not None else (20 if on_gpu else 2),
                 count=args.images or (2560 if on_gpu else 64), image_size=args.image_size,
                 images_dir=args.images_dir, cores=cores,
                 ks=parse_ks(args.k or ("4,8,12" if on_gpu else "1"), len(cores)),
                 feeds=[f for f in args.feeds.split(",") if f], shared_memory=args.shared_memory, json=args.json)
    unknown = [f for f in s.feeds if f not in FEEDS]
    if unknown or "resident" not in s.feeds:
        raise SystemExit(f"--feeds {args.feeds!r}: use {', '.join(FEEDS)}; resident (the limit) is required")
    if s.count < s.batch:
        raise SystemExit(f"--images {s.count} must be at least --batch-size {s.batch}")
    return s


def prepare(s: Settings) -> tuple[list, feeds.Device, dict]:
    """Write the photos, describe the machine and the run; the image files, the device, its description."""
    t = time.monotonic()
    written = write_photo_folder(s.images_dir, s.count)
    files = feeds.image_files(s.images_dir, s.count)
    dev = feeds.Device(s.device)
    info = describe(dev)
    if s.on_gpu:
        torch.backends.cudnn.benchmark = True
    print(f"{info['device']}: torch {info['torch']}, torchvision {info['torchvision']}, CUDA {info['cuda'] or 'n/a'}; "
          f"{info['cores']} cores; {report.stamp()}")
    precision = "bf16 autocast" if s.on_gpu else "fp32 (no autocast on CPU)"
    print(f"model {s.model} (random init), channels_last, {precision}, SGD; batch {s.batch} x {s.image_size} px; "
          f"{s.steps} steps measured after {s.warmup}")
    print(f"{len(files)} photo-like JPEGs in {s.images_dir} ({written} written in {time.monotonic() - t:.0f}s, "
          f"{photo_sources()} source photographs)")
    if info["fused_decoder"]:
        print("fused decoder: the C extension is built; servers and local decode only each crop (decode='fused')")
    else:
        print("FALLBACK DECODER: the fused decoder's C extension (data_service/pipelines/_jpegcrop) is not built here; "
              "servers and local decode whole images then crop. Build it: python setup.py build_ext --inplace")
    return files, dev, info


def make_feed(s: Settings, dev: feeds.Device, name: str, data_cores: list[int]) -> feeds.Feed:
    """The feed ``name`` with its data side on ``data_cores``."""
    if name == "resident":
        return feeds.resident(dev, s.batch, s.image_size)
    if name == "servers":
        return feeds.servers(dev, s.images_dir, s.count, s.batch, s.image_size, data_cores, s.epochs,
                             s.shared_memory)
    if name == "local":
        return feeds.local(dev, s.images_dir, s.count, s.batch, s.image_size, data_cores, s.epochs)
    if name == "gpu-decode":
        return peers.gpu_decode(dev, s.images_dir, s.count, s.batch, s.image_size, data_cores)
    return peers.dali(dev, s.images_dir, s.count, s.batch, s.image_size, data_cores)


def run(s: Settings, trainer: Trainer, dev: feeds.Device, name: str, k: int | None) -> dict:
    """One feed's figures with its data side on the last ``k`` cores (none for the limit)."""
    data_cores = s.cores[-k:] if k else []
    trainer_cores = s.cores[:-(k or s.ks[0])]  # the limit: as many trainer cores as any run of the sweep
    with feeds.pinned(trainer_cores):  # threads the trainer starts now stay off the data cores
        if not s.on_gpu:
            torch.set_num_threads(len(trainer_cores))
        if name == "dali" and (why := peers.dali_available(dev)):
            return {"feed": name, "k": k, "skipped": why}
        t0 = time.monotonic()
        feed = make_feed(s, dev, name, data_cores)
        try:
            res = measure(feed, trainer, dev, s.steps, s.warmup, s.batch)
        finally:
            feed.close()
    res.update(k=k, data_cores=data_cores, trainer_cores=len(trainer_cores), run_s=time.monotonic() - t0)
    return res


def sweep(s: Settings, trainer: Trainer, dev: feeds.Device) -> list[dict]:
    """The limit, then every other feed at every ``k``; each printed as it ends (the limit first)."""
    limit = run(s, trainer, dev, "resident", None)
    results = [limit]
    print(f"  resident: {limit['images_per_s']:.0f} images/s (the limit; {limit['run_s']:.0f}s)", flush=True)
    for k in s.ks:
        for name in s.feeds:
            if name == "resident":
                continue
            res = run(s, trainer, dev, name, k)
            results.append(res)
            shown = (f"{res['images_per_s']:.0f} images/s ({res['images_per_s'] / limit['images_per_s']:.2f} of the "
                     f"limit; {res['run_s']:.0f}s)" if "images_per_s" in res else f"skipped: {res['skipped']}")
            print(f"  k={k} {name}: {shown}", flush=True)
    return results


def print_reach(reach: dict[str, dict], limit: float, ks: list[int], fused: bool) -> None:
    """Per feed, the fewest data cores that reach the limit (or the best share it reached)."""
    print(f"\ncores to reach the limit (within {WITHIN:.0%} of {limit:.0f} images/s), k swept "
          f"{','.join(map(str, ks))}:")
    for name, r in reach.items():
        print(f"  {name}: " + (f"k={r['k']}" if r["k"] is not None else
                               f"not reached (best {r['best_share']:.2f} of the limit at k={r['best_k']})"
                               if r["best_share"] is not None else "no run"))
    if not fused:
        print("FALLBACK DECODER: servers and local ran whole-image decode (the fused decoder is not built here)")


def main(argv: list[str] | None = None) -> int:
    """Run the sweep and print its table and the cores each feed needs to reach the limit."""
    s = parse_args(argv)
    files, dev, info = prepare(s)
    results = sweep(s, Trainer(s.model, s.device), dev)
    limit = results[0]["images_per_s"]
    print_table(results, limit)
    reach = smallest_k(results, limit)
    print_reach(reach, limit, s.ks, info["fused_decoder"])
    report.write_json(s.json, {"benchmark": "gpu", "date": report.stamp(), **info, "model": s.model,
                               "batch_size": s.batch, "image_size": s.image_size, "steps": s.steps,
                               "warmup": s.warmup, "images": len(files), "photo_sources": photo_sources(), "k": s.ks,
                               "within": WITHIN, "limit_images_per_s": limit, "smallest_k": reach,
                               "results": results}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
