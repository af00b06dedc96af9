"""Images per second of one pinned core: our image pipeline against the peers and the decode floor.

Every pipeline turns the same photo-like JPEGs (:mod:`benchmarks.photos`, ImageNet's size mix)
into batches of 32 random 224 px crops, flipped at random, as uint8, on one core (its own process,
pinned with ``sched_setaffinity``; one thread where a library has a setting for it):

* ``fused``: ours, ``data_service.pipelines.images`` with ``decode="fused"`` (the default);
* ``whole``: ours with ``decode="whole"``: torchvision's decoder, then v2 RandomResizedCrop;
* ``cached``: ours with the decoded-image cache, every image a hit (a later epoch; the untimed
  warm-up pass fills the cache);
* ``pil``: the classic recipe, PIL decode + v1 RandomResizedCrop + flip + PILToTensor;
* ``tf``: tf.data, ``sample_distorted_bounding_box`` + ``decode_and_crop_jpeg`` + bilinear resize
  (tf.data's recipe: no antialiasing); ``tf-aa``: the same with ``antialias=True``, our output's quality;
* ``dali``: DALI's CPU ``decoders.image_random_crop`` + resize + flip;
* ``floor``: read + torchvision ``decode_jpeg`` of the whole image, no crop, no batch.

tf and dali run in ``--peers-python`` (default: this interpreter) and are skipped, with the
reason, where they are not installed (``pip install -e '.[peers]'``, best in a
venv of its own). Runs are interleaved, ``--repeats`` rounds, median reported. ``--stages``
also prints where the time per image goes in ``whole`` and ``fused``.

    python -m benchmarks.decode --images-dir /tmp/photos --images 1500 --repeats 3 --stages
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import cli, report

BATCH, SIZE, MIN_SCALE = 32, 224, 0.08
OURS = ("fused", "whole", "cached", "pil", "floor")
PEERS = ("tf", "tf-aa", "dali")


def _ours(files: list[str], kind: str):
    """A function building every batch once (our pipeline through build_batch, as a data worker does)."""
    import torch

    from data_service.contract.pipeline import build_batch
    from data_service.pipelines import images

    torch.set_num_threads(1)
    cache = {"decoded_cache_bytes": "4GB"} if kind == "cached" else {}
    pipe = images.build_pipeline(batch_size=BATCH, image_size=SIZE, min_scale=MIN_SCALE,
                                 decode="whole" if kind == "whole" else "fused",
                                 data_dir=str(Path(files[0]).parent.parent), limit=len(files), **cache)
    cfg = pipe.epoch_shape()
    batches = len(files) // BATCH

    def run() -> int:
        for index in range(batches):
            build_batch(pipe, cfg, 1, 0, index)
        return batches * BATCH
    run.close = pipe.close
    return run, lambda: dict(getattr(pipe.transform, "counts", {}))


def _pil(files: list[str]):
    import torch
    from PIL import Image
    from torchvision import transforms as T

    torch.set_num_threads(1)
    tf = T.Compose([T.RandomResizedCrop(SIZE, scale=(MIN_SCALE, 1.0)), T.RandomHorizontalFlip(), T.PILToTensor()])

    def run() -> int:
        n = len(files) // BATCH * BATCH
        for start in range(0, n, BATCH):
            torch.stack([tf(Image.open(f).convert("RGB")) for f in files[start:start + BATCH]])
        return n
    return run, dict


def _floor(files: list[str]):
    import torch
    from torchvision.io import decode_jpeg

    torch.set_num_threads(1)

    def run() -> int:
        for f in files:
            with open(f, "rb") as fh:
                decode_jpeg(torch.frombuffer(bytearray(fh.read()), dtype=torch.uint8))
        return len(files)
    return run, dict


def _tf(files: list[str], antialias: bool = False):
    from benchmarks.common.tfdata import one_thread_options, sample_fn, single_threaded

    tf = single_threaded()
    load = sample_fn(fused=True, antialias=antialias)
    options = one_thread_options()
    options.autotune.enabled = False
    n = len(files) // BATCH * BATCH
    ds = tf.data.Dataset.from_tensor_slices(files[:n]).map(load).batch(BATCH).with_options(options)

    def run() -> int:
        for _ in ds:
            pass
        return n
    return run, dict


def _dali(files: list[str]):
    from nvidia.dali import fn, pipeline_def, types

    n = len(files) // BATCH * BATCH

    @pipeline_def(batch_size=BATCH, num_threads=1, device_id=None, prefetch_queue_depth=1)
    def pipe():
        jpegs, _ = fn.readers.file(files=files[:n], random_shuffle=False, name="reader")
        images = fn.decoders.image_random_crop(jpegs, device="cpu", output_type=types.RGB,
                                               random_area=[MIN_SCALE, 1.0], random_aspect_ratio=[3 / 4, 4 / 3])
        images = fn.resize(images, resize_x=SIZE, resize_y=SIZE)
        return fn.flip(images, horizontal=fn.random.coin_flip())

    p = pipe()
    p.build()

    def run() -> int:
        for _ in range(n // BATCH):
            p.run()
        return n
    return run, dict


def worker(kind: str, files: list[str], cpu: int) -> dict:
    """One timed pass of ``kind`` on CPU ``cpu`` (after one untimed warm-up pass over a few batches)."""
    os.sched_setaffinity(0, {cpu})
    build = {"pil": _pil, "floor": _floor, "tf": _tf, "tf-aa": lambda f: _tf(f, antialias=True),
             "dali": _dali}.get(kind)
    run, counts = build(files) if build else _ours(files, kind)
    run()  # warm-up: imports, page cache, allocator (and the decoded-image cache)
    t = time.perf_counter()
    n = run()
    seconds = time.perf_counter() - t
    close = getattr(run, "close", None)
    if close:
        close()
    return {"kind": kind, "images": n, "seconds": seconds, "images_per_s": n / seconds, "counts": counts()}


def _spawn(python: str, kind: str, files_json: str, cpu: int) -> dict:
    cmd = [python, "-m", "benchmarks.decode", "--worker", kind, "--files-json", files_json, "--cpu", str(cpu)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                         cwd=str(Path(__file__).resolve().parent.parent),
                         env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"kind": kind, "skipped": last[:200]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def stages(files: list[str], cpu: int) -> dict[str, dict[str, float]]:
    """Microseconds per image in each stage of ``whole`` and ``fused`` (their own code paths), on ``cpu``."""
    import torch
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as F

    from data_service.contract.pipeline import seed_everything
    from data_service.pipelines import crop_decode
    from data_service.pipelines.images import collate, decode_bytes

    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    draw_box = crop_decode.BoxDraw((MIN_SCALE, 1.0))
    rrc = v2.RandomResizedCrop(SIZE, scale=(MIN_SCALE, 1.0), antialias=True)
    names = {"whole": ("read", "decode", "draw box", "crop + resize", "flip", "collate"),
             "fused": ("read", "header", "draw box", "decode crop", "resize", "flip + collate")}
    clock = time.perf_counter
    for _ in range(2):  # the first round warms up
        t = {k: dict.fromkeys(v, 0.0) for k, v in names.items()}
        batches: dict[str, list] = {"whole": [], "fused": []}
        for i, f in enumerate(files):
            a = clock()
            with open(f, "rb") as fh:
                data = fh.read()
            b = clock()
            seed_everything(i)
            image = decode_bytes(data, f)
            c = clock()
            box = rrc.make_params([image])
            d = clock()
            out = F.resized_crop(image, box["top"], box["left"], box["height"], box["width"], [SIZE, SIZE],
                                 antialias=True)
            e = clock()
            out = out.flip(-1) if torch.rand(1) < 0.5 else out
            g = clock()
            for k, v in zip(names["whole"], (b - a, c - b, d - c, e - d, g - e)):
                t["whole"][k] += v
            batches["whole"].append((out, 0))
            seed_everything(i)
            a = clock()
            (width, height), _ = crop_decode.plain_jpeg_size(data)
            b = clock()
            top, left, h, w = draw_box(height, width)
            c = clock()
            region = crop_decode._jpegcrop.decode_crop(data, left, top, w, h, crop_decode.dct_scale(h, w, SIZE))
            d = clock()
            out = crop_decode._resize_hwc(crop_decode._hwc(region), SIZE)
            e = clock()
            batches["fused"].append((crop_decode._finish(out, torch.rand(1).item() < 0.5, deferred=True), 0))
            g = clock()
            for k, v in zip(names["fused"][1:], (b - a, c - b, d - c, e - d, g - e)):
                t["fused"][k] += v
            if len(batches["fused"]) == BATCH:
                for kind, last in (("whole", "collate"), ("fused", "flip + collate")):
                    a = clock()
                    collate(batches[kind])
                    t[kind][last] += clock() - a
                batches = {"whole": [], "fused": []}
        t["fused"]["read"] = t["whole"]["read"]
    return {kind: {k: v / len(files) * 1e6 for k, v in parts.items()} for kind, parts in t.items()}


def main(argv: list[str] | None = None) -> int:
    ap = cli.parser(__doc__)
    ap.add_argument("--images-dir", default="/tmp/photos")
    ap.add_argument("--images", type=int, default=1500)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cpu", type=int, default=(os.cpu_count() or 1) - 1, help="the core to pin to")
    ap.add_argument("--only", default=",".join(OURS + PEERS), help="comma-separated pipelines")
    ap.add_argument("--peers-python", default=sys.executable, help="interpreter with tensorflow / DALI")
    ap.add_argument("--stages", action="store_true", help="also time each stage of whole and fused")
    ap.add_argument("--json", default="", help="write the figures here")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    ap.add_argument("--files-json", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        with open(args.files_json) as f:
            files = json.load(f)
        print(json.dumps(worker(args.worker, files, args.cpu)))
        return 0
    from benchmarks.photos import photo_files, write_photo_folder

    write_photo_folder(args.images_dir, args.images)
    files = photo_files(args.images_dir, args.images)
    from PIL import Image

    pixels = [Image.open(f).size for f in files]
    mean_px = statistics.mean(w * h for w, h in pixels)
    mean_kib = statistics.mean(os.path.getsize(f) for f in files) / 1024
    print(f"{len(files)} photo-like JPEGs, mean {mean_px / 1e3:.0f} k pixels, {mean_kib:.1f} KiB; "
          f"batches of {BATCH} x {SIZE} px crops; core {args.cpu}; {report.stamp()}")
    files_json = os.path.join(os.path.dirname(os.path.abspath(args.images_dir)), ".decode-bench-files.json")
    with open(files_json, "w") as f:
        json.dump(files, f)
    kinds = [k for k in args.only.split(",") if k]
    results: dict[str, list[dict]] = {k: [] for k in kinds}
    for r in range(args.repeats):
        for kind in kinds:
            res = _spawn(args.peers_python if kind in PEERS else sys.executable, kind, files_json, args.cpu)
            results[kind].append(res)
            shown = f"{res['images_per_s']:.0f} images/s" if "images_per_s" in res else f"skipped: {res['skipped']}"
            print(f"  round {r + 1} {kind:6s} {shown}", flush=True)
    base = statistics.median(x["images_per_s"] for x in results["whole"]) if "whole" in results and all(
        "images_per_s" in x for x in results["whole"]) else None
    print(f"\n{'pipeline':8s} {'images/s':>9s} {'vs whole':>9s}  (median of {args.repeats}, one core)")
    summary = {}
    for kind, runs in results.items():
        ok = [x["images_per_s"] for x in runs if "images_per_s" in x]
        if not ok:
            print(f"{kind:8s} skipped: {runs[0].get('skipped')}")
            continue
        med = statistics.median(ok)
        summary[kind] = {"images_per_s": med, "runs": ok, "counts": runs[-1].get("counts", {})}
        print(f"{kind:8s} {med:9.0f} {(med / base if base else float('nan')):9.2f}"
              + (f"  {runs[-1]['counts']}" if runs[-1].get("counts") else ""))
    if args.stages:
        st = stages(files, args.cpu)
        summary["stages_us"] = st
        for name, parts in st.items():
            total = sum(parts.values())
            print(f"\n{name}: {total:.0f} us per image = " + ", ".join(f"{k} {v:.0f}" for k, v in parts.items()))
    report.write_json(args.json, {"images": len(files), "mean_kpixels": mean_px / 1e3, "mean_kib": mean_kib,
                                  **summary}, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
