"""Checksum speed: GB/s of data_service.crc32c against zlib's CRC-32 and google-crc32c, one core.

    python -m benchmarks.crc_speed [--sizes 1,16,64] [--seconds 1] [--repeats 3] [--json out.json]

Each contender sums a writable buffer of random bytes (a bytearray, as a slot or a receive buffer
is writable) of each size, again and again for ``--seconds``; the contenders take turns,
``--repeats`` times, and the medians are printed. At 1 MB the buffer stays in the CPU cache; at
64 MB it is read from memory, as a freshly received large batch mostly is.

- ``crc32c``: data_service.crc32c as installed (the C extension, or its fallback), in place;
- ``crc32c fallback``: its google-crc32c path through a numpy view, in place;
- ``zlib.crc32``: zlib's CRC-32, in place (the batch checksum of protocol 1.0);
- ``google_crc32c + copy``: google-crc32c's C entry point, which takes read-only bytes only, so
  ``bytes(buffer)`` first.

A second table is a data worker's copy of a batch into its slot (GB/s of bytes copied, one
source into one destination): the copy alone (numpy), the copy summed as it goes
(``copy_crc32c``), and the copy then ``crc32c`` over the destination (the payload read twice).
"""
from __future__ import annotations

import os
import statistics
import sys
import time
import zlib

from .common import cli, report

MB = 1 << 20


def contenders() -> dict:
    """Name -> function of one writable buffer."""
    import google_crc32c

    from data_service.crc32c import inplace as crc

    return {f"crc32c ({crc.IMPLEMENTATION})": crc.crc32c, "crc32c fallback (google-crc32c, numpy view)": crc._portable,
            "zlib.crc32": zlib.crc32, "google_crc32c + copy": lambda b: google_crc32c.value(bytes(b))}


def copies() -> dict:
    """Name -> function of (destination, source)."""
    import numpy as np

    from data_service.crc32c import copy_crc32c, crc32c

    def copy_then_sum(dst, src):
        np.copyto(dst, src)
        return crc32c(dst)

    return {"copy": np.copyto, "copy_crc32c": copy_crc32c, "copy, then crc32c": copy_then_sum}


def rate(fn, buf, seconds: float) -> float:
    """GB/s of ``fn(buf)`` over ``seconds``."""
    fn(buf)  # warm: pages touched, code loaded
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn(buf)
        n += 1
    return n * len(buf) / (time.perf_counter() - start) / 1e9


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--sizes", default="1,16,64", help="buffer sizes in MB")
    cli.add_timing(parser, seconds=1.0)
    cli.add_json(parser)
    args = parser.parse_args(argv)
    fns = contenders()
    sizes = [int(float(s) * MB) for s in args.sizes.split(",")]
    print(f"checksum speed, GB/s on one core, {os.cpu_count()} cores, {args.repeats} runs x {args.seconds}s, "
          f"median | {report.stamp()}")
    print("| buffer MB | " + " | ".join(fns) + " |")
    print("|---:|" + "---:|" * len(fns))
    rows = []
    for size in sizes:
        buf = bytearray(os.urandom(size))
        runs: dict[str, list[float]] = {name: [] for name in fns}
        for _ in range(args.repeats):  # in turns, so drift hits every contender alike
            for name, fn in fns.items():
                runs[name].append(rate(fn, buf, args.seconds))
        med = {name: statistics.median(r) for name, r in runs.items()}
        rows.append({"mb": size / MB, "gbps": {k: round(v, 3) for k, v in med.items()},
                     "runs": {k: [round(x, 3) for x in v] for k, v in runs.items()}})
        print(f"| {size / MB:g} | " + " | ".join(f"{v:.2f}" for v in med.values()) + " |", flush=True)
    import numpy as np

    cps = copies()
    print("\n| buffer MB | " + " | ".join(f"{n} GB/s" for n in cps) + " | copy_crc32c / copy |")
    print("|---:|" + "---:|" * (len(cps) + 1))
    copy_rows = []
    for size in sizes:
        src = np.frombuffer(os.urandom(size), dtype=np.uint8)
        dst = np.empty_like(src)
        runs = {name: [] for name in cps}
        for _ in range(args.repeats):
            for name, fn in cps.items():
                runs[name].append(rate(lambda _, d=dst, s=src, f=fn: f(d, s), src, args.seconds))
        med = {name: statistics.median(r) for name, r in runs.items()}
        copy_rows.append({"mb": size / MB, "gbps": {k: round(v, 3) for k, v in med.items()}})
        print(f"| {size / MB:g} | " + " | ".join(f"{v:.2f}" for v in med.values()) +
              f" | {med['copy_crc32c'] / med['copy']:.2f} |", flush=True)
    report.write_json(args.json, {"benchmark": "crc_speed", "command": report.command("python -m benchmarks.crc_speed", argv),
                                  "rows": rows, "copies": copy_rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
