"""One local job: its training data, its nodes' trees and hyperparameters, the run and its result.

    result = run_local(LocalJob(data_nodes=2, dnn_nodes=1, output=Path("out")))
    result.figures.avg_step_time_s
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterator, Mapping, cast

from data_service.errors import ConfigError
from launcher.metric_lines import JobMetrics

from .runner import EXIT_STOPPED, LocalCluster
from .tree import as_hyperparameters, build_nodes, parse_cpus

log = logging.getLogger(__name__)


@dataclass
class LocalJob:
    """What to run; see ``hetero local --help`` for each field. ``hyperparameters`` may hold any JSON
    values; they are kept as SageMaker passes them (:func:`as_hyperparameters`), alone or in a sweep."""

    data_nodes: int = 1
    dnn_nodes: int = 1
    homogeneous: bool = False
    data: Path | None = None
    epochs: int = 1
    seed: int = 0
    output: Path = Path("out/local")
    audit: Path | None = None
    hyperparameters: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 1800.0
    synth_train: int = 8192
    synth_test: int = 2000
    data_cpus: str | None = None
    dnn_cpus: str | None = None
    keep_tree: bool = False
    echo: bool = True
    checkpoint_dir: Path | None = None      # kept across runs: a rerun resumes from it
    sigterm_on: str | None = None           # drill: SIGTERM the DNN nodes when their log matches this
    registry: Path | None = None            # a folder: servers started with `hetero serve --join` join the job

    def __post_init__(self) -> None:
        self.hyperparameters = as_hyperparameters(self.hyperparameters)

    def common_hyperparameters(self) -> dict[str, str]:
        """Every node's (each job's, in a sweep): epochs, seed, the hyperparameters (:func:`local_paths`)."""
        return {"epochs": str(self.epochs), "seed": str(self.seed), **local_paths(self.hyperparameters)}


@dataclass
class LocalResult:
    """Each node's exit code, the job's ``metrics.json`` as written (``figures``: read), its output."""

    exit_codes: dict[str, int | None]
    metrics: dict[str, Any] | None
    output: Path
    failure: str | None = None  # the first node that failed: "host (role) exited N: its error line"

    @cached_property
    def figures(self) -> JobMetrics | None:
        return None if self.metrics is None else JobMetrics.from_json(self.metrics)

    @property
    def ok(self) -> bool:
        return all(c == 0 for c in self.exit_codes.values()) and self.metrics is not None

    @property
    def stopped(self) -> bool:
        """A DNN node stopped on SIGTERM (checkpoint written) and no node failed."""
        codes = set(self.exit_codes.values())
        return EXIT_STOPPED in codes and codes <= {0, EXIT_STOPPED}


def run_local(job: LocalJob) -> LocalResult:
    """Build the trees, run every node, collect model and metrics into ``job.output``."""
    check_data(job)
    data_cpus, dnn_cpus = parse_cpus(job.data_cpus), parse_cpus(job.dnn_cpus)
    output = Path(job.output).resolve()
    output.mkdir(parents=True, exist_ok=True)
    (output / "metrics.json").unlink(missing_ok=True)
    with work_tree(job, "hetero-local-") as work:
        data_dir = training_data(job, work)
        hps = job.common_hyperparameters()
        if job.homogeneous:
            hps["homogeneous"] = "true"
        if job.audit is not None:
            hps["audit_path"] = str(Path(job.audit).resolve())
        name = f"hetero-local-{'homo' if job.homogeneous else 'hetero'}-{int(time.time())}-{os.getpid()}"
        env = open_registry(job, hps, output) if job.registry is not None else {}
        nodes = build_nodes(work / "nodes", job.data_nodes, job.dnn_nodes, job.homogeneous, data_dir, hps, name,
                            data_cpus, dnn_cpus, job.checkpoint_dir, env=env)
        cluster = LocalCluster(nodes, hps, output / "logs", echo=job.echo, sigterm_on=job.sigterm_on)
        try:
            cluster.start()
            codes = cluster.wait(job.timeout_s)
        finally:
            cluster.stop()  # also on Ctrl-C: no process outlives the runner
        path = cluster.collect(output)
        metrics = json.loads(path.read_text()) if path is not None else None
        return LocalResult(codes, metrics, output, cluster.failure)


@contextlib.contextmanager
def work_tree(job: LocalJob, prefix: str) -> Iterator[Path]:
    """A fresh folder for the job's node trees, removed at the end unless ``job.keep_tree``."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield work
    finally:
        if job.keep_tree:
            log.info("node trees kept in %s", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


def check_data(job: LocalJob) -> None:
    """Refuse epochs below 1 and a ``--data`` folder that is not there, naming the value."""
    if job.epochs < 1:
        raise ConfigError(f"--epochs {job.epochs} must be >= 1")
    if job.data is not None and not Path(job.data).is_dir():
        raise ConfigError(f"--data {job.data}: no such directory (the training channel: MNIST IDX files, or an image folder root/<class>/*.jpg; omit for synthetic MNIST)")


MNIST_MODULE = "examples.mnist"  # the example whose pipeline and evaluation read MNIST IDX files


def reads_mnist(hyperparameters: Mapping[str, Any]) -> bool:
    """Whether the job's pipeline or its evaluation is the MNIST example's (reading IDX files from
    the training channel): only such a job gets synthetic MNIST when no ``--data`` is given. An
    option the job does not set has the launcher's default (``DataSection``, ``ModelSection``)."""
    from launcher.config.sections import EVALUATE_AUTO, DataSection, ModelSection

    def module(key: str, default: str) -> str:
        return str(hyperparameters.get(key, default)).partition(":")[0]

    evaluate = str(hyperparameters.get("evaluate", ModelSection.evaluate))
    evaluate_module = (module("model", ModelSection.model) if evaluate == EVALUATE_AUTO
                       else evaluate.partition(":")[0])
    return MNIST_MODULE in (module("pipeline", DataSection.pipeline), evaluate_module)


def training_data(job: LocalJob, work: Path) -> Path:
    """The training channel's folder: ``job.data``, else synthetic MNIST written under ``work``
    when the job reads MNIST (:func:`reads_mnist`), else an empty folder."""
    if job.data is not None:
        return Path(job.data)
    from ..synthetic.mnist import write_synthetic

    data_dir = work / "data"
    if not reads_mnist(job.hyperparameters):
        data_dir.mkdir(parents=True, exist_ok=True)
        log.info("no --data: the training channel is empty (the job's pipeline and evaluation read no MNIST)")
        return data_dir
    write_synthetic(data_dir, job.synth_train, job.synth_test, seed=job.seed)
    log.info("synthetic MNIST: %d train / %d test images in %s", job.synth_train, job.synth_test, data_dir)
    return data_dir


# options of a pipeline or model that name a folder or file (data_service.pipelines.image_options, examples)
PATH_OPTIONS = ("shards", "index", "parquet", "root", "data_dir", "cache_dir", "decoded_cache_dir")


def local_paths(hyperparameters: Mapping[str, str], cwd: Path | None = None) -> dict[str, str]:
    """``hyperparameters`` with relative local paths in pipeline and model options (``pipeline.shards=dir``,
    ``model.data_dir=...``, any ``*_dir``, ``*_path`` or ``*_root`` option, also inside ``pipeline_options`` /
    ``model_options``) made absolute against ``cwd`` (default: the current directory): every emulated node
    runs in its own tree, where a relative path would name a folder of that tree. ``~`` is expanded; URLs
    (``s3://...``) and absolute paths are left as they are."""
    base = Path.cwd() if cwd is None else Path(cwd)

    def is_path(name: str) -> bool:
        return name in PATH_OPTIONS or name.endswith(("_dir", "_path", "_root"))

    def fixed(name: str, value: Any) -> Any:
        if not is_path(name) or not isinstance(value, str) or not value or "://" in value:
            return value
        path = Path(value).expanduser()
        return str(path if path.is_absolute() else (base / path).resolve())

    out = dict(hyperparameters)
    for key, value in hyperparameters.items():
        prefix, dot, name = key.partition(".")
        if dot and prefix in ("pipeline", "model"):
            out[key] = fixed(name, value)
        elif key in ("pipeline_options", "model_options"):
            options = json_dict(value)
            changed = {k: fixed(k, v) for k, v in options.items()}
            if changed != options:
                out[key] = json.dumps(changed)
    return out


def json_dict(value: Any) -> dict:
    """``value`` as a dict: a JSON object given as text is parsed; anything else that is not a dict is ``{}``."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return {}
    return value if isinstance(value, dict) else {}


def open_registry(job: LocalJob, hps: dict[str, Any], output: Path) -> dict[str, str]:
    """Make ``job.registry`` the job's registry; returns the variables every node needs.

    Servers joining the job must prove its token, so the job runs with an explicit token:
    ``HETERO_JOB_TOKEN`` from this environment, else a fresh one written to ``output/job_token``
    (readable by this user only).
    """
    import secrets

    if job.homogeneous:
        raise ConfigError("--registry: a homogeneous job has no data servers to join")
    registry = Path(cast(Path, job.registry)).resolve()  # called only for a job with a registry
    registry.mkdir(parents=True, exist_ok=True)
    hps["registry"] = str(registry)
    token = os.environ.get("HETERO_JOB_TOKEN", "")
    where = "$HETERO_JOB_TOKEN"
    if not token:
        token = secrets.token_hex(16)
        path = output / "job_token"
        path.unlink(missing_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        where = f"$(cat {path})"
    from launcher.config import LaunchConfig

    data = LaunchConfig.from_hyperparameters(hps).data  # the pipeline and its options, as the nodes read them
    opts = " ".join(f"-o {k}={json.dumps(v)!r}" if not isinstance(v, str) else f"-o {k}={v}"
                    for k, v in data.pipeline_options.items())
    log.info("registry %s: add data servers to this job with HETERO_JOB_TOKEN=%s hetero serve %s %s--port 0 "
             "--join %s (the job's pipeline and options: consumers refuse any other)", registry, where, data.pipeline,
             opts + " " if opts else "", registry)
    return {"HETERO_JOB_TOKEN": token}
