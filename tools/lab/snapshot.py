"""The lab's Kubernetes objects, in real API JSON shape, for ``--snapshot`` consumers.

:func:`build` turns a :class:`~tools.lab.topology.Topology` into a ``kubectl get
nodes,services,endpointslices,pods -A -o json`` style ``List`` that
:func:`agent.k8s.snapshot.load` reads: Nodes with zone/region labels, allocatable CPU,
InternalIP addresses and a Ready condition; Pods with ``nodeName``, ``hostNetwork``,
container ports, ``podIP``/``podIPs`` and Ready; Services with ClusterIP(s), ports,
selector, annotations, ``trafficDistribution`` and ``internalTrafficPolicy``; one
EndpointSlice per Service and address family (``<service>-ipv4``/``-ipv6``,
``endpointslice.kubernetes.io/managed-by: endpointslice-controller.k8s.io``) with every
endpoint's ``nodeName``, ``zone``, ``conditions`` and, when the caller supplies them,
``hints`` (the lab does not decide hints itself: the EndpointSlice controller model in
``agent/hints/`` does, and passes them through ``hints``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tools.lab.topology import Pod, Service, Topology, resolve_target_port

#: hints for one Service: {endpoint pod name: {"forZones": [zone...], "forNodes": [node...]}}
#: (either key may be missing); pods absent from the mapping get no hints
HintsFn = Callable[[Service], Mapping[str, Mapping[str, list[str]]] | None]

ZONE_LABEL = "topology.kubernetes.io/zone"
REGION_LABEL = "topology.kubernetes.io/region"
_TIMESTAMP = "2026-01-01T00:00:00Z"


def _uid(*parts: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "zonemeter-lab/" + "/".join(parts)))


def _node(topo: Topology, name: str, kubernetes_version: str | None = None) -> dict[str, Any]:
    n = topo.node(name)
    zone = next(z for z in topo.zones if z.name == n.zone)
    labels = {"kubernetes.io/hostname": n.name, "kubernetes.io/os": "linux", ZONE_LABEL: n.zone}
    if zone.region:
        labels[REGION_LABEL] = zone.region
    cpu = f"{int(n.cpu)}" if n.cpu == int(n.cpu) else f"{int(n.cpu * 1000)}m"
    addresses = [{"type": "InternalIP", "address": str(n.ip)}]
    if n.ip6 is not None:
        addresses.append({"type": "InternalIP", "address": str(n.ip6)})
    addresses.append({"type": "Hostname", "address": n.name})
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": n.name, "uid": _uid("node", n.name), "labels": labels,
                     "creationTimestamp": _TIMESTAMP},
        "spec": {"podCIDR": str(n.pod_cidr),
                 "podCIDRs": [str(n.pod_cidr)] + ([str(n.pod_cidr_v6)] if n.pod_cidr_v6 else [])},
        "status": {
            "capacity": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "allocatable": {"cpu": cpu, "memory": "8Gi", "pods": "110"},
            "addresses": addresses,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastTransitionTime": _TIMESTAMP}],
            # what a kubelet of that version reports (kubeProxyVersion empty: KEP-4004); the
            # hint model judges the node's kube-proxy as this version
            **({"nodeInfo": {"kubeletVersion": f"v{kubernetes_version}.0", "kubeProxyVersion": ""}}
               if kubernetes_version else {}),
        },
    }


def _pod(topo: Topology, pod: Pod) -> dict[str, Any]:
    host_ip = str(topo.node(pod.node).ip)
    ips = [str(pod.ip)] + ([str(pod.ip6)] if pod.ip6 is not None else [])
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": pod.name, "namespace": pod.namespace,
                     "uid": _uid("pod", pod.namespace, pod.name), "labels": dict(pod.labels),
                     "creationTimestamp": _TIMESTAMP},
        "spec": {
            "nodeName": pod.node,
            **({"hostNetwork": True} if pod.host_network else {}),
            "containers": [{
                "name": "main", "image": "zonemeter-lab/traffic",
                "ports": [{"containerPort": pp.port, "protocol": pp.protocol,
                           **({"name": pp.name} if pp.name else {}),
                           **({"hostPort": pp.host_port} if pp.host_port is not None else {})}
                          for pp in pod.ports],
            }],
        },
        "status": {
            "phase": "Running", "podIP": ips[0], "podIPs": [{"ip": ip} for ip in ips],
            "hostIP": host_ip,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": _TIMESTAMP}],
        },
    }


def _service(topo: Topology, svc: Service) -> dict[str, Any]:
    if svc.cluster_ip is None:  # headless: the apiserver keeps "None" in both fields
        ips = ["None"]
        dual = topo.options.ipv6
    else:
        ips = [str(svc.cluster_ip)] + ([str(svc.cluster_ip6)] if svc.cluster_ip6 else [])
        dual = svc.cluster_ip6 is not None
    spec: dict[str, Any] = {
        "type": svc.type, "clusterIP": ips[0], "clusterIPs": ips,
        "ipFamilies": ["IPv4"] + (["IPv6"] if dual else []),
        "ipFamilyPolicy": "PreferDualStack" if dual else "SingleStack",
        "ports": [{"port": sp.port, "targetPort": sp.target_port, "protocol": sp.protocol,
                   **({"name": sp.name} if sp.name else {}),
                   **({"nodePort": sp.node_port} if sp.node_port is not None else {})}
                  for sp in svc.ports],
        "internalTrafficPolicy": svc.internal_traffic_policy,
        "sessionAffinity": "None",
    }
    if svc.node_ports:
        # Cluster: the receiving node masquerades (kube-proxy); Local: its own endpoints only
        spec["externalTrafficPolicy"] = svc.external_traffic_policy
    if svc.selector is not None:
        spec["selector"] = dict(svc.selector)
    if svc.traffic_distribution:
        spec["trafficDistribution"] = svc.traffic_distribution
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": svc.name, "namespace": svc.namespace,
                     "uid": _uid("service", svc.key), "annotations": dict(svc.annotations),
                     "creationTimestamp": _TIMESTAMP},
        "spec": spec,
    }


def _slices(topo: Topology, svc: Service,
            hints: Mapping[str, Mapping[str, list[str]]] | None) -> list[dict[str, Any]]:
    out = []
    families = [4] + ([6] if svc.cluster_ip6 or (svc.headless and topo.options.ipv6) else [])
    for family in families:
        endpoints = []
        ports: list[dict[str, Any]] | None = None
        for name in svc.endpoints:
            pod = topo.pod(name)
            if family == 6 and pod.ip6 is None:
                continue
            ep: dict[str, Any] = {
                "addresses": [str(pod.address(family))],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "nodeName": pod.node,
                "zone": topo.zone_of(pod.node),
                "targetRef": {"kind": "Pod", "namespace": pod.namespace, "name": pod.name,
                              "uid": _uid("pod", pod.namespace, pod.name)},
            }
            h = (hints or {}).get(name)
            if h:
                ep["hints"] = {}
                if h.get("forZones") is not None:
                    ep["hints"]["forZones"] = [{"name": z} for z in h["forZones"]]
                if h.get("forNodes") is not None:
                    ep["hints"]["forNodes"] = [{"name": n} for n in h["forNodes"]]
            endpoints.append(ep)
            if ports is None:
                ports = [{"port": resolve_target_port(pod, sp), "protocol": sp.protocol,
                          **({"name": sp.name} if sp.name else {"name": ""})}
                         for sp in svc.ports]
        kind = "IPv4" if family == 4 else "IPv6"
        out.append({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {
                "name": f"{svc.name}-{kind.lower()}", "namespace": svc.namespace,
                "uid": _uid("endpointslice", svc.key, kind),
                "labels": {"kubernetes.io/service-name": svc.name,
                           "endpointslice.kubernetes.io/managed-by":
                               "endpointslice-controller.k8s.io"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": svc.name,
                                     "uid": _uid("service", svc.key), "controller": True}],
                "creationTimestamp": _TIMESTAMP,
            },
            "addressType": kind,
            "endpoints": endpoints,
            "ports": ports or [],
        })
    return out


def build(topo: Topology, hints: HintsFn | None = None,
          kubernetes_version: str | None = None) -> dict[str, Any]:
    """Return the lab's objects as a ``{"apiVersion": "v1", "kind": "List", "items": [...]}``.

    Args:
        topo: the lab topology.
        hints: called once per Service; returns the EndpointSlice ``hints`` per endpoint
            pod, or ``None`` for none (what the EndpointSlice controller would write).
        kubernetes_version: ``"1.X"`` the lab's cluster runs: every Node reports
            ``status.nodeInfo.kubeletVersion: v1.X.0``; None: no ``nodeInfo``.

    Returns:
        Nodes, then Pods, Services and EndpointSlices, each in topology order.
    """
    items: list[dict[str, Any]] = [_node(topo, n.name, kubernetes_version) for n in topo.nodes]
    items += [_pod(topo, p) for p in topo.pods]
    for svc in topo.services:
        items.append(_service(topo, svc))
    for svc in topo.services:
        items += _slices(topo, svc, hints(svc) if hints else None)
    return {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""},
            "items": items}


def version_document(kubernetes_version: str) -> dict[str, Any]:
    """``kubectl version -o json`` of a cluster at ``"1.X"`` (the ``version.json`` that
    ``zonemeter explain/agent --snapshot`` read beside a dump, docs/hints.md)."""
    minor = kubernetes_version.split(".")[1]
    return {"serverVersion": {"major": "1", "minor": minor, "gitVersion": f"v{kubernetes_version}.0"}}


def write(topo: Topology, path: Path | str, hints: HintsFn | None = None,
          kubernetes_version: str | None = None) -> Path:
    """Write :func:`build`'s output as JSON to ``path`` (atomically) and return the path.

    With ``kubernetes_version``, also write :func:`version_document` as ``version.json``
    beside it, so the agent and ``explain`` model that version.
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(build(topo, hints, kubernetes_version), indent=1))
    tmp.replace(path)
    if kubernetes_version:
        vpath = path.with_name("version.json")
        vtmp = vpath.with_name(vpath.name + ".tmp")
        vtmp.write_text(json.dumps(version_document(kubernetes_version)))
        vtmp.replace(vpath)
    return path
