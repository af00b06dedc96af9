"""tf.data's side of the peer comparisons (runs in the interpreter that has TensorFlow): its recipe
for one file (``benchmarks.decode``, ``benchmarks.tf_service``) and the two roles of a tf.data
service run (``benchmarks.tf_service``).

    python -m benchmarks.common.tfdata server --port P --cpu 1        # dispatcher + worker, one core
    python -m benchmarks.common.tfdata trainer --port P --cpu 0 --files F.json --step-s S --steps N --warmup W

Run from the repository's root. The trainer prints one JSON line: mean step time after the
warm-up and the server's CPU seconds per batch over the same steps. Kept out of the product and
the tests (TensorFlow is optional).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

from benchmarks.common.proc import cpu_seconds

BATCH, SIZE, MIN_SCALE = 32, 224, 0.08


def single_threaded():
    """TensorFlow with one thread for its ops (a data core of its own); returns the module."""
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    return tf


def one_thread_options():
    """tf.data options that keep a data set's work on one thread."""
    import tensorflow as tf

    options = tf.data.Options()
    options.threading.private_threadpool_size = 1
    options.threading.max_intra_op_parallelism = 1
    return options


def serve(port: int) -> None:
    """A tf.data service dispatcher and its one worker on ``port``; prints ``ready``, then serves until killed."""
    tf = single_threaded()
    dispatcher = tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(port=port))
    worker = tf.data.experimental.service.WorkerServer(  # noqa: F841 (serves until the process ends)
        tf.data.experimental.service.WorkerConfig(dispatcher_address=dispatcher.target.split("://")[1]))
    print("ready", flush=True)
    dispatcher.join()


def sample_fn(fused: bool = True, antialias: bool = False):
    """tf.data's recipe for one file: random box, decode (of the box alone when ``fused``), resize, flip."""
    import tensorflow as tf

    def load(path):
        data = tf.io.read_file(path)
        begin, size, _ = tf.image.sample_distorted_bounding_box(
            tf.io.extract_jpeg_shape(data), bounding_boxes=tf.zeros([1, 0, 4]), min_object_covered=0.0,
            aspect_ratio_range=(3 / 4, 4 / 3), area_range=(MIN_SCALE, 1.0), max_attempts=10,
            use_image_if_no_bounding_boxes=True)
        y, x, _ = tf.unstack(begin)
        h, w, _ = tf.unstack(size)
        if fused:
            image = tf.image.decode_and_crop_jpeg(data, tf.stack([y, x, h, w]), channels=3)
        else:
            image = tf.slice(tf.io.decode_jpeg(data, channels=3), begin, size)
        image = tf.image.random_flip_left_right(tf.image.resize(image, [SIZE, SIZE], antialias=antialias))
        return tf.cast(image, tf.uint8)
    return load


def dataset(files: list[str], fused: bool):
    """Batches of :func:`sample_fn`'s samples of ``files``, shuffled, epoch after epoch, on one thread."""
    import tensorflow as tf

    load = sample_fn(fused)
    ds = tf.data.Dataset.from_tensor_slices(files).shuffle(len(files), seed=1).repeat()
    return ds.map(load, num_parallel_calls=1).batch(BATCH, drop_remainder=True).with_options(one_thread_options())


def train(port: int, files: list[str], fused: bool, step_s: float, steps: int, warmup: int, server_pid: int) -> dict:
    """A trainer loop on the service at ``port``: a batch, then the emulated step; its figures after ``warmup``."""
    import tensorflow as tf

    ds = dataset(files, fused).apply(tf.data.experimental.service.distribute(
        processing_mode="parallel_epochs", service=f"grpc://localhost:{port}", job_name=f"bench-{time.time_ns()}"))
    it = iter(ds)
    times, cpu0, start = [], None, None
    for step in range(steps):
        t = time.perf_counter()
        next(it)
        time.sleep(step_s)  # the emulated accelerator step
        if step == warmup:
            cpu0, start = cpu_seconds(server_pid), time.perf_counter()
        if step >= warmup:
            times.append(time.perf_counter() - t)
    wall = time.perf_counter() - start
    cpu = cpu_seconds(server_pid) - cpu0
    return {"step_s": sum(times) / len(times), "data_cpu_per_batch_s": cpu / (steps - warmup),
            "wall_per_step_s": wall / (steps - warmup)}


def main() -> int:
    """Run the role named on the command line: ``server`` serves until killed, ``trainer`` prints its figures."""
    ap = argparse.ArgumentParser()
    ap.add_argument("role", choices=("server", "trainer"))
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--cpu", type=int, required=True)
    ap.add_argument("--files", default="")
    ap.add_argument("--decode", choices=("fused", "whole"), default="fused")
    ap.add_argument("--step-s", type=float, default=0.0)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--server-pid", type=int, default=0)
    args = ap.parse_args()
    os.sched_setaffinity(0, {args.cpu})
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if args.role == "server":
        serve(args.port)
        return 0
    with open(args.files) as f:
        files = json.load(f)
    print(json.dumps(train(args.port, files, args.decode == "fused", args.step_s, args.steps, args.warmup,
                           args.server_pid)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
