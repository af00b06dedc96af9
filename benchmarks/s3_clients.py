"""boto3 (``S3Store``) against AWS's ``s3torchconnector`` for the shard source's reads.

Reads N shards of SIZE MB as ranged GETs of PART MB with T threads, against moto's S3 server
behind the latency proxy (``python -m hetero.testing.s3server``) in another process; prints
seconds (best and median of the repeats) and the client's CPU seconds per GB. Needs
``pip install s3torchconnector`` (not a dependency: the product reads S3 with boto3).

    python -m benchmarks.s3_clients --repeats 5
"""
import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

CPU = []


def main() -> None:

    ap = argparse.ArgumentParser()
    ap.add_argument("--shards", type=int, default=8)
    ap.add_argument("--shard-mb", type=int, default=64)
    ap.add_argument("--part-mb", type=int, default=16)
    ap.add_argument("--threads", default="1,4,8,16")
    ap.add_argument("--latency-s", type=float, default=0.03)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    srv = subprocess.Popen([sys.executable, "-m", "hetero.testing.s3server", "--latency-s", str(args.latency_s)],
                           stdout=subprocess.PIPE, text=True)
    env = {}
    while len(env) < 5:
        line = srv.stdout.readline()
        k, v = line.split(" ", 1)[1].strip().split("=", 1)
        env[k] = v
    os.environ.update(env)
    try:
        from data_service.storage import S3Store
        import boto3
        from botocore.config import Config
        c = boto3.client("s3", config=Config(s3={"addressing_style": "path"}))
        c.create_bucket(Bucket="bench")
        size = args.shard_mb << 20
        part = args.part_mb << 20
        blob = os.urandom(size)
        st = S3Store("s3://bench/shards", max_pool=32)
        keys = [f"shard-{i:06d}.tar" for i in range(args.shards)]
        for k in keys:
            st.write_bytes(k, blob)
        jobs = [(k, a, min(size, a + part)) for k in keys for a in range(0, size, part)]
        total = len(jobs) * part

        def bench_boto(threads):
            def one(j):
                return len(st.read(j[0], j[1], j[2]))
            with ThreadPoolExecutor(threads) as ex:
                t = time.perf_counter(); c0 = time.process_time(); n = sum(ex.map(one, jobs)); CPU.append(time.process_time() - c0); return time.perf_counter() - t, n

        from s3torchconnector import S3ReaderConstructor
        from s3torchconnector._s3client import S3Client, S3ClientConfig
        def make_crt(part_size):
            return S3Client("us-east-1", endpoint=env["AWS_ENDPOINT_URL"],
                            s3client_config=S3ClientConfig(force_path_style=True, part_size=part_size))
        crt_clients = {"s3torch(part 8MB)": make_crt(8 << 20), "s3torch(part 16MB)": make_crt(16 << 20)}
        rc = S3ReaderConstructor.range_based(buffer_size=0)

        def bench_crt(client, threads):
            info = client.head_object("bench", "shards/" + keys[0])
            def one(j):
                r = client.get_object("bench", "shards/" + j[0], object_info=info, reader_constructor=rc)
                r.seek(j[1]); buf = bytearray(j[2] - j[1]); n = r.readinto(buf); assert n == len(buf), n
                return n
            with ThreadPoolExecutor(threads) as ex:
                t = time.perf_counter(); c0 = time.process_time(); n = sum(ex.map(one, jobs)); CPU.append(time.process_time() - c0); return time.perf_counter() - t, n

        # correctness once
        r = crt_clients["s3torch(part 8MB)"].get_object("bench", "shards/" + keys[0], reader_constructor=rc)
        r.seek(5); assert r.read(1000) == blob[5:1005]
        assert st.read(keys[0], 5, 1005) == blob[5:1005]
        results = {}

        for threads in [int(t) for t in args.threads.split(",")]:
            for name, fn in [("boto3 S3Store", lambda th: bench_boto(th))] + \
                            [(n, (lambda cl: lambda th: bench_crt(cl, th))(cl)) for n, cl in crt_clients.items()]:
                times = []; CPU.clear()
                for _ in range(args.repeats):
                    dt, n = fn(threads); assert n == total
                    times.append(dt)
                best = min(times)
                results[(name, threads)] = best
                print(f"{name:20s} threads={threads:2d}  best {best:6.2f} s  median {sorted(times)[len(times)//2]:6.2f} s  "
                      f"{total / best / 1e6:7.1f} MB/s  client CPU {sorted(CPU)[len(CPU)//2] / (total / 1e9):5.2f} s/GB", flush=True)
    finally:
        srv.terminate(); srv.wait()


if __name__ == "__main__":
    main()
