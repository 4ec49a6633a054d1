"""Shared helper of the mutation-based property tests (fuzz and breaker tests)."""

from __future__ import annotations

from typing import Any


def paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON-shaped value, the value itself first: ``()``, then dict keys
    and list indexes, depth first (a hypothesis strategy picks one to mutate)."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += paths(v, prefix + (i,))
    return out
