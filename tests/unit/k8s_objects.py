"""Builders of Kubernetes objects in their real API JSON shape, for the hints tests."""

from __future__ import annotations

from typing import Any

from agent import hints


def node(name: str, zone: str | None = None, cpu: str | None = "4", ready: bool = True,
         control_plane: bool = False) -> dict[str, Any]:
    """A Node with the zone label (if any), a Ready condition and allocatable CPU."""
    labels = {"kubernetes.io/hostname": name}
    if zone is not None:
        labels[hints.LABEL_ZONE] = zone
    if control_plane:
        labels["node-role.kubernetes.io/control-plane"] = ""
    status: dict[str, Any] = {"conditions": [{"type": "MemoryPressure", "status": "False"},
                                             {"type": "Ready", "status": "True" if ready else "False"}]}
    if cpu is not None:
        status["allocatable"] = {"cpu": cpu, "memory": "8Gi", "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "status": status}


def service(name: str = "web", ns: str = "shop", *, auto: bool = False,
            annotations: dict[str, str] | None = None, td: str | None = None,
            itp: str | None = None, stype: str = "ClusterIP", families: tuple[str, ...] = ("IPv4",),
            headless: bool = False) -> dict[str, Any]:
    """A Service with a selector and one port 80 (target 8080)."""
    ann = dict(annotations or {})
    if auto:
        ann[hints.ANNOTATION_TOPOLOGY_MODE] = "Auto"
    port: dict[str, Any] = {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}
    if stype in ("NodePort", "LoadBalancer"):
        port["nodePort"] = 30080
    spec: dict[str, Any] = {"type": stype, "selector": {"app": name}, "ports": [port],
                            "ipFamilies": list(families), "clusterIP": "None" if headless else "10.96.1.1"}
    if td is not None:
        spec["trafficDistribution"] = td
    if itp is not None:
        spec["internalTrafficPolicy"] = itp
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "annotations": ann}, "spec": spec}


def ep(addr: str, zone: str | None, node_name: str | None, ready: bool | None = True,
       zones: list[str] | None = None, nodes: list[str] | None = None,
       terminating: bool | None = None) -> dict[str, Any]:
    """An EndpointSlice endpoint; ``zones``/``nodes`` become hints."""
    cond: dict[str, Any] = {}
    if ready is not None:
        cond["ready"] = ready
        cond["serving"] = ready if terminating is None else True
    if terminating is not None:
        cond["terminating"] = terminating
    out: dict[str, Any] = {"addresses": [addr], "conditions": cond}
    if zone is not None:
        out["zone"] = zone
    if node_name is not None:
        out["nodeName"] = node_name
    if zones is not None or nodes is not None:
        h: dict[str, Any] = {}
        if zones is not None:
            h["forZones"] = [{"name": z} for z in zones]
        if nodes is not None:
            h["forNodes"] = [{"name": n} for n in nodes]
        out["hints"] = h
    return out


def endpointslice(name: str, svc: str, endpoints: list[dict[str, Any]], *, ns: str = "shop",
                  family: str = "IPv4", managed: bool = True) -> dict[str, Any]:
    """An EndpointSlice for ``svc`` with port http/8080."""
    labels = {hints.LABEL_SERVICE_NAME: svc,
              hints.LABEL_MANAGED_BY: hints.CONTROLLER_NAME if managed else "mirror.example.com"}
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": family,
            "metadata": {"name": name, "namespace": ns, "labels": labels},
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}], "endpoints": endpoints}


def three_zones(cpu: str = "4") -> list[dict[str, Any]]:
    """Nodes n-a, n-b, n-c in zones a, b, c."""
    return [node(f"n-{z}", z, cpu) for z in "abc"]


def own_zone_eps(counts: dict[str, int], hinted: bool = True) -> list[dict[str, Any]]:
    """Ready endpoints per zone on node n-<zone>, hinted for their own zone if ``hinted``."""
    out = []
    i = 0
    for z, n in counts.items():
        for _ in range(n):
            i += 1
            out.append(ep(f"10.0.0.{i}", z, f"n-{z}", zones=[z] if hinted else None))
    return out
