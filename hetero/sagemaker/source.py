"""Package this repository's code as the ``sourcedir.tar.gz`` SageMaker script mode expects.

The sagemaker-training toolkit in the training image downloads the archive named by the
``sagemaker_submit_directory`` hyperparameter into /opt/ml/code, pip-installs its
``requirements.txt`` if there is one, and runs ``sagemaker_program`` (launcher/entry.py)
from there. The archive is deterministic (sorted members, zero mtimes and owners), so the
same code gives the same bytes and digest.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import logging
import re
import tarfile
import tomllib
from pathlib import Path

from hetero.sagemaker.spec import ENTRY_POINT, SubmitError

log = logging.getLogger(__name__)

# What of the repository goes into the job: the packages the launcher imports, plus metadata.
PACKAGES = ("hetero", "data_service", "dnn_worker", "launcher", "benchmarks", "examples", "proto")
FILES = ("pyproject.toml",)
_SKIP_DIRS = {"__pycache__", ".pytest_cache", ".mypy_cache"}
_SKIP_SUFFIXES = (".pyc", ".pyo", ".so.tmp")
# Already in the PyTorch training images; reinstalling them from PyPI would swap the CUDA build.
_IN_IMAGE = {"torch", "torchvision"}


def repo_root() -> Path:
    """The checkout this package was imported from (the default source dir)."""
    return Path(__file__).resolve().parents[2]


def requirements(root: Path) -> str:
    """``requirements.txt`` text: pyproject's runtime dependencies minus what the image has."""
    path = root / "pyproject.toml"
    if not path.exists():
        return ""
    deps = tomllib.loads(path.read_text()).get("project", {}).get("dependencies", [])
    # a dependency's distribution name ends at its first version, extra or marker character
    keep = [dep for dep in deps if re.split(r"[;<>=!~\[ ]", dep.strip())[0].lower() not in _IN_IMAGE]
    return "".join(f"{d}\n" for d in keep)


def _members(root: Path) -> list[Path]:
    files = [root / f for f in FILES if (root / f).is_file()]
    for package in PACKAGES:
        base = root / package
        if not base.is_dir():
            continue
        for path in base.rglob("*"):
            rel = path.relative_to(root)
            if path.is_file() and not _SKIP_DIRS.intersection(rel.parts) and not path.name.endswith(_SKIP_SUFFIXES):
                files.append(path)
    return sorted(files)


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def build_sourcedir(root: str | Path | None = None) -> tuple[bytes, str]:
    """Build the archive in memory.

    Args:
        root: repository checkout to package (default: this one).

    Returns:
        ``(tar_gz_bytes, sha256_hex)``.

    Raises:
        SubmitError: ``root`` has no launcher entry point.
    """
    root = Path(root or repo_root())
    if not (root / ENTRY_POINT).is_file():
        raise SubmitError(f"source dir {root} has no {ENTRY_POINT} (the job's entry point); "
                          "pass --source-dir CHECKOUT, or --no-source if the image holds the code")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in _members(root):
            _add(tar, path.relative_to(root).as_posix(), path.read_bytes(), 0o755 if path.stat().st_mode & 0o111 else 0o644)
        reqs = requirements(root)
        if reqs and not (root / "requirements.txt").exists():
            _add(tar, "requirements.txt", reqs.encode())
    data = gzip.compress(raw.getvalue(), compresslevel=6, mtime=0)
    return data, hashlib.sha256(data).hexdigest()


def source_uri(prefix: str, job_name: str) -> str:
    """Where a job's archive goes: ``<prefix>/<job_name>/source/sourcedir.tar.gz`` (as the SDK does)."""
    return f"{prefix.rstrip('/')}/{job_name}/source/sourcedir.tar.gz"


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/key`` -> ``("bucket", "key")``."""
    if not uri.startswith("s3://"):
        raise SubmitError(f"{uri!r} is not an S3 URI (s3://bucket/key)")
    bucket, _, key = uri[len("s3://"):].partition("/")
    return bucket, key


def upload_source(s3, data: bytes, uri: str, digest: str = "") -> None:
    """Put the archive at ``uri`` with boto3 client ``s3``."""
    bucket, key = split_s3(uri)
    log.info("uploading source (%d bytes, sha256 %s) to %s", len(data), digest[:12] or "?", uri)
    s3.put_object(Bucket=bucket, Key=key, Body=data, Metadata={"sha256": digest} if digest else {})
