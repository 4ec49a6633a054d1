"""Builders of Kubernetes objects in their real API JSON shape, shared by the k8s tests
(imported as ``test_k8s_objects``), and a check that the snapshot loader accepts them."""

from __future__ import annotations

from typing import Any


def node(name: str, zone: str | None = "zone-a", *, region: str | None = "region-1",
         internal: str | list[str] | None = None, external: str | None = None,
         pod_cidrs: list[str] | None = None, beta: bool = False) -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if zone is not None:
        labels["failure-domain.beta.kubernetes.io/zone" if beta else "topology.kubernetes.io/zone"] = zone
    if region is not None:
        labels["topology.kubernetes.io/region"] = region
    addresses = [{"type": "Hostname", "address": name}]
    for ip in ([internal] if isinstance(internal, str) else internal or []):
        addresses.append({"type": "InternalIP", "address": ip})
    if external:
        addresses.append({"type": "ExternalIP", "address": external})
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels, "uid": f"uid-{name}",
                     "resourceVersion": "1",
                     "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
                     "managedFields": [{"manager": "kubelet", "operation": "Update"}]},
        "spec": {"podCIDR": (pod_cidrs or [None])[0], "podCIDRs": pod_cidrs or []},
        "status": {"addresses": addresses,
                   "allocatable": {"cpu": "4", "memory": "16Gi"},
                   "capacity": {"cpu": "4"},
                   "conditions": [{"type": "Ready", "status": "True"}],
                   "images": [{"names": ["big/image:1"], "sizeBytes": 123456}],
                   "nodeInfo": {"kubeletVersion": "v1.31.0"}},
    }


def pod(namespace: str, name: str, ip: str | list[str] | None, node_name: str | None = "n1", *,
        owner: tuple[str, str] | None = None, template_hash: str | None = None,
        host_network: bool = False, phase: str = "Running") -> dict[str, Any]:
    ips = [ip] if isinstance(ip, str) else (ip or [])
    labels = {"app": name}
    if template_hash:
        labels["pod-template-hash"] = template_hash
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels,
                            "uid": f"uid-{namespace}-{name}", "resourceVersion": "1"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1],
                                    "uid": "owner-uid", "controller": True}]
    status: dict[str, Any] = {"phase": phase}
    if ips:
        status["podIP"] = ips[0]
        status["podIPs"] = [{"ip": i} for i in ips]
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "x"}]}
    if node_name:
        spec["nodeName"] = node_name
    if host_network:
        spec["hostNetwork"] = True
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def service(namespace: str, name: str, cluster_ip: str | list[str] | None,
            ports: list[dict[str, Any]], *, annotations: dict[str, str] | None = None,
            traffic_distribution: str | None = None) -> dict[str, Any]:
    ips = [cluster_ip] if isinstance(cluster_ip, str) else (cluster_ip or [])
    spec: dict[str, Any] = {"ports": ports, "type": "ClusterIP"}
    if ips:
        spec["clusterIP"] = ips[0]
        spec["clusterIPs"] = ips
    if traffic_distribution:
        spec["trafficDistribution"] = traffic_distribution
    ann = {"kubectl.kubernetes.io/last-applied-configuration": "{...}"}
    ann.update(annotations or {})
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": namespace, "annotations": ann,
                         "uid": f"uid-svc-{name}", "resourceVersion": "1",
                         "managedFields": [{"manager": "kubectl"}]},
            "spec": spec, "status": {"loadBalancer": {}}}


def endpoint(ip: str | list[str], node_name: str | None = "n1", zone: str | None = "zone-a", *,
             ready: bool | None = True, serving: bool | None = None,
             hints: list[str] | None = None) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": [ip] if isinstance(ip, str) else ip, "conditions": {},
                          "targetRef": {"kind": "Pod", "name": "x", "namespace": "y", "uid": "u"}}
    if ready is not None:
        ep["conditions"]["ready"] = ready
    if serving is not None:
        ep["conditions"]["serving"] = serving
    if node_name:
        ep["nodeName"] = node_name
    if zone:
        ep["zone"] = zone
    if hints:
        ep["hints"] = {"forZones": [{"name": z} for z in hints]}
    return ep


def endpointslice(namespace: str, name: str, service_name: str | None,
                  ports: list[dict[str, Any]] | None, endpoints: list[dict[str, Any]] | None,
                  address_type: str = "IPv4") -> dict[str, Any]:
    labels = {"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}
    if service_name:
        labels["kubernetes.io/service-name"] = service_name
    obj: dict[str, Any] = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                           "metadata": {"name": name, "namespace": namespace, "labels": labels,
                                        "resourceVersion": "1",
                                        "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "x"},
                                        "managedFields": [{"manager": "kcm"}]},
                           "addressType": address_type}
    if ports is not None:
        obj["ports"] = ports
    if endpoints is not None:
        obj["endpoints"] = endpoints
    return obj


def test_builders_produce_objects_the_snapshot_loader_accepts() -> None:
    """The builders above are shared by the k8s tests: check they are real API shapes."""
    import json

    from agent.k8s import snapshot

    items = [node("n1", internal="10.1.0.1"), pod("ns", "p", "10.0.0.1"),
             service("ns", "s", "10.96.0.1", [{"port": 80}]),
             endpointslice("ns", "s-1", "s", [{"port": 8080}], [endpoint("10.0.0.1")])]
    snap = snapshot.load_text(json.dumps({"kind": "List", "items": items}), "built")
    assert (len(snap.nodes), len(snap.pods), len(snap.services), len(snap.endpointslices)) == (1, 1, 1, 1)
