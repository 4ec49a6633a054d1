"""Fakes of the attribution Protocols, built from Kubernetes objects in their API shape,
and a model of what each node's datapath sees for a connection (docs/datapath.md).

Imported by the other tests/unit/attribution/test_join*.py; its own tests check the model.
"""

from __future__ import annotations

import copy
import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.records import FlowDelta, FlowKind, IPAddress, Peer, PeerKind, ProxyView, ServicePort

ZONE = "topology.kubernetes.io/zone"
REGION = "topology.kubernetes.io/region"
PROTO = {"TCP": 6, "UDP": 17, "SCTP": 132}
EPHEMERAL = range(32768, 61000)  # Linux default net.ipv4.ip_local_port_range
POD_CIDRS = [ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00:10::/32")]


def node(name: str, ip: str, zone: str | None, region: str | None = "eu-west-1") -> dict[str, Any]:
    labels = {"kubernetes.io/hostname": name}
    if zone:
        labels[ZONE] = zone
    if region:
        labels[REGION] = region
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels},
            "status": {"addresses": [{"type": "InternalIP", "address": ip},
                                     {"type": "Hostname", "address": name}]}}


def pod(ns: str, name: str, node_name: str, ips: list[str], owner: tuple[str, str] | None = None,
        host_network: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": ns, "name": name, "uid": f"uid-{name}"}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1],
                                    "controller": True}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"nodeName": node_name, "hostNetwork": host_network,
                     "containers": [{"name": "main"}]},
            "status": {"phase": "Running", "podIP": ips[0], "podIPs": [{"ip": i} for i in ips]}}


def service(ns: str, name: str, cluster_ips: list[str],
            ports: list[tuple[str, int, int, str]], node_ports: list[int] | None = None,
            external_local: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"type": "ClusterIP", "clusterIP": cluster_ips[0], "clusterIPs": cluster_ips,
                            "ports": [{"name": n, "port": p, "targetPort": t, "protocol": pr}
                                      for n, p, t, pr in ports]}
    if node_ports:
        spec["type"] = "LoadBalancer"
        spec["externalTrafficPolicy"] = "Local" if external_local else "Cluster"
        for sp, np_ in zip(spec["ports"], node_ports, strict=True):
            sp["nodePort"] = np_
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": ns, "name": name},
            "spec": spec}


def slice_(ns: str, svc: str, name: str, endpoints: list[dict[str, Any]],
           ports: list[tuple[str, int, str]], address_type: str = "IPv4") -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"namespace": ns, "name": name,
                         "labels": {"kubernetes.io/service-name": svc}},
            "addressType": address_type, "endpoints": endpoints,
            "ports": [{"name": n, "port": p, "protocol": pr} for n, p, pr in ports]}


def endpoint(ip: str, node_name: str, zone: str | None, for_zones: list[str] | None = None,
             ready: bool = True) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": [ip], "nodeName": node_name,
                          "conditions": {"ready": ready, "serving": ready, "terminating": False}}
    if zone:
        ep["zone"] = zone
    if for_zones is not None:
        ep["hints"] = {"forZones": [{"name": z} for z in for_zones]}
    return ep


class FakeMetadata:
    """MetadataView over API-shaped objects, indexed like agent/k8s would (dict lookups)."""

    def __init__(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]],
                 services: list[dict[str, Any]], slices: list[dict[str, Any]],
                 cidrs: list[tuple[str, ...]] = (),  # type: ignore[assignment]
                 replicasets: Mapping[str, str] | None = None) -> None:
        self.nodes: dict[str, Peer] = {}
        self.by_ip: dict[IPAddress, Peer] = {}
        for n in nodes:
            labels = n["metadata"]["labels"]
            name = n["metadata"]["name"]
            peer = Peer(PeerKind.NODE, zone=labels.get(ZONE), region=labels.get(REGION), node=name,
                        reason=None if labels.get(ZONE) else "node_without_zone")
            self.nodes[name] = peer
            for a in n["status"]["addresses"]:
                if a["type"] in ("InternalIP", "ExternalIP"):
                    self.by_ip[ipaddress.ip_address(a["address"])] = peer
        rs = dict(replicasets or {})
        for p in pods:
            m, spec = p["metadata"], p["spec"]
            if spec.get("hostNetwork"):
                continue  # resolves to the node address
            owner = (m.get("ownerReferences") or [None])[0]
            if owner is None:
                wl, wk = m["name"], "Pod"
            elif owner["kind"] == "ReplicaSet" and owner["name"] in rs:
                wl, wk = rs[owner["name"]], "Deployment"
            else:
                wl, wk = owner["name"], owner["kind"]
            host = self.nodes.get(spec["nodeName"])
            peer = Peer(PeerKind.POD, zone=host.zone if host else None,
                        region=host.region if host else None,
                        node=spec["nodeName"], namespace=m["namespace"], name=m["name"],
                        workload=wl, workload_kind=wk,
                        reason=None if host and host.zone else "node_without_zone")
            for i in p["status"]["podIPs"]:
                self.by_ip[ipaddress.ip_address(i["ip"])] = peer
        # (cidr, zone, region[, load balancer type]): as --zone-cidrs ranges
        self.cidrs = [(ipaddress.ip_network(c[0]), c[1], c[2], c[3] if len(c) > 3 else None)
                      for c in cidrs]
        self.service_addrs: dict[tuple[IPAddress, int, int], ServicePort] = {}
        #: (nodePort, protocol) -> (its Service port, externalTrafficPolicy Local)
        self.node_ports: dict[tuple[int, int], tuple[ServicePort, bool]] = {}
        svc_ports: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for s in services:
            m, spec = s["metadata"], s["spec"]
            svc_ports[(m["namespace"], m["name"])] = spec["ports"]
            for sp in spec["ports"]:
                proto = PROTO[sp.get("protocol", "TCP")]
                rec = ServicePort(m["namespace"], m["name"], sp["port"], sp.get("name", ""),
                                  sp["targetPort"], proto)
                for cip in spec["clusterIPs"]:
                    self.service_addrs[(ipaddress.ip_address(cip), sp["port"], proto)] = rec
                if sp.get("nodePort"):
                    self.node_ports[(sp["nodePort"], proto)] = (
                        rec, spec.get("externalTrafficPolicy") == "Local")
        self.endpoints: dict[tuple[IPAddress, int, int], list[ServicePort]] = {}
        for sl in slices:
            ns = sl["metadata"]["namespace"]
            svc = sl["metadata"]["labels"]["kubernetes.io/service-name"]
            for slp in sl["ports"]:
                proto = PROTO[slp.get("protocol", "TCP")]
                for sp in svc_ports.get((ns, svc), []):
                    if sp.get("name", "") != slp.get("name", ""):
                        continue
                    record = ServicePort(ns, svc, sp["port"], sp.get("name", ""), slp["port"], proto)
                    for ep in sl["endpoints"]:
                        for a in ep["addresses"]:
                            k = (ipaddress.ip_address(a), slp["port"], proto)
                            lst = self.endpoints.setdefault(k, [])
                            if record not in lst:
                                lst.append(record)

    def resolve(self, ip: IPAddress, at: float) -> Peer:
        p = self.by_ip.get(ip)
        if p is not None:
            return p
        for net, zone, region, lb in self.cidrs:
            if ip in net:
                return Peer(PeerKind.LOAD_BALANCER if lb else PeerKind.CIDR, zone=zone,
                            region=region, reason=None if zone else "cidr_without_zone", lb_type=lb)
        if any(ip in net for net in POD_CIDRS if net.version == ip.version):
            return Peer(PeerKind.UNKNOWN, reason="no_pod_for_ip")
        return Peer(PeerKind.EXTERNAL)

    def endpoint_services(self, ip: IPAddress, port: int, protocol: int) -> tuple[ServicePort, ...]:
        return tuple(self.endpoints.get((ip, port, protocol), ()))

    def service_address(self, ip: IPAddress, port: int, protocol: int) -> ServicePort | None:
        sp = self.service_addrs.get((ip, port, protocol))
        if sp is None and (port, protocol) in self.node_ports:
            p = self.by_ip.get(ip)  # a node port answers on every node address
            if p is not None and p.kind is PeerKind.NODE:
                return self.node_ports[(port, protocol)][0]
        return sp

    def is_entry_point(self, ip: IPAddress, port: int, protocol: int) -> bool:
        """As ``MetadataAdapter.is_entry_point``: a node's address with the node port of a
        Service with externalTrafficPolicy Cluster."""
        p = self.by_ip.get(ip)
        return (p is not None and p.kind is PeerKind.NODE and p.node is not None
                and (ip, port, protocol) in self.entry_points(p.node))

    def entry_points(self, node_name: str) -> set[tuple[IPAddress, int, int]]:
        """As ``ClusterMetadata.entry_points``: the node's addresses with the node ports of
        Services with externalTrafficPolicy Cluster."""
        addrs = [a for a, p in self.by_ip.items() if p.kind is PeerKind.NODE and p.node == node_name]
        return {(a, port, proto) for (port, proto), (_, local) in self.node_ports.items()
                if not local for a in addrs}

    def node(self, name: str) -> Peer | None:
        return self.nodes.get(name)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    mode: str
    reason: str
    in_effect: Mapping[str, bool]


class FakeHints:
    """HintView: kube-proxy zone filtering from the slices' forZones hints (1.33+ rule,
    ``topologyModeFromHints``: every ready endpoint hinted and one hinted for my zone)."""

    def __init__(self, meta: FakeMetadata, slices: list[dict[str, Any]],
                 modes: Mapping[tuple[str, str], str] | None = None) -> None:
        self.meta = meta
        self.eps: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for sl in slices:
            k = (sl["metadata"]["namespace"], sl["metadata"]["labels"]["kubernetes.io/service-name"])
            self.eps.setdefault(k, []).extend(sl["endpoints"])
        self.modes = dict(modes or {})
        self.overrides: dict[tuple[str, str], Diagnosis] = {}

    def proxy_view(self, namespace: str, service: str, node: str) -> ProxyView | None:
        eps = self.eps.get((namespace, service))
        n = self.meta.node(node)
        if eps is None or n is None:
            return None
        ready = [e for e in eps if e.get("conditions", {}).get("ready", True) is not False]
        zone = n.zone or ""
        hinted = [e for e in ready if zone in {z["name"] for z in e.get("hints", {}).get("forZones", [])}]
        all_hinted = all(e.get("hints", {}).get("forZones") for e in ready)
        if ready and all_hinted and hinted:
            return ProxyView("PreferSameZone", frozenset(a for e in hinted for a in e["addresses"]),
                             "cluster")
        return ProxyView("", frozenset(a for e in ready for a in e["addresses"]), "cluster")

    def services(self) -> Iterable[tuple[str, str]]:
        return sorted(self.eps)

    def locality(self, namespace: str, service: str) -> Diagnosis | None:
        k = (namespace, service)
        if k in self.overrides:
            return self.overrides[k]
        if k not in self.eps:
            return None
        zones = sorted({n.zone for n in self.meta.nodes.values() if n.zone})
        in_effect = {}
        for z in zones:
            any_node = next(nm for nm, p in self.meta.nodes.items() if p.zone == z)
            pv = self.proxy_view(namespace, service, any_node)
            in_effect[z] = bool(pv and pv.topology_mode)
        on = any(in_effect.values())
        return Diagnosis(self.modes.get(k, "none"), "none" if on else "no_hints", in_effect)


# --------------------------------------------------------------------------- the cluster


def objects() -> dict[str, Any]:
    """A 5-node, 3-zone, 2-region cluster (API-shaped objects)."""
    nodes = [
        node("n1", "192.168.0.1", "eu-west-1a"),
        node("n2", "192.168.0.2", "eu-west-1a"),
        node("n3", "192.168.0.3", "eu-west-1b"),
        node("n4", "192.168.0.4", "us-east-1a", region="us-east-1"),
        node("n5", "192.168.0.5", None, region=None),  # no zone label
    ]
    pods = [
        pod("shop", "web-7c9f-abcde", "n1", ["10.1.1.10", "fd00:10:1:1::10"], ("ReplicaSet", "web-7c9f")),
        pod("shop", "web-7c9f-fghij", "n3", ["10.1.3.11"], ("ReplicaSet", "web-7c9f")),
        pod("shop", "api-5d8b-aaaaa", "n1", ["10.1.1.20"], ("ReplicaSet", "api-5d8b")),
        pod("shop", "api-5d8b-bbbbb", "n2", ["10.1.2.20", "fd00:10:1:2::20"], ("ReplicaSet", "api-5d8b")),
        pod("shop", "api-5d8b-ccccc", "n3", ["10.1.3.20"], ("ReplicaSet", "api-5d8b")),
        pod("shop", "db-0", "n3", ["10.1.3.30"], ("StatefulSet", "db")),
        pod("shop", "worker-x", "n4", ["10.1.4.40"], ("Job", "worker")),
        pod("shop", "batch-y", "n5", ["10.1.5.50"]),
        pod("monitoring", "node-exporter-n2", "n2", ["192.168.0.2"], ("DaemonSet", "node-exporter"),
            host_network=True),
        pod("monitoring", "node-exporter-n3", "n3", ["192.168.0.3"], ("DaemonSet", "node-exporter"),
            host_network=True),
        pod("shop", "cache-1", "n2", ["10.1.2.60"], ("StatefulSet", "cache")),
    ]
    services = [
        service("shop", "api", ["10.96.0.10", "fd00:96::10"], [("http", 80, 8080, "TCP")]),
        service("shop", "api-canary", ["10.96.0.11"], [("http", 80, 8080, "TCP")]),  # same pods
        service("monitoring", "node-exporter", ["10.96.0.20"], [("metrics", 9100, 9100, "TCP")]),
        service("monitoring", "exporter-n2", ["10.96.0.21"], [("metrics", 9100, 9100, "TCP")]),
        service("shop", "mixed", ["10.96.0.30"], [("m", 9100, 9100, "TCP")]),
        service("shop", "dns", ["10.96.0.53"], [("dns", 53, 5353, "UDP")]),
        # selector-less Services with hand-written slices: a managed database, an outside API
        service("shop", "rds", ["10.96.0.40"], [("pg", 5432, 5432, "TCP")]),
        service("shop", "partner", ["10.96.0.41"], [("https", 443, 443, "TCP")]),
        # web's pods behind load balancers on node ports (docs/attribution.md, "Two hops of
        # NodePort and LoadBalancer traffic"): externalTrafficPolicy Cluster and Local
        service("shop", "web-lb", ["10.96.0.50"], [("http", 80, 8080, "TCP")], node_ports=[30080]),
        service("shop", "web-local", ["10.96.0.51"], [("https", 443, 8443, "TCP")], node_ports=[30443],
                external_local=True),
        # host-network endpoints (the node exporters) behind a node port, Cluster
        service("monitoring", "node-exporter-lb", ["10.96.0.52"], [("metrics", 9100, 9100, "TCP")],
                node_ports=[30090]),
    ]
    api_eps = [endpoint("10.1.1.20", "n1", "eu-west-1a", ["eu-west-1a"]),
               endpoint("10.1.2.20", "n2", "eu-west-1a", ["eu-west-1a"]),
               endpoint("10.1.3.20", "n3", "eu-west-1b", ["eu-west-1b"])]
    slices = [
        slice_("shop", "api", "api-x1", api_eps, [("http", 8080, "TCP")]),
        slice_("shop", "api", "api-x6", [endpoint("fd00:10:1:2::20", "n2", "eu-west-1a", ["eu-west-1a"])],
               [("http", 8080, "TCP")], "IPv6"),
        slice_("shop", "api-canary", "api-canary-x1", copy.deepcopy(api_eps[:2]), [("http", 8080, "TCP")]),
        slice_("monitoring", "node-exporter", "ne-x1",
               [endpoint("192.168.0.2", "n2", "eu-west-1a"), endpoint("192.168.0.3", "n3", "eu-west-1b")],
               [("metrics", 9100, "TCP")]),
        slice_("monitoring", "exporter-n2", "ne2-x1", [endpoint("192.168.0.2", "n2", "eu-west-1a")],
               [("metrics", 9100, "TCP")]),
        slice_("shop", "mixed", "mixed-x1",
               [endpoint("192.168.0.3", "n3", "eu-west-1b"), endpoint("10.1.2.60", "n2", "eu-west-1a")],
               [("m", 9100, "TCP")]),
        slice_("shop", "dns", "dns-x1", [endpoint("10.1.3.30", "n3", "eu-west-1b")],
               [("dns", 5353, "UDP")]),
        slice_("shop", "rds", "rds-1", [{"addresses": ["172.31.1.6"]}], [("pg", 5432, "TCP")]),
        slice_("shop", "web-lb", "web-lb-1", [endpoint("10.1.1.10", "n1", "eu-west-1a"),
                                              endpoint("10.1.3.11", "n3", "eu-west-1b")],
               [("http", 8080, "TCP")]),
        slice_("shop", "web-local", "web-local-1", [endpoint("10.1.1.10", "n1", "eu-west-1a"),
                                                    endpoint("10.1.3.11", "n3", "eu-west-1b")],
               [("https", 8443, "TCP")]),
        slice_("monitoring", "node-exporter-lb", "node-exporter-lb-1",
               [endpoint("192.168.0.2", "n2", "eu-west-1a"), endpoint("192.168.0.3", "n3", "eu-west-1b")],
               [("metrics", 9100, "TCP")]),
        slice_("shop", "partner", "partner-1",
               [{"addresses": ["203.0.113.50"]}, {"addresses": ["203.0.113.51"]}],
               [("https", 443, "TCP")]),
    ]
    cidrs = [("172.31.0.0/20", "eu-west-1b", "eu-west-1"), ("172.31.64.0/20", None, None),
             # a load balancer's addresses per zone (an ALB in a, an NLB in b), a VM range
             ("172.31.128.0/24", "eu-west-1a", "eu-west-1", "aws-alb"),
             ("fd00:172:31::/64", "eu-west-1b", "eu-west-1", "aws-nlb"),
             ("fd00:172:32::/64", "eu-west-1a", "eu-west-1")]
    return {"nodes": nodes, "pods": pods, "services": services, "slices": slices, "cidrs": cidrs,
            "replicasets": {"web-7c9f": "web", "api-5d8b": "api"}}


def build(obj: dict[str, Any] | None = None) -> tuple[FakeMetadata, FakeHints]:
    o = obj or objects()
    meta = FakeMetadata(o["nodes"], o["pods"], o["services"], o["slices"], o["cidrs"], o["replicasets"])
    return meta, FakeHints(meta, o["slices"], {("shop", "api"): "topology-mode-annotation"})


def ip(text: str) -> IPAddress:
    return ipaddress.ip_address(text)


def service_ports(o: dict[str, Any]) -> frozenset[int]:
    """The ports the agent marks ``ZM_PORT_SERVICE`` (``ClusterMetadata.service_ports``):
    every Service port and numeric targetPort, every EndpointSlice port, any protocol."""
    out = {p["port"] for s in o["services"] for p in s["spec"].get("ports", [])}
    out |= {p["targetPort"] for s in o["services"] for p in s["spec"].get("ports", [])
            if isinstance(p.get("targetPort"), int)}
    out |= {p["port"] for sl in o["slices"] for p in sl.get("ports") or []}
    return frozenset(out)


# --------------------------------------------------------------------------- datapath model


@dataclass
class Conn:
    """One connection: who dials what, where kube-proxy sends it, bytes each way (L3)."""

    client: str            # pod name, or "node:NAME" for a node / host-network client, or an IP
    dst: str               # address the client dials (ClusterIP, pod IP, node IP, external)
    dport: int
    req: int
    resp: int
    backend: str | None = None   # DNAT target address (ClusterIP traffic), else dst itself
    bport: int | None = None     # DNAT target port
    proto: int = 6
    sport: int = 45000           # client source port (ephemeral)
    #: ``dst`` is a node address and ``dport`` a node port: kube-proxy on that node DNATs
    #: (to ``backend``), masquerading to its own address when ``masquerade`` (kube-proxy
    #: under externalTrafficPolicy Cluster); a data plane that does not masquerade to a
    #: local endpoint (Cilium's kube-proxy replacement) keeps the client's address there
    node_port: bool = False
    masquerade: bool = True


@dataclass
class Model:
    """What each node's veth hooks see (docs/datapath.md, verified on the kernel); with
    ``sockets`` what each node's cgroup hook sees instead (docs/datapath.md, "The
    cgroup_skb hook"): every side in the cluster, host-network ones too, keyed by the
    socket's own addresses (a host client's by the ClusterIP it dialled, or with
    ``egress_backend`` its egress by the backend its packets went to after the DNAT)."""

    meta: FakeMetadata
    objs: dict[str, Any]
    deltas: dict[str, list[FlowDelta]] = field(default_factory=dict)
    #: nodes whose kernel endpoint map is still empty (the agent has not written it yet)
    kernel_behind: frozenset[str] = frozenset()
    #: the cgroup hook on every node (socket view) instead of the veth hook
    sockets: bool = False
    #: nodes on the cgroup hook while the others are on the veth hook (a mixed cluster)
    socket_nodes: frozenset[str] = frozenset()
    #: socket view: host sockets' egress keyed by the post-DNAT backend (unconnected UDP)
    egress_backend: bool = False
    #: ports marked ZM_PORT_SERVICE on every node (None: :func:`service_ports` of ``objs``)
    svc_ports: frozenset[int] | None = None

    def _svc(self) -> frozenset[int]:
        if self.svc_ports is None:
            self.svc_ports = service_ports(self.objs)
        return self.svc_ports

    def _peer_port(self, port: int) -> int:
        """The key's remote port (bpf/classify.h zm_peer_port): 0 when ephemeral and no
        Service port."""
        return port if port not in EPHEMERAL or port in self._svc() else 0

    def _unmarked_to_fixed(self, a: int, b: int) -> bool:
        """bpf/classify.h zm_unmarked_to_fixed: one port an unmarked ephemeral-range one,
        the other outside the range and not below 1024 (UDP and SCTP keep both)."""
        svc = self._svc()

        def fixed(x: int) -> bool:
            return x >= 1024 and x not in EPHEMERAL
        return ((a in EPHEMERAL and a not in svc and fixed(b))
                or (b in EPHEMERAL and b not in svc and fixed(a)))

    def _pod(self, name_or_ip: str) -> tuple[str | None, IPAddress, bool]:
        """(node, address, has_veth) of a pod name, ``node:NAME`` or an address."""
        if name_or_ip.startswith("node:"):
            name = name_or_ip[5:]
            n = next(n for n in self.objs["nodes"] if n["metadata"]["name"] == name)
            return name, ip(n["status"]["addresses"][0]["address"]), False
        for p in self.objs["pods"]:
            if p["metadata"]["name"] == name_or_ip:
                return p["spec"]["nodeName"], ip(p["status"]["podIP"]), not p["spec"]["hostNetwork"]
        a = ip(name_or_ip)
        for p in self.objs["pods"]:
            if any(ip(i["ip"]) == a for i in p["status"]["podIPs"]):
                return p["spec"]["nodeName"], a, not p["spec"]["hostNetwork"]
        for n in self.objs["nodes"]:
            if any(ip(x["address"]) == a for x in n["status"]["addresses"] if x["type"] == "InternalIP"):
                return n["metadata"]["name"], a, False
        return None, a, False

    def _sockets(self, node_name: str | None) -> bool:
        """Whether node_name's datapath is the cgroup hook (sees its sockets)."""
        return self.sockets or node_name in self.socket_nodes

    def _local_endpoints(self, node_name: str) -> set[tuple[IPAddress, int, int]]:
        """The endpoint table the agent writes into the node's BPF map (veth endpoints only)."""
        out: set[tuple[IPAddress, int, int]] = set()
        if node_name in self.kernel_behind:
            return out
        for (a, port, proto) in self.meta.endpoints:
            n, _, veth = self._pod(str(a))
            if n == node_name and (veth or self._sockets(node_name)):
                out.add((a, port, proto))
        return out

    def _emit(self, node_name: str, d: FlowDelta) -> None:
        self.deltas.setdefault(node_name, []).append(d)

    def send(self, c: Conn) -> None:
        cnode, caddr, cveth = self._pod(c.client)
        backend = ip(c.backend) if c.backend else ip(c.dst)
        bport = c.bport if c.bport is not None else c.dport
        dst = ip(c.dst)
        rport = self._peer_port(c.dport)
        svc = self._svc()
        # the endpoint's view of the client: the receiving node's address when it
        # masqueraded a node-port call
        seen = caddr
        if c.node_port:
            entry_node, entry_addr, _ = self._pod(c.dst)
            assert entry_node is not None
            if c.masquerade:
                seen = entry_addr
            # the receiving node's uplink (bpf/uplink.h): the first hop, when it came from
            # off the node to an entry of that node
            if cnode != entry_node and (dst, c.dport, c.proto) in self.meta.entry_points(entry_node):
                for kind, n in ((FlowKind.REQUEST, c.req), (FlowKind.RESPONSE, c.resp)):
                    self._emit(entry_node, FlowDelta(kind, dst, caddr, c.dport, c.proto, n, 1,
                                                     local_port=c.dport, ifindex=2))
        if (cveth or self._sockets(cnode)) and cnode:
            local_eps = self._local_endpoints(cnode)
            # the client's own (addr, sport) is never an endpoint: sport is ephemeral
            assert (caddr, c.sport, c.proto) not in local_eps
            # the kernel keeps the local port when it is a Service port, or the remote one is
            # ephemeral and it is not (a client's ephemeral port is no server port of this
            # node: never learned); UDP and SCTP keep the remote port, which the client's
            # first packet went to, even inside the ephemeral range (zm_origin)
            first = c.proto != 6
            # TCP to a port inside the range: kept, the pod's SYN left for it
            # (zm_tcp_dialled), whatever the pod's own port
            if first or rport == 0:
                rport = c.dport
            lport = c.sport if c.sport in svc else 0
            if first and (c.sport == c.dport or c.sport not in EPHEMERAL or (
                    not self._peer_port(c.dport) and c.dport) or
                    self._unmarked_to_fixed(c.sport, c.dport)):
                # UDP and SCTP, the client spoke first: its own port is kept when it lies
                # outside the range (a server may speak first), when it is the remote one
                # (a peer's port to the same port), when both ports are unmarked
                # ephemeral ones (zm_unmarked_ephemeral), and when it is an unmarked
                # ephemeral one and the remote port a fixed one (zm_unmarked_to_fixed)
                lport = c.sport
            # the socket view keys a host socket by its own addresses (what connect() gave
            # it: the ClusterIP), although its egress packets passed the node's DNAT; an
            # unconnected host socket's egress shows the backend (``egress_backend``), so
            # its replies, from the ClusterIP, are a 5-tuple whose first packet entered:
            # their key keeps the socket's own port (zm_origin)
            split = self.egress_backend and not cveth and (backend, bport) != (dst, c.dport)
            eport_backend = self._peer_port(bport)
            if first or (c.proto == 6 and not eport_backend and bport):
                eport_backend = bport
            edst, eport = ((backend, eport_backend)
                           if self.egress_backend and not cveth else (dst, rport))
            if split and first:  # its own 5-tuple, judged as the kernel judges it
                eport = bport
                lport = c.sport if c.sport in svc or c.sport == bport or (
                    c.sport not in EPHEMERAL) or (not self._peer_port(bport) and bport) or (
                    self._unmarked_to_fixed(c.sport, bport)) else 0
            iport, ilport = rport, lport
            if split:  # the reply's 5-tuple is not the one the socket sent on
                iport = self._peer_port(c.dport)
                if first:
                    ilport = c.sport
                    if not iport and c.dport and (c.sport in EPHEMERAL and c.sport not in svc
                                                  or self._unmarked_to_fixed(c.sport, c.dport)):
                        # two unmarked ephemeral ports, or one and a fixed one: both kept
                        iport = c.dport
            for kind, n, r, rp, lp in ((FlowKind.EGRESS, c.req, edst, eport, lport),
                                       (FlowKind.INGRESS, c.resp, dst, iport, ilport)):
                self._emit(cnode, FlowDelta(kind, caddr, r, rp, c.proto, n, max(1, n // 1400),
                                            local_port=lp))
        snode, saddr, sveth = self._pod(str(backend))
        if (sveth or self._sockets(snode)) and snode:
            if (saddr, bport, c.proto) in self._local_endpoints(snode):
                for kind, n in ((FlowKind.REQUEST, c.req), (FlowKind.RESPONSE, c.resp)):
                    self._emit(snode, FlowDelta(kind, saddr, seen, bport, c.proto, n, 1))
            else:
                cport = self._peer_port(c.sport)
                # the kernel keeps the server's port of a TCP connection (its SYN entered
                # on it, its SYN-ACK left from it: bpf/classify.h zm_local_port) and of
                # UDP and SCTP (the client's packet was the first it saw: zm_origin)
                lport = bport
                if c.proto != 6 and (c.sport == bport or (
                        not cport and c.sport and bport in EPHEMERAL and bport not in self._svc())
                        or self._unmarked_to_fixed(c.sport, bport)):
                    # a peer's port to the same port, two unmarked ephemeral ports
                    # (zm_unmarked_ephemeral), or one and a fixed one (zm_unmarked_to_fixed):
                    # both kept
                    cport = c.sport
                for kind, n in ((FlowKind.INGRESS, c.req), (FlowKind.EGRESS, c.resp)):
                    self._emit(snode, FlowDelta(kind, saddr, seen, cport, c.proto, n, 1,
                                                local_port=lport))


# --------------------------------------------------------------------------- the model's own checks


def test_model_client_veth_sees_clusterip_and_server_veth_sees_client() -> None:
    o = objects()
    meta, _ = build(o)
    m = Model(meta, o)
    m.send(Conn("web-7c9f-abcde", "10.96.0.10", 80, 1000, 5000, backend="10.1.3.20", bport=8080))
    assert m.deltas["n1"] == [
        FlowDelta(FlowKind.EGRESS, ip("10.1.1.10"), ip("10.96.0.10"), 80, 6, 1000, 1),
        FlowDelta(FlowKind.INGRESS, ip("10.1.1.10"), ip("10.96.0.10"), 80, 6, 5000, 3),
    ]
    assert m.deltas["n3"] == [
        FlowDelta(FlowKind.REQUEST, ip("10.1.3.20"), ip("10.1.1.10"), 8080, 6, 1000, 1),
        FlowDelta(FlowKind.RESPONSE, ip("10.1.3.20"), ip("10.1.1.10"), 8080, 6, 5000, 1),
    ]


def test_model_endpoint_table_excludes_host_network_endpoints() -> None:
    o = objects()
    meta, _ = build(o)
    table = Model(meta, o)._local_endpoints("n2")
    assert (ip("10.1.2.20"), 8080, 6) in table
    assert (ip("10.1.2.60"), 9100, 6) in table
    assert all(a != ip("192.168.0.2") for a, _, _ in table)


def test_fake_hints_follow_zone_hints() -> None:
    meta, hints = build()
    pv = hints.proxy_view("shop", "api", "n1")
    assert pv is not None and pv.topology_mode == "PreferSameZone"
    assert pv.selected == frozenset({"10.1.1.20", "10.1.2.20", "fd00:10:1:2::20"})
    dns = hints.proxy_view("shop", "dns", "n1")
    assert dns is not None and dns.topology_mode == ""
