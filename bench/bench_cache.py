#!/usr/bin/env python3
"""Memory and lookup speed of agent.k8s.cache.ClusterMetadata at cluster scale.

Builds synthetic objects in the Kubernetes API's JSON shape (Pods with ownerReferences,
labels, conditions and containers; Nodes with labels, addresses, podCIDRs and the status
blocks the cache prunes; Services; one EndpointSlice per Service), feeds them to the cache
the way a list does (lazily, page by page: the generator never holds the whole list), and
reports the process's resident memory and lookup rates. The process imports everything the
agent imports (kubernetes client, prometheus_client), so the RSS is what an agent with this
cache would use before flows.

Usage:
    python -m bench.bench_cache                       # 150k pods, 5k nodes, 10k Services
    python -m bench.bench_cache --pods 15000 --nodes 500 --services 1000   # quick run
    python -m bench.bench_cache -o json
    python -m bench.bench_cache --pod-scope node      # one agent's cache with --pod-scope node

Targets: RSS <= 300 MiB with 150,000 pods, 5,000 nodes, 10,000 Services.
"""

from __future__ import annotations

import argparse
import gc
import ipaddress
import json
import random
import sys
import time
from collections.abc import Iterator
from typing import Any

import kubernetes  # noqa: F401 - imported for an honest agent-sized RSS
import prometheus_client  # noqa: F401

from agent.k8s.cache import ClusterMetadata, MetadataSettings
from agent.records import PeerKind

ZONES = ("us-east-1a", "us-east-1b", "us-east-1c")


def rss_mib() -> float:
    """Resident set size of this process in MiB (from /proc/self/status VmRSS)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def node_cidr(k: int) -> str:
    return f"10.{k // 256}.{k % 256}.0/24"


def pod_ip(k: int, j: int) -> str:
    return f"10.{k // 256}.{k % 256}.{j + 2}"


def nodes(n: int) -> Iterator[dict[str, Any]]:
    for k in range(n):
        name = f"ip-192-168-{k // 256}-{k % 256}.ec2.internal"
        yield {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {
                "name": name, "uid": f"node-uid-{k:08d}", "resourceVersion": str(1000 + k),
                "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                           "node.kubernetes.io/instance-type": "m6i.2xlarge",
                           "topology.kubernetes.io/zone": ZONES[k % 3],
                           "topology.kubernetes.io/region": "us-east-1"},
                "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
                "managedFields": [{"manager": "kubelet", "operation": "Update", "fieldsV1": {"f:status": {}}}],
            },
            "spec": {"podCIDR": node_cidr(k), "podCIDRs": [node_cidr(k)], "providerID": f"aws:///{k}"},
            "status": {
                "addresses": [{"type": "InternalIP", "address": f"192.168.{k // 256}.{k % 256}"},
                              {"type": "Hostname", "address": name}],
                "allocatable": {"cpu": "7910m", "memory": "30Gi", "pods": "58"},
                "capacity": {"cpu": "8", "memory": "32Gi", "pods": "58"},
                "conditions": [{"type": t, "status": "False" if t != "Ready" else "True",
                                "lastHeartbeatTime": "2026-11-30T00:00:00Z", "reason": "KubeletReady"}
                               for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")],
                "images": [{"names": [f"registry/img{i}:v1"], "sizeBytes": 100000000} for i in range(10)],
                "nodeInfo": {"kubeletVersion": "v1.31.0", "osImage": "Amazon Linux 2023"},
            },
        }


def pods(n_pods: int, n_nodes: int, n_services: int) -> Iterator[dict[str, Any]]:
    per_node = -(-n_pods // n_nodes)
    for i in range(n_pods):
        k, j = i // per_node, i % per_node
        svc = i % n_services
        ns = f"team-{svc % 200}"
        dep = f"svc-{svc}"
        h = f"{svc:05x}c8f"
        node_name = f"ip-192-168-{k // 256}-{k % 256}.ec2.internal"
        yield {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": f"{dep}-{h}-{i:05x}", "namespace": ns, "uid": f"pod-uid-{i:012d}",
                "resourceVersion": str(5000 + i), "generateName": f"{dep}-{h}-",
                "labels": {"app": dep, "pod-template-hash": h, "team": ns},
                "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-11-29T00:00:00Z"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{dep}-{h}",
                                     "uid": f"rs-uid-{svc}", "controller": True,
                                     "blockOwnerDeletion": True}],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update"}],
            },
            "spec": {"nodeName": node_name, "serviceAccountName": "default",
                     "containers": [{"name": "app", "image": f"registry/{dep}:v1",
                                     "ports": [{"containerPort": 8080, "name": "http"}],
                                     "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}}}]},
            "status": {"phase": "Running", "podIP": pod_ip(k, j), "podIPs": [{"ip": pod_ip(k, j)}],
                       "hostIP": f"192.168.{k // 256}.{k % 256}",
                       "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "app", "ready": True, "restartCount": 0,
                                              "image": f"registry/{dep}:v1",
                                              "imageID": "sha256:" + "ab" * 32,
                                              "containerID": "containerd://" + "cd" * 32}]},
        }


def services(n: int) -> Iterator[dict[str, Any]]:
    for s in range(n):
        yield {
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": f"svc-{s}", "namespace": f"team-{s % 200}", "uid": f"svc-uid-{s}",
                         "resourceVersion": str(9000 + s),
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 300 + "}",
                                         **({"service.kubernetes.io/topology-mode": "Auto"} if s % 4 == 0 else {})},
                         "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"clusterIP": f"172.20.{s // 256}.{s % 256}", "clusterIPs": [f"172.20.{s // 256}.{s % 256}"],
                     "type": "ClusterIP", "selector": {"app": f"svc-{s}"},
                     "ports": [{"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"},
                               {"name": "metrics", "port": 9090, "targetPort": 9090, "protocol": "TCP"}]},
            "status": {"loadBalancer": {}},
        }


def endpointslices(n_pods: int, n_nodes: int, n_services: int) -> Iterator[dict[str, Any]]:
    per_node = -(-n_pods // n_nodes)
    members: list[list[int]] = [[] for _ in range(n_services)]
    for i in range(n_pods):
        members[i % n_services].append(i)
    for s in range(n_services):
        eps = []
        for i in members[s]:
            k, j = i // per_node, i % per_node
            eps.append({"addresses": [pod_ip(k, j)],
                        "conditions": {"ready": True, "serving": True, "terminating": False},
                        "nodeName": f"ip-192-168-{k // 256}-{k % 256}.ec2.internal",
                        "zone": ZONES[k % 3],
                        "targetRef": {"kind": "Pod", "namespace": f"team-{s % 200}",
                                      "name": f"pod-{i}", "uid": f"pod-uid-{i:012d}"},
                        **({"hints": {"forZones": [{"name": ZONES[k % 3]}]}} if s % 4 == 0 else {})})
        yield {
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": f"svc-{s}-abcde", "namespace": f"team-{s % 200}",
                         "resourceVersion": str(20000 + s), "uid": f"es-uid-{s}",
                         "labels": {"kubernetes.io/service-name": f"svc-{s}",
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                         "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-11-29T00:00:00Z"},
                         "ownerReferences": [{"kind": "Service", "name": f"svc-{s}", "uid": f"svc-uid-{s}"}],
                         "managedFields": [{"manager": "kube-controller-manager"}]},
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"},
                      {"name": "metrics", "port": 9090, "protocol": "TCP"}],
            "endpoints": eps,
        }


#: the node whose agent the cache belongs to (local endpoints; ``--pod-scope node``)
NODE = "ip-192-168-0-7.ec2.internal"


def run(n_pods: int, n_nodes: int, n_services: int, lookups: int, pod_scope: str = "cluster") -> dict[str, Any]:
    gc.collect()
    base = rss_mib()
    node_scope = pod_scope == "node"
    cache = ClusterMetadata(MetadataSettings(pod_node=NODE if node_scope else None))
    t0 = time.perf_counter()
    cache.replace("nodes", nodes(n_nodes))
    cache.replace("services", services(n_services))
    cache.replace("endpointslices", endpointslices(n_pods, n_nodes, n_services))
    # node scope: the list the apiserver answers with fieldSelector=spec.nodeName=NODE
    cache.replace("pods", (p for p in pods(n_pods, n_nodes, n_services)
                           if not node_scope or p["spec"]["nodeName"] == NODE))
    load_s = time.perf_counter() - t0
    gc.collect()
    loaded = rss_mib()

    rng = random.Random(1)
    per_node = -(-n_pods // n_nodes)
    addrs = []
    for _ in range(lookups):
        r = rng.random()
        if r < 0.8:
            i = rng.randrange(n_pods)
            addrs.append(ipaddress.ip_address(pod_ip(i // per_node, i % per_node)))
        elif r < 0.9:
            k = rng.randrange(n_nodes)
            addrs.append(ipaddress.ip_address(f"192.168.{k // 256}.{k % 256}"))
        else:
            addrs.append(ipaddress.ip_address(f"52.{rng.randrange(256)}.{rng.randrange(256)}.1"))
    t0 = time.perf_counter()
    kinds: dict[str, int] = {}
    for a in addrs:
        k = cache.resolve(a, at=None).kind.value
        kinds[k] = kinds.get(k, 0) + 1
    resolve_s = time.perf_counter() - t0

    # a node's flows touch a bounded working set of addresses per interval: 10,000 distinct
    # addresses looked up over and over (what the per-address memo is for)
    hot = addrs[:10_000] * max(1, lookups // 10_000)
    t0 = time.perf_counter()
    for a in hot:
        cache.resolve(a)
    hot_s = time.perf_counter() - t0

    pod_addrs = [a for a in addrs[: lookups // 2] if cache.resolve(a).kind is PeerKind.POD]
    t0 = time.perf_counter()
    hits = sum(1 for a in pod_addrs if cache.endpoint_services(a, 8080, 6))
    ep_s = time.perf_counter() - t0
    hot_eps = pod_addrs[:5_000] * max(1, len(pod_addrs) // 5_000)
    t0 = time.perf_counter()
    for a in hot_eps:
        cache.endpoint_services(a, 8080, 6)
    hot_ep_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    local = cache.local_endpoints(NODE)
    local_s = time.perf_counter() - t0

    return {
        "pods": n_pods, "nodes": n_nodes, "services": n_services, "pod_scope": pod_scope,
        "endpoints": n_pods, "counts": cache.counts(),
        "rss_before_mib": round(base, 1), "rss_loaded_mib": round(loaded, 1),
        "rss_cache_mib": round(loaded - base, 1),
        "load_seconds": round(load_s, 2),
        "resolve_per_second_uniform": round(lookups / resolve_s),
        "resolve_per_second_10k_working_set": round(len(hot) / hot_s),
        "resolved_kinds": kinds,
        "endpoint_services_per_second": round(len(pod_addrs) / ep_s) if ep_s else None,
        "endpoint_services_per_second_5k_working_set": round(len(hot_eps) / hot_ep_s) if hot_ep_s else None,
        "endpoint_hits": hits,
        "local_endpoints_first_call_ms": round(local_s * 1000, 1),
        "local_endpoints_count": len(local),
        "rss_after_lookups_mib": round(rss_mib(), 1),
        "python": sys.version.split()[0],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example: python -m bench.bench_cache --pods 150000 -o json")
    p.add_argument("--pods", type=int, default=150_000)
    p.add_argument("--nodes", type=int, default=5_000)
    p.add_argument("--services", type=int, default=10_000)
    p.add_argument("--lookups", type=int, default=200_000)
    p.add_argument("--pod-scope", choices=("cluster", "node"), default="cluster",
                   help="the agent's --pod-scope: every pod, or node 7's only (docs/metadata.md, Pod scope)")
    p.add_argument("-o", "--output", choices=("text", "json"), default="text")
    args = p.parse_args()
    res = run(args.pods, args.nodes, args.services, args.lookups, args.pod_scope)
    if args.output == "json":
        print(json.dumps(res, indent=2))
    else:
        for k, v in res.items():
            print(f"{k:32} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
