"""A small two-zone cluster as API-shaped objects, shared by the agent/adapters/top tests.

Nodes ``na`` (zone-a) and ``nb`` (zone-b); pods ``client-a`` (Deployment ``client``) on
na, ``client-b`` on nb, ``web-a`` on na and ``web-b`` on nb; Service ``shop/web``
(ClusterIP 10.96.0.10, port 80 -> 8080 ``http``, ``trafficDistribution: PreferClose``)
whose slice hints each endpoint to its own zone; Service ``shop/db`` without locality.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"


def node(name: str, ip: str, zone: str, pod_cidr: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, ZONE: zone,
                                                  REGION: "region-1"}},
            "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr]},
            "status": {"addresses": [{"type": "InternalIP", "address": ip}],
                       "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(name: str, node_name: str, ip: str, app: str, rs_hash: str | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "shop", "name": name, "uid": f"uid-{name}",
                            "labels": {"app": app}}
    if rs_hash:
        meta["labels"]["pod-template-hash"] = rs_hash
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                    "name": f"{app}-{rs_hash}", "controller": True,
                                    "uid": f"uid-rs-{app}"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node_name, "containers": [{"name": "main"}]},
            "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}}


def service(name: str, cluster_ip: str, port: int, target: int,
            td: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": "ClusterIP", "clusterIP": cluster_ip, "clusterIPs": [cluster_ip],
                            "ipFamilies": ["IPv4"], "selector": {"app": name},
                            "ports": [{"name": "http", "port": port, "targetPort": target,
                                       "protocol": "TCP"}]}
    if td:
        spec["trafficDistribution"] = td
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "shop", "name": name}, "spec": spec}


def endpoint(ip: str, node_name: str, zone: str, hint: bool) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": [ip], "nodeName": node_name, "zone": zone,
                          "conditions": {"ready": True, "serving": True, "terminating": False}}
    if hint:
        ep["hints"] = {"forZones": [{"name": zone}]}
    return ep


def endpointslice(svc: str, endpoints: list[dict[str, Any]], port: int) -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": "shop", "name": f"{svc}-abcde",
                         "labels": {"kubernetes.io/service-name": svc,
                                    "endpointslice.kubernetes.io/managed-by":
                                        "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": "http", "port": port, "protocol": "TCP"}]}


def cluster(hinted: bool = True) -> dict[str, list[dict[str, Any]]]:
    """Return ``{"nodes", "pods", "services", "endpointslices"}`` (fresh copies)."""
    return copy.deepcopy({
        "nodes": [node("na", "10.1.0.1", "zone-a", "10.244.1.0/24"),
                  node("nb", "10.1.0.2", "zone-b", "10.244.2.0/24")],
        "pods": [pod("client-a", "na", "10.244.1.10", "client", "5d8f7c"),
                 pod("client-b", "nb", "10.244.2.10", "client", "5d8f7c"),
                 pod("web-a", "na", "10.244.1.20", "web"),
                 pod("web-b", "nb", "10.244.2.20", "web"),
                 pod("db-b", "nb", "10.244.2.30", "db")],
        "services": [service("web", "10.96.0.10", 80, 8080, "PreferClose"),
                     service("db", "10.96.0.20", 5432, 5432)],
        "endpointslices": [
            endpointslice("web", [endpoint("10.244.1.20", "na", "zone-a", hinted),
                                  endpoint("10.244.2.20", "nb", "zone-b", hinted)], 8080),
            endpointslice("db", [endpoint("10.244.2.30", "nb", "zone-b", False)], 5432)],
    })


def write_snapshot(path: Path, objs: dict[str, list[dict[str, Any]]] | None = None) -> Path:
    """Write the cluster as a kubectl ``List`` JSON file."""
    objs = objs or cluster()
    items = [o for kind in ("nodes", "pods", "services", "endpointslices") for o in objs[kind]]
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return path
