"""A NIC-bound job under an emulated NIC: the planner's predicted step against the measured one,
per wire encoding, and the live advice the job prints.

    python -m benchmarks.nic --json out/nic.json     # as root

One data server (``hetero serve``, the image pipeline over photo-like JPEGs, :mod:`benchmarks.photos`)
runs inside a network namespace made for the run (:mod:`benchmarks.common.netns`), its one worker alone
on one core (as a data node runs a worker on every core but one, its own process on that one);
the consumer (``RemoteDataset`` through one loader worker, as the launcher's trainer reads it, and
an emulated accelerator step: the pipeline's finish stage, wire decoding included, then a sleep)
runs here, in the root namespace, on the other core. The veth pair between them is
shaped with tc's token bucket to ``--fraction`` of the bytes the server's core builds per second
(a quick profile in the same run), so the NIC, not the core, binds with uint8 crops.

For each encoding the planner's model predicts the step from three figures measured in the run:
the shaped rate as the data node's NIC (times TCP's goodput share of it), the bytes per image the
server counts on the wire, and the per-core images/s of the profile; it names the binding
resource. The emulated step (a sleep plus the consumer's finish stage, given to the planner as the
accelerator step) is below both jobs' data steps, so uint8 is bound by the NIC and a compact
encoding (``jpeg:90``, about a tenth of the bytes) by the server's core; the lift it gives is
compared with the predicted lift. The live advice (``launcher.advice.advisor.LiveAdvisor``, fed the
consumer's step timings) runs through each job; its lines are captured.

Everything made (namespace, veth pair, queueing disciplines, server processes) is removed on the
way out, also on Ctrl-C, by ``atexit`` and, at the next start, by owner-pid prefix. Where the host
cannot make the link (not root, no iproute2, no ``sch_tbf``) the run prints the reason and writes
``{"skipped": reason}``.
"""
from __future__ import annotations

import argparse
import itertools
import logging
import os
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmarks.common import cli, report
from benchmarks.common.consume import epochs
from benchmarks.common.netns import EmulatedLink, LinkUnavailable, scaled_rate_bps, tcp_goodput, unavailable

PIPELINE = "data_service.pipelines.images:build_pipeline"
UINT8 = "uint8"
DATA_TYPE = "emulated-nic"  # the data node's instance type in the live advice
TOLERANCE = 0.15            # predicted step within this share of the measured one
STEP_SHARE = 0.6            # the emulated step's share of a compact encoding's build time per batch


# -- prediction --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Predicted:
    """The planner's step for one job, and what binds it."""

    step_s: float
    data_s: float           # the data node's time per batch: cores and NIC considered
    binding: str            # "gpu" (the emulated step), "cores", "data NIC"
    model: str              # which model gave it


def local_prediction(preprocess_s: float, gpu_step_s: float, batch_size: int, node_cores: float,
                     bytes_per_sample: float, data_nic_gbps: float, goodput: float) -> Predicted:
    """One data node, one consumer: the node delivers min(cores x per-core rate, NIC payload rate /
    bytes per image) images/s; step = max(accelerator step, batch / delivered)."""
    limits = {"cores": node_cores * batch_size / preprocess_s,
              "data NIC": data_nic_gbps * 1e9 * goodput / 8 / bytes_per_sample}
    binding = min(limits, key=limits.get)
    data_s = batch_size / limits[binding]
    return Predicted(max(gpu_step_s, data_s), data_s, binding if data_s > gpu_step_s else "gpu", "local formula")


def predict(preprocess_s: float, gpu_step_s: float, batch_size: int, bytes_per_sample: float, nic_bps: float,
            goodput: float) -> Predicted:
    """The planner's step for one consumer fed by one data server (one core) behind a NIC of
    ``nic_bps``: ``hetero.planning.planner.predict_network_step`` (no per-flow cap on a veth),
    or :func:`local_prediction` where the product has no network model."""
    try:
        from hetero.planning.planner import predict_network_step
    except ImportError:
        return local_prediction(preprocess_s, gpu_step_s, batch_size, 1, bytes_per_sample, nic_bps / 1e9, goodput)
    p = predict_network_step(preprocess_s, gpu_step_s, batch_size, consumers=1, node_cores=1, data_nodes=1,
                             bytes_per_sample=bytes_per_sample, data_nic_gbps=nic_bps / 1e9, flow_gbps=None,
                             goodput=goodput)
    return Predicted(p.step_s, p.data_s, p.binding, "hetero.planning.planner.predict_network_step")


# -- encodings ---------------------------------------------------------------------------------------


def encoding_options(encoding: str) -> dict:
    """Image pipeline options that put ``encoding`` on the wire ({} for uint8, the default)."""
    return {} if encoding == UINT8 else {"wire_encoding": encoding}


def available_encodings(wanted: list[str]) -> tuple[list[str], dict[str, str]]:
    """The encodings of ``wanted`` the image pipeline knows, and why each other one is left out."""
    from data_service.errors import ConfigError
    from data_service.pipelines.image_options import ImageOptions

    ok, skipped = [], {}
    for enc in wanted:
        try:
            ImageOptions.from_kwargs(**encoding_options(enc))
            ok.append(enc)
        except (ConfigError, TypeError, ValueError) as exc:
            skipped[enc] = str(exc)
    return ok, skipped


# -- one job -----------------------------------------------------------------------------------------


@dataclass
class JobResult:
    """One job's figures: profiled, measured in the run, and predicted."""

    encoding: str
    preprocess_s: float          # one core's seconds per batch, encoding included (profile)
    profile_bytes_per_image: float
    profile_finish_s: float      # the consumer's finish stage (decode included) per batch (profile)
    bytes_per_image: float = 0.0  # the server's bytes sent per image over the measured steps
    step_s: float = 0.0
    data_wait_fraction: float = 0.0
    images_per_s: float = 0.0
    finish_s: float = 0.0        # the consumer's finish stage per batch, median over the measured steps
    gpu_step_s: float = 0.0      # the accelerator step the planner is given: emulated sleep + finish stage
    predicted: dict = field(default_factory=dict)
    error: float = 0.0           # (predicted - measured) / measured step
    advice: list = field(default_factory=list)
    link: dict = field(default_factory=dict)   # the data direction's tc counters over the measured steps


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def advisor(address: str, token: str, every: int, warmup: int, nic_bps: float):
    """Rank 0's live advice for a job on one data node of type :data:`DATA_TYPE`, whose NIC
    baseline is the shaped rate (no per-flow cap on a veth)."""
    from launcher.advice.advisor import LiveAdvisor

    return LiveAdvisor(lambda: [(address, True)], token, ranks=1, every=every, warmup=warmup,
                       data_instance=DATA_TYPE, network={DATA_TYPE: nic_bps / 1e9}, flow_gbps=None)


def ns_server(link: EmulatedLink, options: dict, cpu: int, log_path: str | None):
    """``hetero serve`` (one worker) inside the link's namespace at ``link.ns_ip``, pinned to ``cpu``
    (its worker inherits that; the caller may move the server's own threads elsewhere)."""
    from hetero.testing.processes import ServerProc

    server = ServerProc(options, workers=1, slots=4, pipeline=PIPELINE, log_path=log_path, probe=True)
    host = server.cmd.index("--host")
    server.cmd[host + 1] = link.ns_ip
    server.cmd = [*link.exec_prefix(), "taskset", "-c", str(cpu), *server.cmd]
    server.address = f"{link.ns_ip}:{server.port}"
    return server


def pin_threads(pid: int, cpu: int) -> int:
    """Move every thread of process ``pid`` (not its child processes) to ``cpu``; returns how many."""
    moved = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), {cpu})
            moved += 1
        except OSError:
            pass  # the thread ended
    return moved


def consume(address: str, token: str, steps: int, warmup: int, gpu_step_s: float, on_step, at_warmup) -> dict:
    """A trainer's loop with an emulated accelerator step: one loader worker receives (as the
    launcher's trainer does), this process runs the finish stage and sleeps ``gpu_step_s``."""
    from torch.utils.data import DataLoader

    from dnn_worker import RemoteDataset, ResumableLoader

    ds = RemoteDataset([address], token, seed=1, shared_memory=False, connect_timeout=60.0, epochs=1000)
    finish = ds.finish_stage()
    loader = ResumableLoader(DataLoader(ds, batch_size=None, num_workers=1, persistent_workers=True,
                                        multiprocessing_context="forkserver"))
    waits, finishes, start = [], [], 0.0
    try:
        last = time.perf_counter()
        for step, batch in enumerate(itertools.islice(epochs(loader), steps), 1):
            got = time.perf_counter()
            finish(batch)
            finished = time.perf_counter()
            time.sleep(gpu_step_s)
            now = time.perf_counter()
            on_step(step, got - last, now - last)
            if step > warmup:
                waits.append(got - last)
                finishes.append(finished - got)
            last = now
            if step == warmup:
                start = now
                at_warmup()
        wall = time.perf_counter() - start
    finally:
        loader.close()
    return {"wall_s": wall, "steps": steps - warmup, "wait_s": sum(waits), "finish_s": statistics.median(finishes),
            "batch_size": ds.hello().dataset.batch_size}


def run_job(link: EmulatedLink, server, steps: int, warmup: int, gpu_step_s: float, advice_every: int) -> dict:
    """Consume ``steps`` steps from ``server`` (in the link's namespace), with the live advice;
    the measured figures over the steps after ``warmup``."""
    from dnn_worker.transport.control import ControlClient
    from hetero.testing.processes import TOKEN

    lines = _Lines()
    advice_log = logging.getLogger("launcher.advice.advisor")
    advice_log.addHandler(lines)
    advice_log.setLevel(logging.INFO)
    try:
        advice = advisor(server.address, TOKEN, advice_every, warmup, link.rate_bps)
        with ControlClient(server.address, TOKEN) as ctl:
            marks = {}

            def at_warmup() -> None:
                marks["before"], marks["tc"] = ctl.stats(timeout=10.0), link.counters()

            got = consume(server.address, TOKEN, steps, warmup, gpu_step_s, advice.on_step, at_warmup)
            after, tc1 = ctl.stats(timeout=10.0), link.counters()
        advice.final(steps)
    finally:
        advice_log.removeHandler(lines)
    before, tc0, wall, n = marks["before"], marks["tc"], got["wall_s"], got["steps"]
    images = max(1, after.batches_sent - before.batches_sent) * got["batch_size"]
    return {"step_s": wall / n, "data_wait_fraction": got["wait_s"] / wall,
            "bytes_per_image": (after.bytes_sent - before.bytes_sent) / images,
            "images_per_s": n * got["batch_size"] / wall, "finish_s": got["finish_s"],
            "link": {"bps": 8 * (tc1["sent"] - tc0["sent"]) / wall, **{k: tc1[k] - tc0[k] for k in tc1}},
            "advice": lines.lines}


def profile(encoding: str, options: dict, cpu: int, batches: int):
    """``hetero.planning.profile.profile_pipeline`` of the image pipeline with ``encoding`` on the wire."""
    from hetero.planning.profile import profile_pipeline

    return profile_pipeline(PIPELINE, {**options, **encoding_options(encoding)}, batches=batches, cpu=cpu, warmup=1)


@dataclass
class Setting:
    """What the jobs run under: the link's rate and TCP goodput, the emulated step, the cores."""

    stamp: str
    server_cpu: int
    consumer_cpu: int
    settle_s: float
    rate: float = 0.0
    goodput: float = 0.0
    sleep_s: float = 0.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The benchmark's command line."""
    ap = cli.parser(__doc__, prog="python -m benchmarks.nic")
    ap.add_argument("--images-dir", default="/tmp/nic-photos", help="photo-like JPEGs (written when missing)")
    ap.add_argument("--images", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--steps", type=int, default=200, help="steps per job, warm-up included")
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--fraction", type=float, default=0.3,
                    help="the NIC carries this share of the uint8 bytes the server's core builds")
    ap.add_argument("--encodings", default="uint8,jpeg:90", help="comma separated; the first must be uint8")
    ap.add_argument("--advice-every", type=int, default=60)
    ap.add_argument("--settle-s", type=float, default=None,
                    help="seconds the servers are up before the first measured step (default: the live "
                         "advice's trusted uptime, so it sees the workers' busy share; 0 for a smoke run)")
    ap.add_argument("--profile-batches", type=int, default=8)
    ap.add_argument("--server-cpu", type=int, default=None, help="default: the last core this process may use")
    ap.add_argument("--consumer-cpu", type=int, default=None, help="default: the first core this process may use")
    ap.add_argument("--json", default="")
    ap.add_argument("--log-dir", default="", help="data servers' logs go here (default: dropped)")
    return ap.parse_args(argv)


def skipped(path: str, reason: str, stamp: str, command: str) -> int:
    """Say why the run cannot be made here, and write that as its figures."""
    print(f"benchmarks.nic skipped: {reason}")
    report.write_json(path, {"benchmark": "nic", "skipped": reason, "date": stamp, "command": command},
                      indent=1)
    return 0


def chosen_encodings(text: str) -> tuple[list[str], dict[str, str]]:
    """The encodings of ``--encodings`` the pipeline knows (uint8 first), and why each other one is left out."""
    encodings, left_out = available_encodings([e.strip() for e in text.split(",") if e.strip()])
    for enc, why in left_out.items():
        print(f"encoding {enc} left out: {why}")
    if not encodings or encodings[0] != UINT8:
        raise SystemExit(f"--encodings {text!r}: the first must be uint8 (the baseline)")
    return encodings, left_out


def start_servers(link: EmulatedLink, encodings: list[str], options: dict, setting: Setting, log_dir: str,
                  servers: dict) -> float:
    """One server per encoding in the link's namespace (into ``servers``, so the caller stops them
    whatever happens), each worker alone on the server core; the time they were started."""
    for enc in encodings:  # started first: they are up `settle` seconds before their jobs
        log_path = str(Path(log_dir) / f"nic-server-{enc.replace(':', '-')}.log") if log_dir else None
        servers[enc] = ns_server(link, {**options, **encoding_options(enc)}, setting.server_cpu,
                                 log_path).start(wait=False)
    started = time.monotonic()
    for server in servers.values():
        server.wait_ready(timeout=120.0)
        # A data node runs one worker per core but one (the default: cpu_count - 1) and its own
        # process on the core left: so here, the worker keeps the server's core to itself.
        pin_threads(server.proc.pid, setting.consumer_cpu)
    return started


def profile_jobs(encodings: list[str], options: dict, cpu: int, batch_size: int, batches: int) -> dict[str, JobResult]:
    """Each encoding's profile on the server core: its seconds per batch, bytes per image, finish stage."""
    jobs = {}
    for enc in encodings:
        prof = profile(enc, options, cpu, batches)
        jobs[enc] = JobResult(enc, prof.median_s, prof.bytes_per_sample, prof.finish_s)
        print(f"profile {enc}: {batch_size / prof.median_s:.0f} images/s on CPU {cpu}, "
              f"{prof.bytes_per_sample:.0f} bytes per image, consumer finish stage {prof.finish_s * 1000:.1f} "
              f"ms/batch", flush=True)
    return jobs


def shape(link: EmulatedLink, jobs: dict[str, JobResult], args: argparse.Namespace, setting: Setting) -> None:
    """Shape the link to ``--fraction`` of what the server core builds as uint8, and choose the
    emulated step, into ``setting``."""
    base = jobs[UINT8]
    setting.rate = scaled_rate_bps(args.batch_size / base.preprocess_s, 1, base.profile_bytes_per_image, args.fraction)
    setting.goodput = tcp_goodput(link.mtu)
    link.set_rate(setting.rate)
    # The emulated step with its finish stage: at most half of uint8's NIC-bound data step (so
    # uint8 stays NIC-bound) and STEP_SHARE of a compact encoding's batch time on its core (so
    # that one is not data-bound).
    u8_data_s = args.batch_size * base.profile_bytes_per_image * 8 / (setting.rate * setting.goodput)
    sleep_s = 0.5 * u8_data_s - base.profile_finish_s
    for job in jobs.values():
        if job.encoding != UINT8:
            sleep_s = min(sleep_s, STEP_SHARE * job.preprocess_s - job.profile_finish_s)
    if sleep_s <= 0.001:
        raise SystemExit(f"the finish stage takes most of a batch's build time on this machine: no room for an "
                         f"emulated step ({sleep_s * 1000:.1f} ms); try a larger --fraction or fewer encodings")
    setting.sleep_s = sleep_s


def measure_job(link: EmulatedLink, server, job: JobResult, args: argparse.Namespace, setting: Setting) -> None:
    """Run one encoding's job, fill in its measured and predicted figures, and print them."""
    got = run_job(link, server, args.steps, args.warmup, setting.sleep_s, args.advice_every)
    job.step_s, job.data_wait_fraction, job.finish_s = got["step_s"], got["data_wait_fraction"], got["finish_s"]
    job.bytes_per_image, job.images_per_s = got["bytes_per_image"], got["images_per_s"]
    job.advice, job.link = got["advice"], got["link"]
    job.gpu_step_s = setting.sleep_s + job.finish_s
    pred = predict(job.preprocess_s, job.gpu_step_s, args.batch_size, job.bytes_per_image, setting.rate,
                   setting.goodput)
    job.predicted = asdict(pred)
    job.error = (pred.step_s - job.step_s) / job.step_s
    print(f"{job.encoding}: {job.bytes_per_image:.0f} bytes/image on the wire; step {job.step_s * 1000:.1f} ms "
          f"measured, {pred.step_s * 1000:.1f} ms predicted ({100 * job.error:+.1f} %), binding: "
          f"{pred.binding}; "
          f"data wait {100 * job.data_wait_fraction:.0f} %, finish stage {job.finish_s * 1000:.1f} ms, "
          f"{job.images_per_s:.0f} images/s; the link carried {job.link['bps'] / 1e6:.0f} Mbit/s "
          f"({100 * job.link['bps'] / setting.rate:.0f} % of its rate), {job.link['dropped']} packets dropped",
          flush=True)
    for line in job.advice:
        print(f"  advice: {line}")


def run_jobs(link: EmulatedLink, encodings: list[str], options: dict, args: argparse.Namespace,
             setting: Setting) -> dict[str, JobResult]:
    """Start the servers, profile, shape the link, then run each encoding's job; every server and
    the link are gone on the way out."""
    servers = {}
    try:
        print(f"link: namespace {link.ns} at {link.ns_ip}, consumer at {link.host_ip}; {setting.stamp}", flush=True)
        started = start_servers(link, encodings, options, setting, args.log_dir, servers)
        jobs = profile_jobs(encodings, options, setting.server_cpu, args.batch_size, args.profile_batches)
        shape(link, jobs, args, setting)
        os.sched_setaffinity(0, {setting.consumer_cpu})
        import torch

        torch.set_num_threads(1)  # the consumer has one core: more threads only take turns on it
        print(f"emulated NIC {setting.rate / 1e6:.0f} Mbit/s ({args.fraction:.2f} of what one core builds as uint8), "
              f"TCP goodput {setting.goodput:.3f}; emulated step {setting.sleep_s * 1000:.1f} ms + the finish stage; "
              f"the server's worker on CPU {setting.server_cpu}, its own threads and the consumer on CPU "
              f"{setting.consumer_cpu}", flush=True)
        time.sleep(max(0.0, setting.settle_s - (time.monotonic() - started)))
        for enc, job in jobs.items():
            measure_job(link, servers[enc], job, args, setting)
            servers.pop(enc).stop()
    finally:
        for server in servers.values():
            server.stop()
        link.remove()
    return jobs


def print_table(jobs: dict[str, JobResult]) -> list[dict]:
    """Each encoding's predicted and measured step and lift over uint8; the rows as written."""
    base = jobs[UINT8]
    rows = []
    print("\n| encoding | bytes/image | binding | predicted step ms | measured step ms | error | predicted lift | "
          "measured lift |\n|---|---|---|---|---|---|---|---|")
    for enc, job in jobs.items():
        lift_p, lift_m = base.predicted["step_s"] / job.predicted["step_s"], base.step_s / job.step_s
        rows.append({"predicted_lift": lift_p, "measured_lift": lift_m, **asdict(job)})
        print(f"| {enc} | {job.bytes_per_image:.0f} | {job.predicted['binding']} | "
              f"{job.predicted['step_s'] * 1000:.1f} | {job.step_s * 1000:.1f} | {100 * job.error:+.1f} % | "
              f"{lift_p:.2f}x | {lift_m:.2f}x |")
    return rows


def main(argv: list[str] | None = None) -> int:
    """Run the jobs behind the emulated NIC and print predicted against measured; 0 also when skipped."""
    args = parse_args(argv)
    stamp, command = report.stamp(), report.command("python -m benchmarks.nic", argv)
    reason = unavailable()
    if reason:
        return skipped(args.json, reason, stamp, command)
    from launcher.advice.advisor import TRUSTED_UPTIME_S

    cpus = sorted(os.sched_getaffinity(0))
    setting = Setting(stamp, cpus[-1] if args.server_cpu is None else args.server_cpu,
                      cpus[0] if args.consumer_cpu is None else args.consumer_cpu,
                      TRUSTED_UPTIME_S + 5 if args.settle_s is None else args.settle_s)
    encodings, left_out = chosen_encodings(args.encodings)
    from benchmarks.photos import write_photo_folder

    write_photo_folder(args.images_dir, args.images)
    options = {"data_dir": args.images_dir, "limit": args.images, "batch_size": args.batch_size}
    # The link exists before the profile only at its final rate; it is shaped once the profile is in.
    try:
        link = EmulatedLink.create(1e9)
    except LinkUnavailable as exc:
        return skipped(args.json, str(exc), stamp, command)
    # SIGTERM (a timeout, `kill`) unwinds like Ctrl-C, so the link and the servers go with the run.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    jobs = run_jobs(link, encodings, options, args, setting)
    rows = print_table(jobs)
    ok = all(abs(r["error"]) <= TOLERANCE for r in rows)
    nic_named = [line for line in jobs[UINT8].advice if "NIC" in line]
    report.write_json(args.json, {
        "benchmark": "nic", "date": stamp, "command": command, "nic_bps": setting.rate, "goodput": setting.goodput,
        "fraction": args.fraction, "emulated_step_s": setting.sleep_s, "batch_size": args.batch_size,
        "steps": args.steps, "warmup": args.warmup, "settle_s": setting.settle_s, "server_cpu": setting.server_cpu,
        "consumer_cpu": setting.consumer_cpu, "left_out": left_out, "jobs": rows, "tolerance": TOLERANCE,
        "within_tolerance": ok, "advice_names_nic": bool(nic_named)}, indent=1)
    print(f"\npredicted within {100 * TOLERANCE:.0f} % of measured for every encoding: {ok}; the live advice of the "
          f"uint8 job names the NIC: {bool(nic_named)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
