"""Which Services' locality series this agent exports: a few owners per Service, not all.

The locality families (``zonemeter_service_locality_in_effect``,
``..._expected_cross_zone_ratio``, ``..._locality_info``, ``..._last_change_timestamp_seconds``)
describe cluster-wide state: every agent's hint model derives the same values from the same
Service, EndpointSlice and Node objects. Exported by every agent for every Service they cost
Services x zones x nodes series cluster-wide (80,627 series and 9.2 MB per scrape of each
agent at 10,000 Services, 400 million at 5,000 nodes; BENCHMARKS.md, "The agent's own
cost"). Every query over them aggregates by Service (``min by``/``max by (namespace,
service[, client_zone])``: deploy/daemonset/monitoring, ``agent.report.compute``), so any
agent's copy will do. Each Service is therefore exported by

* the ``replicas`` nodes that follow the Service's point on a hash ring of the cluster's
  Node names (consistent hashing: a node joining or leaving moves only the Services next to
  it), so a Service without traffic still has its state in Prometheus, on more than one
  agent in case one is down; and
* every agent that counted bytes of that Service (its ``service_bytes``,
  ``hint_ignored_bytes`` or ``client_path_bytes`` series), so the node whose bytes a
  dashboard shows also shows the locality they were counted under.

Clusters of at most ``replicas`` nodes export every Service from every agent, as without
the ring. docs/metrics.md, "Locality series", is the contract.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Mapping
from typing import TypeVar

from agent.records import ServiceRef

__all__ = ["DEFAULT_REPLICAS", "LocalityShard", "ring_point"]

#: ``--locality-replicas`` default: owners per Service besides the agents with its bytes
DEFAULT_REPLICAS = 3

V = TypeVar("V")


def ring_point(text: str) -> int:
    """A point on the ring: the first 8 bytes of BLAKE2b of ``text`` (UTF-8), big-endian.

    Stable across processes and Python versions (``hash()`` is salted per process), so
    every agent of a cluster places every node and Service at the same point.
    """
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


class LocalityShard:
    """Selects the Services whose locality series this node's agent exports.

    Args:
        node: this node's name.
        replicas: ring owners per Service (>= 0); 0 exports every Service, as every agent
            did before the ring.

    Raises:
        ValueError: ``replicas`` < 0.
    """

    def __init__(self, node: str, replicas: int = DEFAULT_REPLICAS) -> None:
        if replicas < 0:
            raise ValueError(f"locality replicas must be >= 0, got {replicas}")
        self.node = node
        self.replicas = replicas
        self._ring_key: frozenset[str] | None = None
        self._points: list[int] = []
        self._names: list[str] = []
        self._owned: dict[ServiceRef, bool] = {}

    def _set_ring(self, nodes: Iterable[str]) -> None:
        key = frozenset(nodes)
        if key == self._ring_key:
            return
        ring = sorted((ring_point(n), n) for n in key)
        self._ring_key = key
        self._points = [p for p, _ in ring]
        self._names = [n for _, n in ring]
        self._owned = {}

    def owns(self, ref: ServiceRef) -> bool:
        """True when this node is one of ``ref``'s ring owners (the ring of the last
        :meth:`select`). Memoized per Service until the node set changes."""
        hit = self._owned.get(ref)
        if hit is not None:
            return hit
        n = len(self._names)
        if self.replicas == 0 or n <= self.replicas:
            owned = True
        else:
            start = bisect.bisect_left(self._points, ring_point(f"{ref.namespace}/{ref.service}"))
            owned = any(self._names[(start + i) % n] == self.node for i in range(self.replicas))
        self._owned[ref] = owned
        return owned

    def select(self, locality: Mapping[ServiceRef, V], nodes: Iterable[str],
               active: Iterable[ServiceRef] = ()) -> Mapping[ServiceRef, V]:
        """The part of ``locality`` this agent exports.

        Args:
            locality: ``{ServiceRef: Locality}`` (``HintModel.localities()``).
            nodes: names of the cluster's Nodes (this node need not be among them: then it
                owns no Service on the ring and exports only ``active`` ones).
            active: Services this agent counted bytes of (exported whatever the ring says).

        Returns:
            ``locality`` itself when every Service is exported, else a new dict.
        """
        self._set_ring(nodes)
        if self.replicas == 0 or len(self._names) <= self.replicas:
            return locality
        if len(self._owned) > 2 * len(locality) + 1024:  # deleted Services' memo entries
            self._owned = {}
        keep = set(active)
        return {ref: loc for ref, loc in locality.items() if ref in keep or self.owns(ref)}
