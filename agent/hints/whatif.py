"""The logic of ``zonemeter what-if``: which replica counts topology-mode Auto accepts in zones of given CPU.

A synthetic cluster is built as records (one Ready worker per zone, one Auto Service, one
managed EndpointSlice) and run through the controller and kube-proxy model
(:func:`agent.hints.diagnose`). Argument handling and printing are in :mod:`agent.cli.whatif`.
"""

from __future__ import annotations

from typing import Any

from agent.errors import InputError
from agent.hints.controller import index_node_infos
from agent.hints.diagnosis import diagnose
from agent.hints.versions import DEFAULT_VERSION, KubeVersion
from agent.hints.vocabulary import ANNOTATION_TOPOLOGY_MODE
from agent.k8s.parse import Endpoint, NodeInfo, ServiceInfo, Slice, cpu_millis

#: largest replica count (or --spread count) what-if models: beyond any real Service
MAX_WHATIF_REPLICAS = 100_000
#: most endpoints what-if builds over a whole range (about 1 s per million)
MAX_WHATIF_ENDPOINTS = 5_000_000


def what_if(zones: dict[str, str], replicas: range, spread: dict[str, int] | None = None,
            version: str = DEFAULT_VERSION) -> dict[str, Any]:
    """Run the controller model for each replica count on a synthetic cluster.

    One Ready worker per zone with the given allocatable CPU; ``n`` ready endpoints placed by
    cycling through the zones (``spread`` endpoints per zone per round, default 1), in zone
    order; one Service with ``topology-mode: Auto``.

    Returns:
        ``{"rows": [{"replicas", "hints_enabled", "reason", "minimums", "hints_per_zone"}]}``.

    Raises:
        InputError: bad CPU quantity (``--zone``) or spread zone (``--spread``), bad version.
    """
    nodes = []
    for z, cpu in zones.items():
        try:
            millis = cpu_millis(cpu, f"zone {z}")
        except InputError as err:
            raise InputError(err.problem, obj=f"zone {z}", field="--zone") from None
        nodes.append(NodeInfo(name=f"what-if-{z}", zone=z, ready=True, excluded=False, cpu_milli=millis))
    spread = spread or {z: 1 for z in zones}
    for z in spread:
        if z not in zones:
            raise InputError(f"zone {z!r} is not among --zone", field="--spread")
    cycle = [z for z in zones if z in spread for _ in range(spread[z])]
    if not cycle:
        raise InputError("places no endpoint", field="--spread")
    kv = KubeVersion.parse(version)
    idx = index_node_infos(tuple(nodes))
    # what ``kubectl get svc -o json`` would show for: topology-mode Auto, one port 80
    svc = ServiceInfo(namespace="default", name="what-if", type="ClusterIP",
                      annotations={ANNOTATION_TOPOLOGY_MODE: "Auto"}, traffic_distribution=None,
                      internal_local=False, external_local=False, externally_accessible=False,
                      headless=False, ip_families=(), first_port_name="")
    rows = []
    for n in replicas:
        eps = tuple(Endpoint(f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}", True, None, None,
                             cycle[i % len(cycle)], f"what-if-{cycle[i % len(cycle)]}", None)
                    for i in range(n))
        es = Slice(name="what-if-1", address_type="IPv4", managed=True, ports=(("", 80),), endpoints=eps)
        d = diagnose(svc, "IPv4", [es], idx, kv, False)
        c = d.controller
        per_zone: dict[str, int] | None = None
        if c.hints_enabled:
            per_zone = {z: 0 for z in zones}
            for h in c.hints.values():
                for z in (h.for_zones if h else ()):
                    per_zone[z] = per_zone.get(z, 0) + 1
        rows.append({"replicas": n, "hints_enabled": c.hints_enabled,
                     "reason": c.refusal_reason,
                     "minimums": dict(c.minimums) if c.minimums is not None else None,
                     "hints_per_zone": per_zone})
    return {"rows": rows}
