"""``hetero serve``: run a data server for a pipeline until shut down."""
from __future__ import annotations

import argparse
import json
import os

from data_service.errors import ConfigError


def register(sub) -> None:
    from hetero.commands import NoneIsOff, add_command

    p = add_command(sub, "serve", "run a data server (CPU node)",
                    "Serve batches of a pipeline to RemoteDataset consumers.")
    p.add_argument("pipeline", help="builder import path, e.g. examples.synthetic:build_pipeline")
    p.add_argument("-o", "--option", action="append", metavar="KEY=VALUE", help="builder keyword option (JSON value)")
    p.add_argument("--host", default="0.0.0.0",
                   help="address both planes listen on (default 0.0.0.0: every interface of this machine; "
                        "127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=6000, help="gRPC port (0 = free port)")
    p.add_argument("--bulk-port", type=int, default=0, help="data-plane port (0 = free port)")
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1),
                   help="worker processes building batches (default: this machine's cores but one, %(default)s here)")
    p.add_argument("--slots-per-worker", type=int, default=4, help="built batches per worker held ahead (memory: workers x slots x batch bytes)")
    p.add_argument("--max-batch-bytes", type=int, default=1 << 30,
                   help="largest batch in bytes, as sent and as decoded; a bigger one fails (default: %(default)s = 1 GiB)")
    p.add_argument("--token", default=None, help="job token (default: $HETERO_JOB_TOKEN)")
    p.add_argument("--compression", default="", choices=["none", "lz4", "zstd"], action=NoneIsOff,
                   help="per-batch compression of what is sent: none (off), lz4 or zstd (default: none)")
    p.add_argument("--no-shared-memory", action="store_true", help="send to same-host consumers over TCP too")
    p.add_argument("--advertise-bulk-port", type=int, default=0, help="data-plane port clients dial (port mapping)")
    p.add_argument("--send-timeout", type=float, default=30.0,
                   help="seconds a consumer may take no bytes before it is dropped and its slots freed")
    p.add_argument("--tls-cert", default="", help="PEM certificate: serve both planes over TLS")
    p.add_argument("--tls-key", default="", help="PEM private key of --tls-cert")
    p.add_argument("--port-file", default=None, help="write 'grpc_port' here once serving (for scripts)")
    p.add_argument("--no-probe", action="store_true", help="skip building batch 0 at start-up (ready sooner; "
                   "a broken pipeline then fails on the first request instead)")
    p.add_argument("--join", metavar="REGISTRY", default=None,
                   help="add this server to a running job: register it in the job's registry (a folder or "
                        "s3://bucket/prefix) once serving, unregister first when it leaves (SIGTERM, hetero shutdown)")
    p.add_argument("--advertise-host", default=None,
                   help="with --join: the host or IP consumers dial (default: --host when it is one address, else "
                        "this machine's IP on its default route, e.g. the EC2/ECS private IP or the pod IP)")
    p.add_argument("--advertise-port", type=int, default=0,
                   help="with --join: the gRPC port consumers dial when it is not --port (a port mapping)")
    p.add_argument("--leave-delay", type=float, default=2.0,
                   help="with --join: seconds to keep serving after unregistering, before refusing new requests")
    p.add_argument("--ttl", type=float, default=None, metavar="SECONDS",
                   help="with --join: consumers drop this server's entry SECONDS after its last refresh (it is "
                        "refreshed every third of that; a server killed with -9 leaves within it); 0: no heartbeat "
                        "(default 15)")
    p.add_argument("--worker-start", choices=("warm", "spawn"), default="warm",
                   help="warm: fork workers (and their replacements) from a parent that imported torch and the "
                        "pipeline module (milliseconds, shared memory); spawn: each worker imports them itself "
                        "(falls back to it, with a log line, when the module cannot be preloaded)")
    p.add_argument("--no-spare-worker", action="store_true",
                   help="with --worker-start warm: keep no loaded spare worker to take a dead worker's place at once "
                        "(saves an idle worker's private memory; a replacement is then forked and loaded when needed)")
    p.add_argument("--batch-window", default="0", metavar="SIZE",
                   help="keep built batches for every job that asks, within SIZE bytes (e.g. 2GB): the jobs of a "
                        "sweep with one seed get each batch built once; a job that falls behind gets its batches "
                        "built again (docs/sweep.md). 0: off")
    p.add_argument("--build-ahead", type=int, default=None, metavar="BATCHES",
                   help="with --batch-window: once an epoch's last batches are asked for, idle workers build the "
                        "next epoch's first BATCHES before any job asks (default: max(4, 2 x --workers); 0: off; "
                        "docs/sweep.md)")
    p.add_argument("--idle-timeout", type=float, default=0.0, metavar="SECONDS",
                   help="shut down once no consumer has been connected for SECONDS, after one came: a sweep's "
                        "data group ends when its last job leaves (0: serve until shut down)")
    p.add_argument("--grace", type=float, default=10.0,
                   help="on SIGTERM: seconds to finish the requests already taken before stopping")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from hetero.console import CommandError
    from hetero.options import parse_kv

    token = args.token or os.environ.get("HETERO_JOB_TOKEN", "")
    if not token:  # before anything starts: nothing to stop
        raise ConfigError("no job token: pass --token or set HETERO_JOB_TOKEN (the consumers' token, e.g. "
                          "export HETERO_JOB_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))'))")
    options_kv = parse_kv(args.option)
    if args.worker_start == "warm":  # its imports (torch, the pipeline) run beside this process's own
        from data_service.pool.forked import prestart

        prestart(json.dumps({"target": args.pipeline, "options": options_kv}))
    from data_service.contract.pipeline import PipelineSpec
    from data_service.membership.registry import DEFAULT_TTL_S, RegistryError, check_uri
    from data_service.server import DataServer, ServerOptions
    from data_service.server.batch_window import window_budget
    from data_service.server.lifetime import IdleExit, ServerLife
    from launcher.log_setup import setup_logging

    setup_logging("data-server", args.log_level)
    if args.join:  # a bad registry fails before the pipeline is loaded
        check_uri(args.join, "--join")
        if args.ttl is not None and not 0 <= args.ttl < float("inf"):
            raise ConfigError(f"--ttl {args.ttl} must be >= 0 seconds (0: no heartbeat)")
    policy = IdleExit(args.idle_timeout or None, idle_option="--idle-timeout")  # 0: serve until shut down
    spec = PipelineSpec(args.pipeline, options_kv)
    options = ServerOptions(host=args.host, port=args.port, bulk_port=args.bulk_port, num_workers=args.workers,
                            slots_per_worker=args.slots_per_worker, max_batch_bytes=args.max_batch_bytes,
                            compression=args.compression, shared_memory=not args.no_shared_memory,
                            advertise_bulk_port=args.advertise_bulk_port, tls_cert=args.tls_cert,
                            tls_key=args.tls_key, probe=not args.no_probe,
                            send_timeout_s=args.send_timeout, worker_start=args.worker_start,
                            spare_worker=not args.no_spare_worker,
                            batch_window_bytes=window_budget(args.batch_window), build_ahead=args.build_ahead)
    life = ServerLife(DataServer(spec, token, options).start(), policy, signal_grace_s=args.grace)
    server = life.server
    joined = ""
    if args.join:
        from data_service.membership.joining import default_advertise_host

        address = f"{args.advertise_host or default_advertise_host(args.host)}:{args.advertise_port or server.port}"
        try:
            life.join(args.join, address, leave_delay_s=args.leave_delay,
                      ttl_s=DEFAULT_TTL_S if args.ttl is None else args.ttl)
        except (ConfigError, RegistryError) as exc:
            raise CommandError(f"--join {args.join}: {exc}", 2) from exc
        joined = f", joined {args.join} as {address}"
    if args.port_file:
        tmp = args.port_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{server.port}\n")
        os.replace(tmp, args.port_file)
    print(f"serving {args.pipeline} on {server.address}{joined} (Ctrl-C or `hetero shutdown` to stop)", flush=True)
    left = life.run()
    if left is not None:
        print(f"hetero serve: stopped: {left[1]}", flush=True)
    return 0
