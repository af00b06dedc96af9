"""Bytes per image on the wire, and what they cost: each wire encoding on photo-like 224 px crops.

The crops are the image pipeline's own (``data_service.pipelines.images``, batches of 32 random
224 px crops, flipped at random, uint8) cut from :mod:`benchmarks.photos`' JPEGs. One process,
pinned to one core, one torch thread. For each encoding it prints:

* bytes per image on the wire (the batch's tensors as they travel, headers included);
* data-node CPU added per image: encoding the finished batch (CPU seconds, ``time.process_time``);
* DNN-side CPU per image: decoding it back to uint8 ``[B, 3, 224, 224]`` (and the GPU's seconds
  per image with nvJPEG where CUDA is present; none here);
* PSNR against the uint8 crop (pooled over every image; and the worst image's).

Two tables: the product's encodings (``data_service.contract.wire_encoding``: ``uint8``, ``up-zstd``,
``jpeg:Q``; JPEGs decoded by torchvision's libjpeg-turbo, and by PIL for comparison), and the
lossless candidates the choice of ``up-zstd`` rests on (today's per-batch lz4 and zstd of
``data_service.contract.compression``, the left, up and Paeth differences before zstd, PNG). ``--build``
also times ``build_batch`` with each encoding on, the whole data-worker cost per image.

    python -m benchmarks.wire --images-dir /tmp/photos --images 640
"""
from __future__ import annotations

import io
import math
import os
import statistics
import time

import numpy as np
import torch

from benchmarks.common import cli, report

BATCH, SIZE = 32, 224
ENCODINGS = ("uint8", "up-zstd", "jpeg:75", "jpeg:85", "jpeg:90", "jpeg:95")
COMPACT = "jpeg:90"  # the compact encoding the docs state: at most 1/4 of uint8's bytes at >= 38 dB


def crops(images_dir: str, count: int, seed: int = 0) -> list[dict]:
    """``count // BATCH`` batches of the image pipeline's uint8 crops (as a data worker builds them)."""
    from data_service.contract.pipeline import build_batch
    from data_service.pipelines import images

    pipe = images.build_pipeline(batch_size=BATCH, image_size=SIZE, data_dir=images_dir, limit=count)
    cfg = pipe.epoch_shape()
    return [build_batch(pipe, cfg, seed, 0, i) for i in range(cfg.num_batches)]


def cpu_s(fn, repeats: int) -> tuple[float, object]:
    """Median CPU seconds of ``fn()`` over ``repeats`` runs (after one untimed), and its last result."""
    out = fn()
    times = []
    for _ in range(repeats):
        t0 = time.process_time()
        out = fn()
        times.append(time.process_time() - t0)
    return statistics.median(times), out


def psnr(mse: float) -> float:
    return math.inf if mse == 0 else 10 * math.log10(255 ** 2 / mse)


def quality(decoded: list[torch.Tensor], batches: list[dict]) -> tuple[float, float]:
    """(pooled PSNR, worst image's PSNR) of decoded images against the uint8 crops."""
    per_image = []
    for d, b in zip(decoded, batches):
        err = (d.float() - b["image"].float()).pow(2).flatten(1).mean(1)
        per_image.extend(err.tolist())
    return psnr(sum(per_image) / len(per_image)), psnr(max(per_image))


def wire_bytes(batch) -> int:
    return sum(t.numel() * t.element_size() for t in batch.values())


def product(batches: list[dict], repeats: int) -> list[dict]:
    """The product's encodings, encoded and decoded by ``data_service.contract.wire_encoding``."""
    from data_service.contract import wire_encoding as we

    n = len(batches) * BATCH
    rows = []
    for name in ENCODINGS:
        enc = we.parse(name)
        enc_s, encoded = cpu_s(lambda: [we.encode_batch(b, enc) for b in batches], repeats)
        dec_s, decoded = cpu_s(lambda: [we.decode_batch(e, "cpu", enc)["image"] for e in encoded], repeats)
        pooled, worst = quality(decoded, batches)
        row = {"encoding": enc.name, "bytes_per_image": sum(wire_bytes(e) for e in encoded) / n,
               "encode_cpu_ms": enc_s / n * 1e3, "decode_cpu_ms": dec_s / n * 1e3, "psnr_db": pooled,
               "worst_psnr_db": worst}
        if enc.kind == we.JPEG:
            row["decode_pil_ms"] = cpu_s(lambda: [_pil_decode(e) for e in encoded], repeats)[0] / n * 1e3
            row["decode_gpu_ms"] = _gpu_decode_ms(encoded, repeats)
        rows.append(row)
    return rows


def _pil_decode(encoded: dict) -> torch.Tensor:
    from PIL import Image

    from data_service.contract.wire_encoding import SUFFIX

    sizes = encoded["image" + SUFFIX].tolist()[7:]
    out = []
    for part in torch.split(encoded["image"], sizes):
        with Image.open(io.BytesIO(part.numpy().tobytes())) as im:
            out.append(torch.from_numpy(np.array(im.convert("RGB"))).permute(2, 0, 1))
    return torch.stack(out)


def _gpu_decode_ms(encoded: list[dict], repeats: int) -> float | None:
    """GPU milliseconds per image for nvJPEG batch decodes (wall time, synchronised); None without CUDA."""
    if not torch.cuda.is_available():
        return None
    from data_service.contract import wire_encoding as we

    device = torch.device("cuda")
    we.decode_batch(encoded[0], device)
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for e in encoded:
            we.decode_batch(e, device)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / (len(encoded) * BATCH) * 1e3


# -- the lossless candidates (bench-only code: the product ships up-zstd alone)

def _left(a: np.ndarray) -> np.ndarray:
    d = a.copy()
    d[..., 1:] -= a[..., :-1]
    return d


def _up(a: np.ndarray) -> np.ndarray:
    d = a.copy()
    d[..., 1:, :] -= a[..., :-1, :]
    return d


def _paeth(a: np.ndarray) -> np.ndarray:
    """PNG's Paeth predictor over each channel plane, residual mod 256."""
    a16 = a.astype(np.int16)
    left = np.zeros_like(a16)
    left[..., 1:] = a16[..., :-1]
    up = np.zeros_like(a16)
    up[..., 1:, :] = a16[..., :-1, :]
    ul = np.zeros_like(a16)
    ul[..., 1:, 1:] = a16[..., :-1, :-1]
    p = left + up - ul
    pa, pb, pc = np.abs(p - left), np.abs(p - up), np.abs(p - ul)
    pred = np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, up, ul))
    return (a16 - pred).astype(np.uint8)


def _unleft(d: np.ndarray) -> np.ndarray:
    return np.cumsum(d, axis=-1, dtype=np.uint8)


def _unup(d: np.ndarray) -> np.ndarray:
    return np.cumsum(d, axis=-2, dtype=np.uint8)


def lossless(batches: list[dict], repeats: int) -> list[dict]:
    """Bytes and CPU per image of each lossless candidate, each checked to round-trip exactly."""
    import zstandard

    from data_service.contract import compression

    n = len(batches) * BATCH
    arrays = [np.ascontiguousarray(b["image"].numpy()) for b in batches]
    rows = []

    def zstd_after(filt, unfilt):
        def enc():
            c = zstandard.ZstdCompressor(level=1)
            return [(c.compress(filt(a).data), a.shape) for a in arrays]

        def dec(packed):
            d = zstandard.ZstdDecompressor()
            return [unfilt(np.frombuffer(d.decompress(p), np.uint8).reshape(s)) for p, s in packed]
        return enc, dec

    def today(name):
        def enc():
            return [(compression.compress(name, a.data), a.shape) for a in arrays]

        def dec(packed):
            outs = []
            for p, s in packed:
                buf = bytearray(int(np.prod(s)))
                compression.decompress_into(name, p, memoryview(buf))
                outs.append(np.frombuffer(buf, np.uint8).reshape(s))
            return outs
        return enc, dec

    def png(level):
        from torchvision.io import decode_png, encode_png

        def enc():
            return [[encode_png(im, compression_level=level) for im in b["image"]] for b in batches]

        def dec(packed):
            return [torch.stack([decode_png(p) for p in ps]).numpy() for ps in packed]
        return enc, dec

    candidates = {
        "lz4 (compression=lz4)": today("lz4"), "zstd-1 (compression=zstd)": today("zstd"),
        "left + zstd-1": zstd_after(_left, _unleft), "up + zstd-1 (up-zstd)": zstd_after(_up, _unup),
        "paeth + zstd-1": zstd_after(_paeth, None),
        "png level 1": png(1), "png level 6": png(6),
    }
    for name, (enc, dec) in candidates.items():
        enc_s, packed = cpu_s(enc, repeats)
        size = sum(sum(len(p) for p in ps) if isinstance(ps, list) else len(ps[0]) for ps in packed)
        row = {"candidate": name, "bytes_per_image": size / n, "ratio": size / n / (3 * SIZE * SIZE),
               "encode_cpu_ms": enc_s / n * 1e3, "decode_cpu_ms": None}
        if not name.startswith("paeth"):  # undoing Paeth is a per-pixel loop: PNG's C decoder times it
            dec_s, out = cpu_s(lambda: dec(packed), repeats)
            if not all(np.array_equal(np.asarray(o), a) for o, a in zip(out, arrays)):
                raise SystemExit(f"{name} does not round-trip exactly")
            row["decode_cpu_ms"] = dec_s / n * 1e3
        rows.append(row)
    return rows


def build_cost(images_dir: str, count: int, repeats: int) -> list[dict]:
    """CPU ms per image of ``build_batch`` (decode, crop, flip, collate, encode) with each encoding."""
    from data_service.contract.pipeline import build_batch
    from data_service.pipelines import images

    rows = []
    for name in ("uint8", "up-zstd", COMPACT):
        pipe = images.build_pipeline(batch_size=BATCH, image_size=SIZE, data_dir=images_dir, limit=count,
                                     wire_encoding=name)
        cfg = pipe.epoch_shape()
        s, _ = cpu_s(lambda: [build_batch(pipe, cfg, 0, 0, i) for i in range(cfg.num_batches)], repeats)
        rows.append({"encoding": name, "build_cpu_ms": s / (cfg.num_batches * BATCH) * 1e3})
    return rows


def _fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def main(argv: list[str] | None = None) -> dict:
    ap = cli.parser(__doc__)
    ap.add_argument("--images-dir", default="/tmp/photos", help="benchmarks.photos folder (made if missing)")
    ap.add_argument("--images", type=int, default=640, help="crops to encode (whole batches of 32)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--core", type=int, default=-1, help="CPU to pin to (-1: the last one this process may use)")
    ap.add_argument("--build", action="store_true", help="also time build_batch with each encoding on")
    ap.add_argument("--no-lossless", action="store_true", help="skip the lossless candidates' table")
    ap.add_argument("--json", default="", help="also write the figures here")
    args = ap.parse_args(argv)
    if args.images < BATCH:
        raise SystemExit(f"--images {args.images} must be at least one batch ({BATCH})")
    from benchmarks.photos import write_photo_folder

    write_photo_folder(args.images_dir, args.images)
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {args.core if args.core >= 0 else cores[-1]})
    torch.set_num_threads(1)
    batches = crops(args.images_dir, args.images)
    n = len(batches) * BATCH
    uint8 = 3 * SIZE * SIZE
    print(f"{n} crops of {SIZE} px from {args.images_dir}, one core, median of {args.repeats}; "
          f"CUDA: {'yes' if torch.cuda.is_available() else 'no'}")
    rows = product(batches, args.repeats)
    print(f"\n{'encoding':10} {'B/image':>9} {'x uint8':>8} {'enc ms':>7} {'dec ms':>7} {'PIL ms':>7} "
          f"{'GPU ms':>7} {'PSNR dB':>8} {'worst':>6}")
    for r in rows:
        print(f"{r['encoding']:10} {r['bytes_per_image']:9.0f} {r['bytes_per_image'] / uint8:8.3f} "
              f"{r['encode_cpu_ms']:7.3f} {r['decode_cpu_ms']:7.3f} {_fmt(r.get('decode_pil_ms'), '7.3f'):>7} "
              f"{_fmt(r.get('decode_gpu_ms'), '7.4f'):>7} {r['psnr_db']:8.2f} {r['worst_psnr_db']:6.2f}")
    out = {"images": n, "repeats": args.repeats, "encodings": rows}
    compact = next(r for r in rows if r["encoding"] == COMPACT)
    ok = compact["bytes_per_image"] <= uint8 / 4 and compact["psnr_db"] >= 38
    print(f"\n{COMPACT}: {compact['bytes_per_image'] / uint8:.3f} of uint8's bytes (bound 0.25) at "
          f"{compact['psnr_db']:.1f} dB (bound 38): {'meets both' if ok else 'MISSES'}")
    out["compact_ok"] = ok
    if not args.no_lossless:
        study = lossless(batches, args.repeats)
        print(f"\n{'lossless candidate':27} {'B/image':>9} {'x uint8':>8} {'enc ms':>7} {'dec ms':>7}")
        for r in study:
            print(f"{r['candidate']:27} {r['bytes_per_image']:9.0f} {r['ratio']:8.3f} {r['encode_cpu_ms']:7.3f} "
                  f"{_fmt(r['decode_cpu_ms'], '7.3f'):>7}")
        out["lossless"] = study
    if args.build:
        build = build_cost(args.images_dir, args.images, args.repeats)
        base = build[0]["build_cpu_ms"]
        print(f"\n{'build_batch':10} {'CPU ms/image':>13} {'added':>7}")
        for r in build:
            print(f"{r['encoding']:10} {r['build_cpu_ms']:13.3f} {r['build_cpu_ms'] - base:+7.3f}")
        out["build"] = build
    report.write_json(args.json, out, end="\n")
    return out


if __name__ == "__main__":
    main()
