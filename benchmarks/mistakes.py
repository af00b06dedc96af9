"""A new user's mistakes with the commands the README shows, and what each gets back.

    python -m benchmarks.mistakes                 # every case; a markdown table on stdout
    python -m benchmarks.mistakes --only serve    # the cases whose name contains "serve"

Each case runs ``hetero ...`` as a user types it, in a session of its own (as a terminal runs a
command), from a folder that holds a small package ``mypkg`` (its builder
``mypkg.data:build_pipeline``). Some need a running data server, a port another process holds,
or a Ctrl-C (SIGINT to the command's process group, as a terminal sends it) some seconds in.
Reported per case: the exit code, the seconds to the error, the message (stderr, or stdout
where the command answers there), how many lines stderr held, whether a traceback showed, and
how many of the command's processes were still alive a second after it exited (found by a tag
in their environment, which every child inherits; killed then, so none outlives the run).

``tests/test_mistakes.py`` runs the same cases and holds each to: the exit code, the message
naming the value and the fix, at most a few lines on stderr, no traceback, no process left.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "mistakes-token"
TAG = "HETERO_MISTAKE_TAG"
MYPKG = '''\
import torch
from data_service import Pipeline


class Squares(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((3, 8, 8), i % 256, dtype=torch.uint8)


def build_pipeline(size: int = 64, batch_size: int = 8) -> Pipeline:
    return Pipeline(dataset=Squares(size), batch_size=batch_size, drop_last=True)
'''


@dataclass(frozen=True)
class Mistake:
    """One thing a user gets wrong. ``argv`` follows ``hetero``; in it ``{server}`` is a running
    data server's address, ``{busy}`` a port another process listens on, ``{free}`` a port nothing
    listens on, ``{tmp}`` an empty folder. ``expect``: words the message must hold (the value and
    the fix). ``code``: the exit code, or the codes allowed (None: any but 0). ``interrupt_s``:
    Ctrl-C that long after the start, or after a line matching ``interrupt_on``."""

    name: str
    argv: tuple[str, ...]
    expect: tuple[str, ...]
    code: int | tuple[int, ...] | None = None
    interrupt_s: float | None = None
    interrupt_on: str = ""  # Ctrl-C interrupt_s after a line matching this shows (else after interrupt_s from the start)
    token: bool = True
    cwd: str = "mypkg"  # "mypkg": the folder holding mypkg; "tmp": an empty one
    slow: bool = False  # starts a server or a job: seconds, not a fraction of one


CASES: tuple[Mistake, ...] = (
    Mistake("serve without a job token", ("serve", "mypkg.data:build_pipeline", "--port", "0"),
            ("HETERO_JOB_TOKEN", "--token"), code=2, token=False),
    Mistake("serve a module the folder does not hold", ("serve", "mypkg.data:build_pipeline", "--port", "0"),
            ("'mypkg'", "PYTHONPATH"), code=2, cwd="tmp"),
    Mistake("serve with a typo in -o", ("serve", "mypkg.data:build_pipeline", "-o", "batch_sise=16", "--port", "0"),
            ("batch_sise", "its parameters are", "batch_size"), code=2),
    Mistake("serve on a port in use", ("serve", "mypkg.data:build_pipeline", "--port", "{busy}"),
            ("{busy}", "pick another --port"), code=2),
    Mistake("serve with a port that is not a number", ("serve", "mypkg.data:build_pipeline", "--port", "6k"),
            ("--port", "'6k'"), code=2),
    Mistake("serve with an unknown --compression", ("serve", "mypkg.data:build_pipeline", "--compression", "gzip"),
            ("--compression", "gzip"), code=2),
    Mistake("serve with a bad --batch-window", ("serve", "mypkg.data:build_pipeline", "--batch-window", "4 gigs"),
            ("4 gigs",), code=2),
    Mistake("Ctrl-C while serve starts", ("serve", "mypkg.data:build_pipeline", "--port", "0", "--workers", "1"),
            (), code=(130, 0), interrupt_s=1.0, slow=True),  # 0 where it was serving already: a clean stop
    Mistake("Ctrl-C while serving", ("serve", "mypkg.data:build_pipeline", "--port", "0", "--workers", "1"),
            (), code=0, interrupt_s=0.5, interrupt_on=r"^serving ", slow=True),
    Mistake("stats with a wrong token", ("stats", "{server}", "--token", "wrong"),
            ("refused the job token", "HETERO_JOB_TOKEN"), code=1, slow=True),
    Mistake("stats of a server that is not there", ("stats", "127.0.0.1:{free}"),
            ("127.0.0.1:{free}", "nothing listens there", "check the address"), code=1),
    Mistake("stats of a local job's folder that is not there", ("stats", "--local", "{tmp}/out"),
            ("{tmp}/out/logs", "--output"), code=2),
    Mistake("stats without a port", ("stats", "localhost"), ("'localhost'", "host:port"), code=2),
    Mistake("shutdown of a stopped server (idempotent)", ("shutdown", "127.0.0.1:{free}"),
            ("already stopped",), code=0),
    Mistake("shutdown with a wrong token", ("shutdown", "{server}", "--token", "wrong"),
            ("refused the job token",), code=1, slow=True),
    Mistake("shutdown of a host that does not resolve", ("shutdown", "no-such-host.invalid:6000"),
            ("no-such-host.invalid:6000", "does not resolve"), code=1),
    Mistake("local with a typo in a hyperparameter", ("local", "--hp", "max_stesp=5"), ("max_stesp",), code=2),
    Mistake("local with a data folder that is not there", ("local", "--data", "{tmp}/nowhere"),
            ("{tmp}/nowhere",), code=2),
    Mistake("local with a pipeline that does not import", ("local", "--hp", "pipeline=mypkg.nowhere:build"),
            ("mypkg.nowhere",), code=2),
    Mistake("local with a word for a number", ("local", "--epochs", "two"), ("--epochs", "'two'"), code=2),
    Mistake("Ctrl-C while a local job starts", ("local", "--synth-train", "512", "--synth-test", "64", "--epochs", "10",
                                                "--hp", "evaluate=", "--hp", "emulate_step_s=0.5"),
            ("interrupted",), code=130, interrupt_s=2.0, slow=True),
    Mistake("Ctrl-C while a local job trains", ("local", "--synth-train", "512", "--synth-test", "64", "--epochs", "10",
                                                "--hp", "evaluate=", "--hp", "emulate_step_s=0.5",
                                                "--hp", "log_every=2"),
            ("interrupted",), code=130, interrupt_s=1.0, interrupt_on=r"step \d+:", slow=True),
    Mistake("prepare a folder that is not there", ("prepare", "{tmp}/nowhere", "{tmp}/shards"),
            ("{tmp}/nowhere",), code=2),
    Mistake("plan with a negative step", ("plan", "--gpu-step-s", "-1", "--preprocess-s", "1.0", "--batch-size", "256"),
            ("gpu_step_s", "-1"), code=2),
    Mistake("submit with an unknown instance type (dry run)",
            ("submit", "--role", "arn:aws:iam::123456789012:role/R", "--data-group", "ml.c5.huge:1",
             "--dnn-group", "ml.p3.2xlarge:1", "--output", "s3://my-bucket/out", "--region", "us-east-1",
             "--framework-version", "2.5", "--dry-run"),
            ("ml.c5.huge",), code=2),
    Mistake("sweep with --vary that has no values", ("sweep", "--job-name", "s", "--role",
                                                     "arn:aws:iam::123456789012:role/R", "--data-group",
                                                     "ml.c5.9xlarge:1", "--dnn-group", "ml.g5.xlarge:1",
                                                     "--output", "s3://my-bucket/out", "--region", "us-east-1", "--vary", "lr",
                                                     "--dry-run"),
            ("lr",), code=2),
)


@dataclass
class Outcome:
    """What one case got back."""

    code: int
    seconds: float
    message: str            # the last lines of stderr (else stdout) the user reads
    stderr_lines: int
    traceback: bool
    left: int               # its processes still alive a second after it exited
    out: str = field(repr=False, default="")
    err: str = field(repr=False, default="")


class Scene:
    """What the cases need: the folder holding mypkg, an empty one, a busy port, a running server."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.pkg_dir = work / "user"
        (self.pkg_dir / "mypkg").mkdir(parents=True, exist_ok=True)
        (self.pkg_dir / "mypkg" / "__init__.py").write_text("")
        (self.pkg_dir / "mypkg" / "data.py").write_text(MYPKG)
        self.tmp = work / "empty"
        self.tmp.mkdir(exist_ok=True)
        from hetero.ports import free_port

        import socket

        self._busy = socket.socket()
        self._busy.bind(("0.0.0.0", 0))
        self._busy.listen(1)
        self.busy = self._busy.getsockname()[1]
        self.free = free_port()
        self.server: subprocess.Popen | None = None
        self.server_address = ""

    def start_server(self, timeout: float = 120.0) -> str:
        if self.server is None:
            port_file = self.work / "server.port"
            self.server = subprocess.Popen(
                [*hetero(), "serve", "mypkg.data:build_pipeline", "--port", "0", "--workers", "1",
                 "--host", "127.0.0.1", "--port-file", str(port_file)],
                cwd=self.pkg_dir, env=env(tag="server"), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)
            deadline = time.monotonic() + timeout
            while not port_file.exists():
                if self.server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the scene's data server did not start")
                time.sleep(0.1)
            self.server_address = f"127.0.0.1:{port_file.read_text().strip()}"
        return self.server_address

    def fill(self, text: str) -> str:
        if "{server}" in text:
            text = text.replace("{server}", self.start_server())
        return text.replace("{busy}", str(self.busy)).replace("{free}", str(self.free)).replace("{tmp}", str(self.tmp))

    def close(self) -> None:
        self._busy.close()
        if self.server is not None:
            os.killpg(self.server.pid, signal.SIGKILL)
            self.server.wait(10)
        kill_tagged("server")


def hetero() -> list[str]:
    """The ``hetero`` console script a user types (it does not put the current folder on the path
    as ``python -m`` does), else ``python -m hetero``."""
    script = Path(sys.executable).parent / "hetero"
    return [str(script)] if script.exists() else [sys.executable, "-m", "hetero"]


def env(tag: str, token: bool = True) -> dict[str, str]:
    """A user's environment: the job token exported (or not), this checkout importable, a tag."""
    out = {k: v for k, v in os.environ.items() if k not in ("HETERO_JOB_TOKEN", "HETERO_DEBUG", "PYTHONPATH")}
    out[TAG] = tag
    if token:
        out["HETERO_JOB_TOKEN"] = TOKEN
    return out


def tagged(tag: str) -> list[int]:
    """PIDs of live processes whose environment carries ``tag``."""
    want = f"{TAG}={tag}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if want in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def kill_tagged(tag: str) -> None:
    for pid in tagged(tag):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _read(stream, into: list[str], pattern: str, seen: threading.Event) -> None:
    for line in stream:
        into.append(line)
        if pattern and re.search(pattern, line):
            seen.set()


def run(case: Mistake, scene: Scene, timeout: float = 120.0) -> Outcome:
    """Run one case as a user would; what it got back."""
    tag = uuid.uuid4().hex
    argv = [scene.fill(a) for a in case.argv]
    start = time.monotonic()
    proc = subprocess.Popen([*hetero(), *argv], env=env(tag, case.token),
                            cwd=scene.pkg_dir if case.cwd == "mypkg" else scene.tmp,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # SIGINT as a terminal's Ctrl-C finds it, whatever this run inherited: a shell's
                            # background job starts with SIGINT ignored, and the command would inherit that
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    out_lines: list[str] = []
    err_lines: list[str] = []
    seen = threading.Event()
    readers = [threading.Thread(target=_read, args=(proc.stdout, out_lines, case.interrupt_on, seen), daemon=True),
               threading.Thread(target=_read, args=(proc.stderr, err_lines, case.interrupt_on, seen), daemon=True)]
    for r in readers:
        r.start()
    try:
        if case.interrupt_s is not None:
            if case.interrupt_on:  # at that stage, however long the machine takes to reach it
                seen.wait(timeout)
                time.sleep(case.interrupt_s)
            try:
                proc.wait(0 if case.interrupt_on else case.interrupt_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for r in readers:
        r.join(10)
    out, err = "".join(out_lines), "".join(err_lines)
    seconds = time.monotonic() - start
    time.sleep(1.0)
    left = len(tagged(tag))
    kill_tagged(tag)
    lines = [line for line in err.splitlines() if line.strip()]
    shown = lines or [line for line in out.splitlines() if line.strip()]
    return Outcome(code=proc.returncode, seconds=seconds, message="\n".join(shown[-3:]), stderr_lines=len(lines),
                   traceback="Traceback (most recent call last)" in out + err, left=left, out=out, err=err)


def table(rows: list[tuple[Mistake, Outcome]]) -> str:
    head = ("| mistake | command | exit | seconds to the error | message | stderr lines | processes left |\n"
            "|---|---|---|---|---|---|---|")
    body = []
    for case, got in rows:
        message = (got.message.splitlines() or [""])[-1]
        if len(message) > 240:  # a list of every known name, say: its start tells the story
            message = message[:240].rstrip() + " ..."
        message = message.replace("|", "\\|")
        command = "hetero " + " ".join(case.argv)
        if case.interrupt_s is not None:
            command += f" (Ctrl-C after {case.interrupt_s:g} s)"
        body.append(f"| {case.name} | `{command}` | {got.code} | {got.seconds:.1f} | {message} | "
                    f"{got.stderr_lines} | {got.left} |")
    return "\n".join([head, *body])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", default="", help="run the cases whose name contains this (default: all)")
    args = p.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        scene = Scene(Path(work))
        try:
            for case in CASES:
                if args.only in case.name:
                    got = run(case, scene)
                    rows.append((case, got))
                    print(f"{case.name}: exit {got.code} in {got.seconds:.1f} s, left {got.left}", file=sys.stderr)
        finally:
            scene.close()
    print(f"`python -m benchmarks.mistakes`, {time.strftime('%Y-%m-%d')}:\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
