"""The README's code blocks, and those of the docs users copy from, run as written.

Every fenced block of ``tests/_readme_blocks.DOCUMENTS`` has an entry in ``CHECKS``: the test that
runs it, or how it is checked instead (a new block without one fails
``test_every_block_is_run_or_checked``). What a test adds is what a block says is the user's, never
an edit of the block:

* the pipeline block is written to ``mypkg/data.py`` (the path its first line names) in a temporary
  folder, which is the current folder of the blocks that use it (``hetero serve`` imports from the
  current folder, as the README says: no ``PYTHONPATH`` is set);
* a block that names fixed addresses (``--port 6000``, ``localhost:6000``, ``cpu-1:6000``) runs in a
  private network namespace whose ``/etc/hosts`` names those hosts, so its ports are free whatever
  else this machine runs; a ``hetero serve`` line runs in the background, as in a terminal of its
  own, and the next lines once it serves;
* the consumer block gets the user's ``token`` (``$HETERO_JOB_TOKEN``), ``step`` (it records each
  batch) and ``checkpoint`` (a real one: an earlier consumer of the same servers read a few batches
  and took ``state_dict()``), and the test checks that the resumed loop trained every other batch
  once;
* S3 blocks run against moto's S3 server (``hetero.testing.s3server``) holding the buckets they name,
  filled by the test from small generated data;
* a SageMaker submission runs with ``--dry-run`` appended (no AWS call); a command that elides its
  options (``hetero local ... --hp ...``) or names placeholders (``HOST:PORT``) has every option it
  names checked against the command's parser.

The S3 training command (README, "Data sets in S3: shards") trains on a 64-image bucket: one epoch
of two batches of 32, so it runs as written without ``--hp max_steps``.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from _readme_blocks import (ROOT, all_blocks, block, check_options, elided, environ, in_netns,
                            netns_available, run, run_group, words, write_hosts)

README = "README.md"

# How each block is checked: the test that runs it, or the other way it is checked and why.
CHECKS = {
    "README.md: Quickstart": "test_quickstart_prints_what_its_figures_say; bash scripts/test.sh is CI itself (.ci/run)",
    "README.md: Install": "test_install_lines_install_from_the_checkout",
    "README.md: Write a pipeline": "test_the_pipeline_block_builds_batches",
    "README.md: Data sets in S3: shards": "test_shards_from_s3_prepare_and_train",
    "README.md: Data sets in S3: shards #2": "test_shards_read_in_place_index_and_parts",
    "README.md: Video clips": "test_video_doc_synth_and_local runs docs/video.md's copy of these commands",
    "README.md: Serve it (CPU node)": "test_serve_stats_shutdown_as_written",
    "README.md: Consume it (GPU node)": "test_the_consumer_block_resumes_from_a_checkpoint",
    "README.md: Run a whole job": "test_run_a_whole_job_commands",
    "README.md: Add data servers to a running job": "test_elided_commands_name_real_options (tests/test_elastic_launcher.py runs the join)",
    "README.md: A sweep: one data group, many jobs":
        "test_sweep_plan_says_what_the_section_says, test_sweep_commands, test_sweep_locally_as_written",
    "README.md: Submit it to SageMaker": "test_submit_commands_dry_run",
    "docs/images.md: The layout": "a folder listing, not a command",
    "docs/images.md: Running it": "test_images_doc_synth_and_local (long tier: tests/tiers.py)",
    "docs/images.md: Running it #2": "test_submit_commands_dry_run (its command ends in --dry-run)",
    "docs/images.md: Running it #3": "test_images_doc_shards_commands",
    "docs/images.md: Fewer bytes on the wire: `wire_encoding`": "test_elided_commands_name_real_options",
    "docs/video.md: The layout": "a folder listing, not a command",
    "docs/video.md: Running it": "test_video_doc_synth_and_local",
    "docs/shards.md: Writing shards: `hetero prepare`": "test_shards_doc_prepare",
    "docs/shards.md: Writing shards: `hetero prepare` #2": "a listing of what prepare writes, not a command",
    "docs/shards.md: On many machines, and after a crash": "test_shards_doc_parts_and_merge",
    "docs/shards.md: On many machines, and after a crash #2": "test_submit_commands_dry_run (--sagemaker 8 --dry-run)",
    "docs/shards.md: Reading them": "test_shards_from_s3_prepare_and_train runs the README's copy of this command",
    "docs/shards.md: WebDataset tars: `hetero index`": "test_elided_commands_name_real_options (tests/test_wds_index.py runs each form)",
    "docs/shards.md: Parquet: `pipeline.parquet`": "test_elided_commands_name_real_options (tests/test_parquet_source.py)",
    "docs/sweep.md: Shared batches: the batch window": "test_sweep_commands (the README's copy)",
    "docs/sweep.md: On SageMaker: `hetero sweep`": "test_submit_commands_dry_run (its command ends in --dry-run)",
    "docs/sweep.md: Locally: `hetero local --jobs N` / `--vary`":
        "test_sweep_commands runs the README's shorter form and checks this one's options",
}


def test_every_block_is_run_or_checked():
    found = all_blocks()
    assert sorted(set(found) - set(CHECKS)) == [], "blocks without a check: add each to CHECKS and test it"
    assert sorted(set(CHECKS) - set(found)) == [], "CHECKS names blocks that are gone"
    assert all(b.lang in ("bash", "python") for i, b in found.items() if "listing" not in CHECKS[i]), \
        "a block of commands or code says its language (```bash, ```python)"


# ----------------------------------------------------------------------------------------------------------------
# shared set-up: the user's package, an image folder, fixed addresses

def mypkg(folder: Path) -> Path:
    """Write the README's pipeline block where its first line says, under ``folder``."""
    code = block(f"{README}: Write a pipeline").text
    first = code.splitlines()[0]
    m = re.fullmatch(r"# (\S+\.py)", first)
    assert m, f"the pipeline block's first line names its file: {first!r}"
    path = folder / m.group(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / "__init__.py").touch()
    path.write_text(code)
    return folder


def images(folder: Path, per_class: int = 16) -> Path:
    """A small image folder (``root/<class>/*.jpg``), as ``hetero synth --images`` writes."""
    subprocess.run([sys.executable, "-m", "hetero", "synth", "--images", str(folder), "--per-class", str(per_class)],
                   check=True, capture_output=True, timeout=120)
    return folder


@contextlib.contextmanager
def s3_store(*buckets: str):
    """moto's S3 server, empty (moto keeps buckets in this process: an earlier test's are forgotten), with
    ``buckets`` made and this process's AWS variables pointing at it; restored after."""
    from hetero.testing.s3server import s3_server

    saved = dict(os.environ)
    with s3_server() as srv:
        srv.reset()
        os.environ.update(srv.env)
        for var in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
            os.environ.pop(var, None)
        try:
            for bucket in buckets:
                srv.client(direct=True).create_bucket(Bucket=bucket)
            yield srv
        finally:
            srv.reset()
            os.environ.clear()
            os.environ.update(saved)


@pytest.fixture
def netns():
    why = netns_available()
    if why:
        pytest.skip(why)


def drive(script: str, cwd: Path, env: dict, hosts: dict[str, str], timeout: float) -> str:
    """Run a bash ``script`` in a private network namespace with ``hosts``; its whole process group is
    killed at the end (nothing is left behind)."""
    hosts_file = write_hosts(cwd / ".hosts", hosts)
    (cwd / ".drive.sh").write_text(script)
    code, out = run_group(in_netns(["bash", str(cwd / ".drive.sh")], hosts_file), cwd, env, timeout, "the script")
    assert code == 0, f"exited {code}:\n{out[-8000:]}"
    return out


def as_file(cwd: Path, name: str, command: str) -> str:
    """``command`` verbatim in a file of its own, for the driver to source or run."""
    (cwd / name).write_text(command + "\n")
    return name


WAIT_SERVING = """for i in $(seq 1 240); do hetero stats {address} >/dev/null 2>&1 && break; \
kill -0 $server 2>/dev/null || {{ echo "the server exited:"; cat {log}; exit 1; }}; sleep 0.5; done"""


# ----------------------------------------------------------------------------------------------------------------
# README

def test_install_lines_install_from_the_checkout():
    """The project is installed from its checkout (it is not on a package index): every line either
    runs scripts/setup.sh with extras pyproject.toml defines, or pip-installs the checkout."""
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for cmd in block(f"{README}: Install").commands():
        w = words(cmd)
        if w[:2] == ["bash", "scripts/setup.sh"]:
            given = set(w[2].split(",")) if len(w) > 2 else {"dev"}
            assert given <= extras, f"{cmd!r}: extras {sorted(given - extras)} are not in pyproject.toml"
        else:
            assert "install" in w and "pip" in " ".join(w[:w.index("install")]), cmd
            targets = [t for t in w[w.index("install") + 1:] if not t.startswith("-")]
            for t in targets:
                path, _, extra = t.partition("[")
                assert (ROOT / path).resolve() == ROOT, f"{cmd!r}: installs {t!r}, not this checkout"
                assert set(extra.rstrip("]").split(",")) <= extras, cmd


def test_the_pipeline_block_builds_batches(tmp_path):
    """The block is a complete module: imported by its import path, it builds batches of the sizes it says."""
    mypkg(tmp_path)
    images(tmp_path / "data" / "shapes", per_class=4)
    code = textwrap.dedent("""
        import sys
        from data_service import PipelineSpec
        from dnn_worker import LocalDataset
        ds = LocalDataset(PipelineSpec("mypkg.data:build_pipeline", {"root": "data/shapes", "batch_size": 8}), seed=1)
        batches = list(ds)
        image, label = batches[0]
        print(len(batches), tuple(image.shape), str(image.dtype), tuple(label.shape))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=environ(PYTHONPATH="."), text=True,
                         capture_output=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split("\n")[-2] == "2 (8, 3, 224, 224) torch.uint8 (8,)", out.stdout


@pytest.mark.slow  # about 20 s: a server, stats and shutdown in a private network namespace
def test_serve_stats_shutdown_as_written(tmp_path, netns):
    """The serve block's commands as written, from the folder holding mypkg: the server in the background
    (a terminal of its own), then stats and shutdown; the server exits 0 once shut down."""
    mypkg(tmp_path)
    b = block(f"{README}: Serve it (CPU node)")
    serve = b.command("hetero serve")
    address = re.search(r"hetero stats (\S+)", b.text).group(1)
    setup = [c for c in b.commands() if not c.startswith(("hetero serve", "hetero stats", "hetero shutdown"))]
    script = "set -euo pipefail\n"
    script += "".join(f"source {as_file(tmp_path, f'setup{i}.sh', c)}\n" for i, c in enumerate(setup))
    script += f"bash {as_file(tmp_path, 'serve.sh', serve)} > serve.log 2>&1 &\nserver=$!\n"
    script += WAIT_SERVING.format(address=address, log="serve.log") + "\n"
    script += f"echo '== stats'; bash {as_file(tmp_path, 'stats.sh', b.command('hetero stats'))}\n"
    script += f"echo '== shutdown'; bash {as_file(tmp_path, 'shutdown.sh', b.command('hetero shutdown'))}\n"
    script += "wait $server; echo \"== server exit $?\"\n"
    out = drive(script, tmp_path, environ(), {}, timeout=180)
    stats = out.split("== stats", 1)[1].split("== shutdown", 1)[0]
    assert "batches" in stats, out
    assert "== server exit 0" in out, out + (tmp_path / "serve.log").read_text()[-3000:]


CONSUMER_PRELUDE = '''
import hashlib, json, os, subprocess, sys, time

def serve(host):
    """A data node at host:6000 (cpu-1 and cpu-2 in /etc/hosts), serving the README's pipeline."""
    return subprocess.Popen([sys.executable, "-m", "hetero", "serve", "mypkg.data:build_pipeline",
                             "-o", "root=data/shapes", "-o", "batch_size=16", "--host", host, "--port", "6000",
                             "--workers", "1"], stdout=open(f"serve-{host}.log", "w"), stderr=subprocess.STDOUT)

def key(batch):
    image, label = batch
    return hashlib.sha1(image.cpu().numpy().tobytes() + label.cpu().numpy().tobytes()).hexdigest()

def main():
    servers = [serve("127.0.0.1"), serve("127.0.0.2")]
    try:
        run(servers)
    finally:
        for s in servers:
            s.kill()

def run(servers):
    from dnn_worker import ControlClient, RemoteDataset, ResumableLoader
    token = os.environ["HETERO_JOB_TOKEN"]
    for address in ("cpu-1:6000", "cpu-2:6000"):
        for _ in range(240):
            try:
                with ControlClient(address, token, "readme-test") as c:
                    c.stats()
                break
            except Exception:
                assert all(s.poll() is None for s in servers), "a data node exited"
                time.sleep(0.5)
    # an earlier run of this job: it trained a few batches and took a checkpoint
    from torch.utils.data import DataLoader
    earlier = ResumableLoader(DataLoader(RemoteDataset(["cpu-1:6000", "cpu-2:6000"], token=token, seed=42, epochs=10),
                                         batch_size=None))
    earlier.set_epoch(0)
    trained_before = []
    for batch in earlier:
        trained_before.append(key(batch))
        if len(trained_before) == 3:
            break
    checkpoint = {"data": earlier.state_dict()}
    earlier.close()
    trained = []

    def step(batch):
        assert batch[0].device.type == device_type, batch[0].device
        trained.append(key(batch))

    import torch
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    namespace = {"token": token, "checkpoint": checkpoint, "step": step}
    exec(compile(BLOCK, "README consumer block", "exec"), namespace)
    print("RESULT " + json.dumps({"before": trained_before, "after": trained}))
'''


@pytest.mark.slow  # about 25 s: two data nodes, 40 batches read twice by forkserver loader workers
def test_the_consumer_block_resumes_from_a_checkpoint(tmp_path, netns):
    """The consumer block as written on this machine's device, against two data nodes at the hosts and port
    it names, resuming from a checkpoint three batches into epoch 0: it trains the other 37 of the
    10 epochs' 40 batches, each once, none of the three again."""
    mypkg(tmp_path)
    images(tmp_path / "data" / "shapes", per_class=16)   # 64 images: 4 batches of 16 an epoch
    code = block(f"{README}: Consume it (GPU node)").text
    script = CONSUMER_PRELUDE + f"\nBLOCK = {code!r}\n\nif __name__ == '__main__':\n    main()\n"
    (tmp_path / "consume.py").write_text(script)
    env = environ(PYTHONPATH=".", HETERO_JOB_TOKEN="readme-test-token-0123456789abcdef")
    out = drive("exec python consume.py\n", tmp_path, env, {"cpu-1": "127.0.0.1", "cpu-2": "127.0.0.2"},
                timeout=300)
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    before, after = result["before"], result["after"]
    assert len(before) == 3 and len(after) == 40 - 3, (len(before), len(after))
    assert len(set(before) | set(after)) == 40, "a batch was trained twice"


def test_run_a_whole_job_commands(tmp_path):
    """The planner lines run as written (``hetero plan --gpu-step-s 0.05 --profile`` profiles the default
    pipeline here); ``hetero prices --refresh`` needs AWS: its options are checked and the offline table
    for the same region is printed. ``hetero local --data-nodes 2 --dnn-nodes 1`` (about 70 s here) is
    tests/test_local_cluster.py::test_two_data_nodes_share_the_work_with_an_emulated_step's job;
    ``hetero bench --workload images`` (3 rounds of both layouts: many minutes) has its options checked,
    and tests/test_bench.py runs the bench."""
    b = block(f"{README}: Run a whole job")
    env = environ()
    out = run(b.command("hetero plan --gpu-step-s"), tmp_path, env, timeout=180).stdout
    assert "Recommended:" in out, out
    out = run(b.command("hetero plan --sizing"), tmp_path, env, timeout=120).stdout
    assert "ResNet-50" in out, out
    refresh = b.command("hetero prices --refresh")
    check_options(refresh)
    region = words(refresh)[words(refresh).index("--region") + 1]
    out = run(f"hetero prices --region {region}", tmp_path, env).stdout
    assert "ml.c5.xlarge" in out, out
    check_options(b.command("hetero bench"))
    assert b.command("hetero local") == "hetero local --data-nodes 2 --dnn-nodes 1        # the whole job on this machine, one process per node"


def sweep_table(out: str) -> dict[str, list[str]]:
    """``hetero plan --jobs N``'s sweep table: first cell -> cells."""
    table = out.split("Sweep of", 1)[1]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.splitlines()
            if line.startswith("|") and not line.startswith("|---")]
    head, body = rows[0], rows[1:]
    return {r[0]: dict(zip(head, r)) for r in body}


def test_sweep_plan_says_what_the_section_says(tmp_path):
    """The sweep block's ``hetero plan --jobs 4`` as written: one shared group with the jobs within the window
    costs less per job than separate groups and meets the target, as the section around it says."""
    plan = run(block(f"{README}: A sweep: one data group, many jobs").command("hetero plan"), tmp_path, environ(),
               timeout=120).stdout
    rows = sweep_table(plan)
    separate = next(r for k, r in rows.items() if "separate groups" in k)
    shared = next(r for k, r in rows.items() if "shared group" in k and "within the window" in k)
    cost = "$ per job per 1000 steps"
    assert float(shared[cost]) < float(separate[cost]), plan
    assert shared["meets target"] == "yes", plan


@pytest.mark.slow  # about 20 s: the serve line's server, started and shut down
def test_sweep_commands(tmp_path, netns):
    """The sweep block: the batch-window server starts as written and shuts down; ``hetero sweep ...`` elides its options (docs/sweep.md's full
    command runs with --dry-run in test_submit_commands_dry_run); ``hetero local --vary`` is
    test_sweep_locally_as_written."""
    b = block(f"{README}: A sweep: one data group, many jobs")
    env = environ()
    check_options(b.command("hetero sweep"))
    doc_serve = block("docs/sweep.md: Shared batches: the batch window").command("hetero serve")
    assert words(doc_serve) == words(b.command("hetero serve")), "docs/sweep.md's serve line is the README's"
    check_options(block("docs/sweep.md: Locally: `hetero local --jobs N` / `--vary`").command("hetero local"))

    mypkg(tmp_path)
    images(tmp_path / "data" / "shapes", per_class=64)   # hetero synth's default: one batch of the builder's 256
    serve = b.command("hetero serve")
    script = "set -euo pipefail\nexport HETERO_JOB_TOKEN=readme-test-token-0123456789abcdef\n"
    script += f"bash {as_file(tmp_path, 'serve.sh', serve)} > serve.log 2>&1 &\nserver=$!\n"
    script += WAIT_SERVING.format(address="localhost:6000", log="serve.log") + "\n"
    script += "hetero shutdown localhost:6000\nwait $server; echo \"== server exit $?\"\n"
    out = drive(script, tmp_path, env, {}, timeout=180)
    assert "== server exit 0" in out, out



@pytest.mark.slow  # about 50 s: a data job and two DNN jobs of two epochs of 512 synthetic MNIST images
def test_sweep_locally_as_written(tmp_path):
    """The sweep block's ``hetero local --vary`` line as written: both jobs end and each audit holds every
    batch of its two epochs once."""
    b = block(f"{README}: A sweep: one data group, many jobs")
    local = run(b.command("hetero local --vary"), tmp_path, environ(), timeout=400).stdout
    audits = sorted((tmp_path / "audits").glob("*.jsonl"))
    assert len(audits) == 2, local[-3000:]
    for audit in audits:
        lines = [json.loads(line) for line in audit.read_text().splitlines()]
        assert sorted((x["epoch"], x["batch"]) for x in lines) == sorted({(x["epoch"], x["batch"]) for x in lines})
        assert {x["epoch"] for x in lines} == {0, 1}


DRY_RUN = [
    (f"{README}: Submit it to SageMaker", "hetero submit --role"),
    ("docs/images.md: Running it #2", "hetero submit"),
    ("docs/shards.md: On many machines, and after a crash #2", "hetero prepare"),
    ("docs/sweep.md: On SageMaker: `hetero sweep`", "hetero sweep"),
]


@pytest.mark.parametrize("block_id,start", DRY_RUN, ids=[b for b, _ in DRY_RUN])
def test_submit_commands_dry_run(tmp_path, block_id, start):
    """A SageMaker submission as written, with --dry-run appended where it has none: the request is
    built and checked against botocore's model, nothing is sent."""
    command = block(block_id).command(start)
    if "--dry-run" not in words(command):
        command = shlex.join([*words(command), "--dry-run"])   # the same words, less the trailing comment
    # the user's AWS settings: a region, and the documented variable naming the execution role
    env = environ(AWS_DEFAULT_REGION="us-east-1", HETERO_SAGEMAKER_ROLE="arn:aws:iam::123456789012:role/SageMakerRole")
    out = run(command, tmp_path, env, timeout=120).stdout
    assert "{" in out, out


def test_elided_commands_name_real_options():
    """Commands that leave options out (``...``) or name placeholders: every option they name exists."""
    checked = 0
    for b in all_blocks().values():
        if b.lang != "bash":
            continue
        for command in b.commands():
            if elided(command) and "hetero " in command:
                check_options(command)
                checked += 1
    assert checked >= 10


@pytest.mark.slow  # about 40 s: two data nodes read the bucket, ResNet-18 trains two batches on CPU
def test_shards_from_s3_prepare_and_train(tmp_path):
    """The S3 block's prepare and local job against moto, the bucket named in the block made and
    ``data/train`` a 64-image folder; the job trains one epoch (2 batches of 32) and exits 0."""
    b = block(f"{README}: Data sets in S3: shards")
    images(tmp_path / "data" / "train", per_class=16)
    bucket = re.search(r"s3://([^/]+)/", b.text).group(1)
    with s3_store(bucket):
        env = environ()
        out = run(b.command("hetero prepare"), tmp_path, env, timeout=120).stdout
        assert "64" in out, out
        out = run(b.command("hetero local"), tmp_path, env, timeout=300).stdout
        assert "exit codes: algo-1=0, algo-2=0, algo-3=0" in out, out[-6000:]
    check_options(b.command("hetero submit"))
    doc = block("docs/shards.md: Reading them").command("hetero local")
    assert [w.replace("imagenet/train", "train") for w in words(doc)] == words(b.command("hetero local")), \
        "docs/shards.md's reading command is the README's, on another prefix"


def _wds_tars(folder: Path, src: Path) -> None:
    """WebDataset tars with ``<key>.jpg`` and ``<key>.json`` (``{"label": k}``) members, from an image folder."""
    folder.mkdir(parents=True)
    files = sorted(src.glob("*/*.jpg"))
    classes = sorted({f.parent.name for f in files})
    for shard in range(2):
        with tarfile.open(folder / f"part-{shard:05d}.tar", "w") as tar:
            for i, f in enumerate(files[shard::2]):
                for name, data in ((f"{i:06d}.jpg", f.read_bytes()),
                                   (f"{i:06d}.json", json.dumps({"label": classes.index(f.parent.name)}).encode())):
                    info = tarfile.TarInfo(name)
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def _parquet(path: Path, src: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(src.glob("*/*.jpg"))
    classes = sorted({f.parent.name for f in files})
    table = pa.table({"image": [{"bytes": f.read_bytes(), "path": f.name} for f in files],
                      "label": [classes.index(f.parent.name) for f in files]})
    path.parent.mkdir(parents=True)
    pq.write_table(table, path, row_group_size=16, write_page_checksum=False)


def _upload(client, folder: Path, url: str) -> None:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    for f in sorted(folder.rglob("*")):
        if f.is_file():
            client.put_object(Bucket=bucket, Key=f"{prefix}/{f.relative_to(folder)}", Body=f.read_bytes())


@pytest.mark.slow  # about 20 s
def test_shards_read_in_place_index_and_parts(tmp_path):
    """The read-in-place block's complete commands against moto: WebDataset tars with JSON labels at the
    source it names, indexed to the prefix it names; a Parquet export without page CRCs indexed; one
    part of 16 of ``hetero prepare``. The ``hetero local ...`` lines elide their options
    (test_elided_commands_name_real_options)."""
    b = block(f"{README}: Data sets in S3: shards #2")
    src = images(tmp_path / "data" / "train", per_class=16)
    index = next(c for c in b.commands() if c.startswith("hetero index") and "--label" in c)
    parquet = next(c for c in b.commands() if c.startswith("hetero index") and "--label" not in c)
    part = b.command("hetero prepare")
    with s3_store("my-bucket") as srv:
        client = srv.client(direct=True)
        source = words(index)[2]
        client.create_bucket(Bucket=source.removeprefix("s3://").split("/")[0])
        _wds_tars(tmp_path / "wds", src)
        _upload(client, tmp_path / "wds", source)
        _parquet(tmp_path / "pq" / "part-0.parquet", src)
        _upload(client, tmp_path / "pq", words(parquet)[2])
        env = environ()
        for command in (index, parquet, part):
            out = run(command, tmp_path, env, timeout=120).stdout
            assert "error" not in out.lower(), out
        keys = {o["Key"] for o in client.list_objects_v2(Bucket="my-bucket").get("Contents", [])}
        assert "laion-index/index.bin" in keys, keys


# ----------------------------------------------------------------------------------------------------------------
# the quickstart

def figures(out: str) -> dict:
    """The figures scripts/quickstart.py prints, read back from its own output."""
    fused, whole = map(float, re.search(r"([\d.]+) vs ([\d.]+) ms per batch", out).groups())
    rows = {m.group(1): (float(m.group(2)), float(m.group(3))) for m in re.finditer(
        r"(homogeneous|heterogeneous):\s+([\d.]+) ms/step.*?planner: ([\d.]+) ms/step", out)}
    return {"fused_ms": fused, "whole_ms": whole, "rows": rows}


@pytest.mark.slow  # about 50 s: 2 runs of 40 steps after writing 1,312 JPEGs
def test_quickstart_prints_what_its_figures_say(tmp_path):
    """``bash scripts/quickstart.sh`` is scripts/setup.sh (CI's own first step) then scripts/quickstart.py:
    the latter runs here, shorter (--steps 40), and every sentence it prints agrees with its figures:
    the crop-decode ratio is the one measured, a smaller data group is claimed only where it is
    clearly above 1, and a busy machine's note names as longer than the planner's only the step
    times that are."""
    assert block(f"{README}: Quickstart").commands()[0].startswith("bash scripts/quickstart.sh")
    assert "exec .venv/bin/python scripts/quickstart.py" in (ROOT / "scripts" / "quickstart.sh").read_text()
    out = run(f"{sys.executable} {ROOT / 'scripts' / 'quickstart.py'} --steps 40 --output {tmp_path}", ROOT,
              environ(), timeout=400).stdout
    f = figures(out)
    assert set(f["rows"]) == {"homogeneous", "heterogeneous"}, out
    ratio = f["whole_ms"] / f["fused_ms"]
    said = re.search(r"([\d.]+)x the images per core", out)
    assert said and abs(float(said.group(1)) - ratio) < 0.011, out
    sentence = out.split("the fused crop-and-decode", 1)[1].split("\n\n", 1)[0]
    if abs(ratio - 1.1) > 0.01:   # the printed milliseconds are rounded
        assert ("that many times smaller" in sentence) == (ratio > 1.1), out
    note = re.search(r"note: load average.*", out)
    if note:
        longer = {name for name, (measured, planned) in f["rows"].items() if measured > planned}
        text = note.group(0)
        assert ("both step times are longer" in text) == (longer == {"homogeneous", "heterogeneous"}), (text, f)
        if len(longer) == 1:
            assert f"the {next(iter(longer))} step time is longer" in text, (text, f)
        elif not longer:
            assert "neither step time is longer" in text, (text, f)


# ----------------------------------------------------------------------------------------------------------------
# docs/images.md, docs/shards.md

@pytest.mark.slow  # 75 s: ResNet-18 trains one epoch of 8 batches of 32 on CPU; the long tier (tests/tiers.py)
def test_images_doc_synth_and_local(tmp_path):
    """docs/images.md's first commands as written, in an empty folder: the drawn-shape folder, then
    the job on it (256 images, one epoch of 8 steps: max_steps=50 does not bind). In CI the same model
    and step train through data nodes in test_shards_from_s3_prepare_and_train."""
    b = block("docs/images.md: Running it")
    env = environ()
    for command in b.commands():
        out = run(command, tmp_path, env, timeout=400).stdout
    assert "exit codes: algo-1=0, algo-2=0" in out, out[-6000:]


@pytest.mark.slow  # about a minute: 12 small videos written, a 3D CNN trains an epoch of 3 batches on CPU
def test_video_doc_synth_and_local(tmp_path):
    """docs/video.md's commands as written, in an empty folder: the web-like videos, then the job on them."""
    b = block("docs/video.md: Running it")
    assert [words(c) for c in b.commands()] == [words(c) for c in block(f"{README}: Video clips").commands()], \
        "the README's video commands are docs/video.md's"
    env = environ()
    for command in b.commands():
        out = run(command, tmp_path, env, timeout=400).stdout
    assert "exit codes: algo-1=0, algo-2=0" in out, out[-6000:]


def test_images_doc_shards_commands(tmp_path):
    """docs/images.md's shard commands: prepare runs against moto (the bucket it names made, the folder it
    names a small image folder); the submit and local lines elide or take the store from the user's
    exports (test_shards_from_s3_prepare_and_train runs the same job)."""
    b = block("docs/images.md: Running it #3")
    prepare = b.command("hetero prepare")
    images(tmp_path / words(prepare)[2], per_class=4)
    with s3_store(re.search(r"s3://([^/]+)/", prepare).group(1)):
        out = run(prepare, tmp_path, environ(), timeout=120).stdout
    assert "16" in out, out
    for command in b.commands():
        check_options(command)


@pytest.mark.slow  # about 30 s: three prepare runs
def test_shards_doc_prepare(tmp_path):
    """docs/shards.md's prepare lines as written: to S3 (moto), to a local folder, and from a map-style
    data set the user's ``mypkg.data:make_dataset`` returns (the test writes that function)."""
    b = block("docs/shards.md: Writing shards: `hetero prepare`")
    commands = b.commands()
    images(tmp_path / words(commands[0])[2], per_class=4)
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").touch()
    (tmp_path / "mypkg" / "data.py").write_text(textwrap.dedent('''
        from pathlib import Path

        def make_dataset(root):
            """(image bytes, label) of each JPEG under root/<class>/."""
            files = sorted(Path(root).glob("*/*.jpg"))
            classes = sorted({f.parent.name for f in files})
            return [(f.read_bytes(), classes.index(f.parent.name)) for f in files]
    '''))
    with s3_store(re.search(r"s3://([^/]+)/", commands[0]).group(1)):
        for command in commands:
            out = run(command, tmp_path, environ(), timeout=120).stdout
            assert "16" in out, (command, out)
    assert (tmp_path / words(commands[1])[3] / "index.bin").is_file()


@pytest.mark.slow  # about 20 s: eight parts and the merge
def test_shards_doc_parts_and_merge(tmp_path):
    """docs/shards.md's parts: part 0/8 as written, the other seven as its comment says (machines 1..7),
    then the merge as written: the prefix then holds an index."""
    b = block("docs/shards.md: On many machines, and after a crash")
    part = next(c for c in b.commands() if "--part 0/8" in c)
    merge = b.command("hetero prepare --merge")
    w = words(part)
    images(tmp_path / w[2], per_class=4)
    bucket = re.search(r"s3://([^/]+)/", part).group(1)
    with s3_store(bucket) as srv:
        env = environ()
        run(part, tmp_path, env, timeout=120)
        from hetero.cli import main as hetero_main

        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            for i in range(1, 8):   # machines 1..7, in this process (each a process of its own is 4 s more)
                assert hetero_main(["prepare", w[2], w[3], "--part", f"{i}/8"]) == 0
        finally:
            os.chdir(cwd)
        run(merge, tmp_path, env, timeout=120)
        prefix = w[3].removeprefix(f"s3://{bucket}/")
        keys = {o["Key"] for o in srv.client(direct=True).list_objects_v2(Bucket=bucket)["Contents"]}
    assert f"{prefix}/index.bin" in keys, keys
