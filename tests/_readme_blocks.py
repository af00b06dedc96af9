"""The code blocks of the README and of the docs users copy from, and ways to run them as written.

A block's id is its file and the heading above it (``README.md: Serve it (CPU node)``), with ``#2``,
``#3`` ... for the second and later blocks under one heading. Blocks are run verbatim: a test may
prepare what a block says is the user's (a package, a data folder, a bucket, servers at the
addresses it names), pick which of its commands to run, run one in the background as a user runs it
in a terminal of its own, or append ``--dry-run``; it never rewrites a block's text.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
HEADING = re.compile(r"^#+ +(.*?)\s*$", re.M)
# the files whose blocks users copy: every fenced block of these is run or checked (tests/test_readme.py)
DOCUMENTS = ("README.md", "docs/images.md", "docs/shards.md", "docs/sweep.md", "docs/video.md")


@dataclass(frozen=True)
class Block:
    id: str
    lang: str       # "python", "bash", or "" for a fence without a language (a listing)
    text: str

    def commands(self) -> list[str]:
        """The block's shell commands: continuation lines joined, blank and comment-only lines left out."""
        out: list[str] = []
        pending = ""
        for line in self.text.splitlines():
            if not pending and (not line.strip() or line.lstrip().startswith("#")):
                continue
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            out.append(pending + line)
            pending = ""
        assert not pending, f"{self.id}: a command ends with a continuation"
        return out

    def command(self, start: str) -> str:
        """The one command that starts with ``start``."""
        found = [c for c in self.commands() if c.startswith(start)]
        assert len(found) == 1, f"{self.id}: {len(found)} commands start with {start!r}: {self.commands()}"
        return found[0]


def blocks(document: str) -> list[Block]:
    text = (ROOT / document).read_text()
    out: list[Block] = []
    seen: dict[str, int] = {}
    for m in FENCE.finditer(text):
        headings = HEADING.findall(text[:m.start()])
        base = f"{document}: {headings[-1] if headings else ''}"
        seen[base] = seen.get(base, 0) + 1
        out.append(Block(base if seen[base] == 1 else f"{base} #{seen[base]}", m.group(1), m.group(2)))
    return out


def all_blocks() -> dict[str, Block]:
    return {b.id: b for doc in DOCUMENTS for b in blocks(doc)}


def block(block_id: str) -> Block:
    return all_blocks()[block_id]


def words(command: str) -> list[str]:
    """A command's words, its trailing comment left out."""
    lex = shlex.shlex(command, posix=True, punctuation_chars=False)
    lex.whitespace_split = True
    lex.commenters = "#"
    return list(lex)


def elided(command: str) -> bool:
    """A command that leaves options out (``...``) or names a placeholder (``PIPELINE``, ``HOST:PORT``)."""
    return any(w in ("...",) or w.endswith("...") or re.fullmatch(r"[A-Z_]+(:[A-Z_]+)?", w) for w in words(command))


def check_options(command: str) -> None:
    """An elided ``hetero SUB ...`` command: every ``--option`` it names is one of SUB's, and those it
    gives values parse (the rest of the command is the user's)."""
    from hetero.cli import build_parser

    argv = words(command)
    argv = argv[argv.index("hetero"):]   # after any VAR=value the command sets
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[argv[1]]
    known = {s for a in sub._actions for s in a.option_strings}
    named = [w.split("=", 1)[0] for w in argv[2:] if w.startswith("--")]
    unknown = [w for w in named if w not in known]
    assert not unknown, f"{command!r}: hetero {argv[1]} has no option {', '.join(unknown)}"


def environ(**extra: str) -> dict[str, str]:
    """This process's variables with the venv's bin first on PATH (``hetero``, ``python``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HETERO_", "SM_"))}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def run_group(argv: list[str], cwd: Path, env: dict[str, str], timeout: float, what: str) -> tuple[int, str]:
    """``argv`` in its own process group, killed whole when it ends or runs past ``timeout``
    (nothing is left behind); its exit code and output (stdout and stderr together)."""
    p = subprocess.Popen(argv, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(p)
        out, _ = p.communicate()
        raise AssertionError(f"{what} ran past {timeout} s:\n{out[-6000:]}")
    finally:
        kill_group(p)
    return p.returncode, out


def run(command: str, cwd: Path, env: dict[str, str], timeout: float = 120, check: bool = True
        ) -> subprocess.CompletedProcess:
    """One command as written, through bash, in its own process group (killed whole on a timeout)."""
    code, out = run_group(["bash", "-euo", "pipefail", "-c", command], cwd, env, timeout, repr(command))
    if check:
        assert code == 0, f"{command!r} exited {code}:\n{out[-6000:]}"
    return subprocess.CompletedProcess(command, code, out, "")


def kill_group(p: subprocess.Popen) -> None:
    """Kill what is left of ``p``'s process group (``p`` started with ``start_new_session``)."""
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# A private network and mount namespace: the blocks' fixed ports (``--port 6000``) are free there
# whatever else runs on this machine, and ``/etc/hosts`` there names the hosts a block names
# (``cpu-1``, ``cpu-2``), as a cluster's DNS would.
NETNS_SCRIPT = 'ip link set lo up && mount --bind "$HOSTS" /etc/hosts && exec "$@"'


def netns_available() -> str:
    """'' when this machine can make a private network namespace, else why not."""
    if not shutil.which("unshare") or not shutil.which("ip"):
        return "needs unshare and ip (util-linux, iproute2)"
    probe = subprocess.run(["unshare", "--user", "--map-root-user", "--net", "--mount", "sh", "-c",
                            "ip link set lo up && mount --bind /etc/hosts /etc/hosts"],
                           capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"no private network namespace here: {probe.stderr.strip()[:200]}"


def in_netns(argv: list[str], hosts: Path) -> list[str]:
    return ["unshare", "--user", "--map-root-user", "--net", "--mount", "env", f"HOSTS={hosts}",
            "sh", "-c", NETNS_SCRIPT, "netns", *argv]


def write_hosts(path: Path, names: dict[str, str]) -> Path:
    path.write_text("127.0.0.1 localhost\n::1 localhost\n" + "".join(f"{ip} {n}\n" for n, ip in names.items()))
    return path
