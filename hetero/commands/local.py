"""``hetero local``: run the whole job on this machine, one process per emulated node."""
from __future__ import annotations

import argparse
import sys
import signal
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from launcher.metric_lines import JobMetrics


def register(sub) -> None:
    from hetero.commands import add_command

    p = add_command(sub, "local", "run the job locally: emulated data + DNN nodes",
                    "Emulate a SageMaker heterogeneous job on this machine: one process per node, "
                    "each with its own /opt/ml-like tree, SM_* variables and free ports.")
    p.add_argument("--data-nodes", type=int, default=1, help="data-group nodes (default 1)")
    p.add_argument("--dnn-nodes", type=int, default=1, help="dnn-group nodes (default 1)")
    p.add_argument("--homogeneous", action="store_true", help="the baseline: pipeline in-process, no data nodes")
    p.add_argument("--data", type=Path, default=None, metavar="DIR",
                   help="the training channel's folder, as the job's pipeline reads it: MNIST IDX files (the default "
                        "pipeline, examples.mnist) or an image folder DIR/<class>/*.jpg (with --hp "
                        "pipeline=data_service.pipelines.images:build_pipeline) (default: synthetic MNIST)")
    p.add_argument("--epochs", type=int, default=1, help="training epochs")
    p.add_argument("--seed", type=int, default=0,
                   help="the job's seed (sample order, augmentation, model init) and the synthetic data's")
    p.add_argument("--output", type=Path, default=Path("out/local"), help="model, metrics.json and logs land here")
    p.add_argument("--audit", type=Path, default=None, help="append one JSON line per consumed batch here (with --jobs/--vary: a folder, one "
                        "AUDIT/<job>.jsonl per job)")
    p.add_argument("--hp", action="append", metavar="KEY=VALUE", default=[],
                   help="any launcher hyperparameter, e.g. --hp max_steps=300 --hp pipeline.batch_size=32")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before every node is stopped")
    p.add_argument("--synth-train", type=int, default=8192, help="synthetic training images (no --data)")
    p.add_argument("--synth-test", type=int, default=2000, help="synthetic test images (no --data)")
    p.add_argument("--data-cpus", default=None, help="pin data nodes to these CPUs, e.g. 1 or 1-3")
    p.add_argument("--dnn-cpus", default=None, help="pin DNN nodes to these CPUs, e.g. 0")
    p.add_argument("--keep-tree", action="store_true", help="keep the emulated /opt/ml trees for inspection")
    p.add_argument("--checkpoint-dir", type=Path, default=None,
                   help="every node's checkpoint dir, kept across runs: a run that finds a checkpoint there resumes "
                        "from it (default: a temporary one per node)")
    p.add_argument("--sigterm-on", metavar="REGEX", default=None,
                   help="drill a spot stop: SIGTERM the DNN nodes' launchers when a DNN node's log line matches "
                        "REGEX (e.g. 'step 50:'); they checkpoint, shut the data nodes down and exit 143")
    p.add_argument("--registry", type=Path, default=None, metavar="DIR",
                   help="the job's registry folder: data servers started elsewhere with `hetero serve ... --join DIR` "
                        "(and HETERO_JOB_TOKEN: this environment's, else OUTPUT/job_token) join the running job")
    p.add_argument("--autoscale", nargs="*", metavar="KEY=VALUE", default=None,
                   help="the job sizes its own data group: rank 0 starts `hetero serve --join` processes on this "
                        "machine when the advice says the job waits on data and drains them when it has more than "
                        "it needs; KEY=VALUE sets autoscale.KEY (min, max, usd_per_hour, cooldown_s, in_after, "
                        "workers, ...; see docs/autoscale.md). Needs --registry (default OUTPUT/registry)")
    p.add_argument("--jobs", type=int, default=0, metavar="N",
                   help="run a sweep: one data-only job and N DNN-only jobs reading it, as `hetero sweep` submits "
                        "them (docs/sweep.md); each job's output, logs and metrics under OUTPUT/<job>")
    p.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="a sweep of one DNN-only job per combination of values, e.g. --vary lr=0.1,0.01")
    p.add_argument("--batch-window", default="1GB", metavar="SIZE",
                   help="with --jobs/--vary: the data job's batch window (each batch built once for the jobs of one "
                        "seed)")
    p.add_argument("--idle-timeout", type=float, default=10.0, metavar="SECONDS",
                   help="with --jobs/--vary: the data job ends once the last job has been gone this long")
    p.add_argument("--quiet", action="store_true", help="do not echo node logs (they are in OUTPUT/logs)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from launcher.log_setup import setup_logging
    from hetero.local import EXIT_STOPPED, LocalJob, run_local
    from hetero.local.autoscale import autoscale_hps, stop_joined
    from hetero.local.sweep import run_local_sweep
    from hetero.options import parse_kv

    setup_logging("local", args.log_level)
    hps = parse_kv(args.hp)
    from launcher.config import LaunchConfig
    from launcher.job.preflight import check_findable_plugins

    # a typo or a bad value: one line now, before any node starts
    check_findable_plugins(LaunchConfig.from_hyperparameters(hps))
    if args.autoscale is not None:
        hps.update(autoscale_hps(args.autoscale, hps.get("advice_prices"), args.data_nodes))
        if args.registry is None:
            args.registry = args.output / "registry"

    def on_term(signum, frame):
        raise KeyboardInterrupt  # the runner's cleanup stops every node's process group

    signal.signal(signal.SIGTERM, on_term)
    try:
        job = LocalJob(data_nodes=args.data_nodes, dnn_nodes=args.dnn_nodes, homogeneous=args.homogeneous,
                       data=args.data, epochs=args.epochs, seed=args.seed, output=args.output, audit=args.audit,
                       hyperparameters=hps, timeout_s=args.timeout, synth_train=args.synth_train,
                       synth_test=args.synth_test, data_cpus=args.data_cpus, dnn_cpus=args.dnn_cpus,
                       keep_tree=args.keep_tree, echo=not args.quiet, checkpoint_dir=args.checkpoint_dir,
                       sigterm_on=args.sigterm_on, registry=args.registry)
        if args.jobs or args.vary:
            return print_sweep(run_local_sweep(job, args.vary, args.jobs, args.batch_window, args.idle_timeout))
        result = run_local(job)
    except KeyboardInterrupt:
        print("hetero local: interrupted; every node was stopped", file=sys.stderr)
        return 130
    finally:
        if args.autoscale is not None and args.registry is not None:
            stop_joined(args.registry, args.output)
    codes = ", ".join(f"{h}={c}" for h, c in result.exit_codes.items())
    if result.failure:
        print(f"hetero local: failed: {result.failure}", file=sys.stderr)
    if result.figures is None:
        print(f"hetero local: no metrics.json was written (exit codes: {codes}); see {result.output}/logs", file=sys.stderr)
        return 1
    print(summary_line(result.figures))
    print(f"exit codes: {codes}; metrics: {result.output}/metrics.json")
    if result.stopped:
        where = args.checkpoint_dir or "the nodes' temporary trees (gone; pass --checkpoint-dir to keep it)"
        print(f"stopped by SIGTERM: checkpoint in {where}; rerun with the same --checkpoint-dir to resume")
        return EXIT_STOPPED
    return 0 if result.ok else 1


def print_sweep(result) -> int:
    """Each job's summary line and the data job's batches built and window counters; 0 when
    every job (the data job too) ended well."""
    from data_service.server.stats import WindowFigures

    for name, job in result.jobs.items():
        codes = ", ".join(f"{h}={c}" for h, c in job.exit_codes.items())
        line = summary_line(job.figures) if job.figures is not None else "no metrics.json"
        print(f"{name}: {line} (exit codes: {codes})" + (f"; failed: {job.failure}" if job.failure else ""))
    for host, node in result.data_nodes.items():
        window = WindowFigures.from_json(node.get("window") or {})  # none: a node without a window
        print(f"data {host}: exit {node.get('exit_code')} ({node.get('reason')}); batches sent {node.get('batches_sent')}, "
              f"built {node.get('batches_built')}, built again {window.built_again}, window hits {window.hits}, "
              f"joined {window.joined}")
    codes = ", ".join(f"{h}={c}" for h, c in result.data.exit_codes.items())
    print(f"sweep {result.name}: {'ok' if result.ok else 'FAILED'}; data job exit codes: {codes}; "
          f"output {result.output}")
    return 0 if result.ok else 1


def summary_line(m: JobMetrics) -> str:
    """One line: mode, avg step time, data wait share, throughput, accuracy."""
    from launcher.metric_lines import fmt, none_measured

    step = "emulated step" if m.step_kind == "emulated" else "real step"
    status = "" if m.status == "completed" else f" [{m.status}]"
    head = f"{m.mode}{status}" + (f", resumed after {m.resumed_from_steps} steps" if m.resumed_from_steps else "")
    accuracy = f"test accuracy {fmt(m.test_accuracy, '.3f')}"
    unmeasured = none_measured(m)
    if unmeasured is not None:
        return f"{head}: {unmeasured} ({step}, {m.steps} steps/rank), {accuracy}"
    return (f"{head}: avg step time {fmt(m.avg_step_time_s, '.4f')} s ({step}, {m.steps} steps/rank, "
            f"{m.warmup_steps_discarded} warm-up discarded), data wait {fmt(m.data_wait_fraction, '.0%')}, "
            f"{fmt(m.samples_per_s, '.0f')} samples/s, {accuracy}")
