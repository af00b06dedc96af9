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
    report.write_json(args.json, {"benchmark": "crc_speed", "command": report.command("python -m benchmarks.crc_speed", argv),
                                  "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
