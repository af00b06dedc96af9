"""SageMaker script-mode entry point of a ``hetero prepare`` job (:mod:`hetero.sagemaker.prepare_job`).

SageMaker runs this file directly, often without the package installed, so the repository root
goes on ``sys.path`` first (and this folder comes off it).
"""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(os.path.dirname(_HERE))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def _main() -> int:
    from hetero.sagemaker.prepare_job import run_part

    return run_part(os.environ.get("HETERO_SM_ROOT", "/opt/ml"))


if __name__ == "__main__":
    sys.exit(_main())
