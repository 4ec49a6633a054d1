"""Shared helper of the mutation-based property tests (fuzz and breaker tests)."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import strategies as st


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


def mutate_once(draw: Any, obj: Any, values: Any, skip: tuple[str, ...] = ()) -> bool:
    """Delete one value of ``obj`` (in place), or replace it by a copy of one drawn from
    the ``values`` strategy: the path is drawn from :func:`paths`, leaving out the value
    itself and paths whose first key is in ``skip``.

    Args:
        draw: the ``draw`` of a ``hypothesis.strategies.composite``.

    Returns:
        False when ``obj`` had no path left to mutate.
    """
    candidates = [p for p in paths(obj) if p and p[0] not in skip]
    if not candidates:
        return False
    path = draw(st.sampled_from(candidates))
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    if draw(st.booleans()) and isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent[path[-1]] = copy.deepcopy(draw(values))  # sampled values are shared objects
    return True
