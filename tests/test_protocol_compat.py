"""The generated gRPC code stays loadable beside the SageMaker SDK (protobuf 6) and on protobuf 7.

sagemaker-core pins protobuf<7, so the `sagemaker` extra resolves only while data_service/protocol/generated/
carries protobuf 6.x gencode and pyproject accepts protobuf 6: docs/sdk.md ("Installing the SDK").
"""
from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parent.parent


def _gen_proto():
    spec = importlib.util.spec_from_file_location("gen_proto", ROOT / "scripts" / "gen_proto.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _requirement(extra: str | None, name: str) -> Requirement:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] if extra is None else project["optional-dependencies"][extra]
    found = [Requirement(r) for r in reqs if Requirement(r).name == name]
    if len(found) != 1:
        raise LookupError(f"{name} is listed {len(found)} times in {extra or 'dependencies'}")
    return found[0]


def _gencode_version() -> tuple[int, int, int]:
    text = (ROOT / "data_service" / "protocol" / "generated" / "data_service_pb2.py").read_text()
    match = re.search(r"ValidateProtobufRuntimeVersion\(\s*\S+,\s*(\d+),\s*(\d+),\s*(\d+),", text)
    if match is None:
        raise LookupError("no ValidateProtobufRuntimeVersion call in data_service_pb2.py")
    return tuple(int(g) for g in match.groups())


def test_dev_extra_pins_the_grpcio_tools_gen_proto_requires():
    assert str(_requirement("dev", "grpcio-tools").specifier) == f"=={_gen_proto().GRPCIO_TOOLS}"


def test_gencode_is_protobuf_6_and_the_protobuf_range_admits_it_and_7():
    major, minor, patch = _gencode_version()
    assert major == 6, "regenerated with grpcio-tools writing protobuf 7 gencode: the sagemaker extra cannot resolve"
    protobuf = _requirement(None, "protobuf").specifier
    # The lowest runtime allowed is exactly the gencode's: an older runtime refuses the module.
    assert [s.version for s in protobuf if s.operator == ">="] == [f"{major}.{minor}.{patch}"]
    assert "6.33.6" in protobuf and "7.36.2" in protobuf


def test_sagemaker_extra_and_dev_name_the_sdk():
    for extra in ("sagemaker", "dev"):
        assert str(_requirement(extra, "sagemaker").specifier) in ("<4,>=3.18", ">=3.18,<4")


def test_wire_modules_import_without_warnings():
    # A gencode one major older than a 6.x runtime warns; the check must stay silent here.
    code = "import data_service.protocol.generated.data_service_pb2_grpc, google.protobuf as p; print(p.__version__)"
    out = subprocess.run([sys.executable, "-W", "error", "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
