"""Is a usable SageMaker Python SDK installed? (v3, 3.18 or newer, below 4.)

Earlier 3.x releases send heterogeneous jobs SageMaker rejects (the SDK's own ``code`` and
``sm_drivers`` channels lacked instance groups until 3.18; InstanceType was injected beside
InstanceGroups until 3.5), and v2 has no ``sagemaker.train.ModelTrainer``.
"""
from __future__ import annotations

import importlib.metadata

MINIMUM = (3, 18)
BELOW = (4,)
REQUIREMENT = "sagemaker>=3.18,<4"
INSTALL = f"pip install '{REQUIREMENT}'"


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit()) if piece[:1].isdigit() else ""
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)


def installed_version() -> str | None:
    """The installed ``sagemaker`` distribution's version, or None."""
    try:
        return importlib.metadata.version("sagemaker")
    except importlib.metadata.PackageNotFoundError:
        return None


def sdk_problem(version: str | None = None) -> str | None:
    """Why the SDK cannot be used (naming the version and the fix), or None when it can.

    Args:
        version: the version to judge (default: the installed one).
    """
    version = installed_version() if version is None else version
    if version is None:
        return f"the SageMaker Python SDK is not installed; {INSTALL} (see docs/sdk.md)"
    found = _version_tuple(version)
    if found[:1] == (2,) or found[:1] < (2,):
        return (f"sagemaker {version} (SDK v{found[0] if found else '?'}) is installed; this needs the v3 "
                f"ModelTrainer: pip uninstall -y sagemaker && {INSTALL} (v2 and v3 cannot be installed together)")
    if found < MINIMUM:
        return (f"sagemaker {version} is older than 3.18 and sends heterogeneous jobs SageMaker rejects "
                f"(its code/sm_drivers channels lack instance groups); upgrade: {INSTALL}")
    if found >= BELOW:
        return f"sagemaker {version} is a major version this was not built for; install {REQUIREMENT}"
    return None
