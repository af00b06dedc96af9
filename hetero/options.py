"""Shared parsing of ``key=value`` options for the CLI."""
from __future__ import annotations

import json

from data_service.errors import ConfigError


def parse_kv(items: list[str] | None) -> dict:
    """``["a=1", "b=x", "c=[1,2]"]`` -> ``{"a": 1, "b": "x", "c": [1, 2]}`` (JSON when it parses)."""
    out: dict = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"option {item!r} must look like key=value")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out
