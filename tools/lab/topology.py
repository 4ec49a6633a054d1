"""Declarative lab topology: zones, nodes, pods, Services, options.

A topology is plain data (YAML or a dict)::

    options: {mode: flat, ipv6: false}          # mode: flat | vxlan
    zones:
      - {name: zone-a, region: region-1}
    nodes:
      - {name: a1, zone: zone-a, cpu: 4}
      - {name: c2, zone: zone-c, ignoreHints: true}   # its data plane ignores hints
    pods:
      - name: web-a1
        node: a1
        namespace: shop                          # default "default"
        ip: auto                                 # or an address inside the node's pod CIDR
        ports: [{port: 8080, protocol: TCP, name: http, hostPort: 8443}]  # hostPort optional
        labels: {app: web}                       # or app: web
        hostNetwork: false
    services:
      - name: web
        namespace: shop
        clusterIP: auto                          # or an address inside options.service_cidr
        ports: [{port: 80, targetPort: 8080, protocol: TCP, name: http}]
        selector: {app: web}                     # or endpoints: [pod names]
        annotations: {service.kubernetes.io/topology-mode: Auto}
        trafficDistribution: PreferSameZone
        internalTrafficPolicy: Cluster           # or Local
        type: ClusterIP                          # NodePort or LoadBalancer (ports may give
                                                 # nodePort: 30000-32767)
        externalTrafficPolicy: Cluster           # or Local (NodePort and LoadBalancer only)
      - {name: peers, clusterIP: None, ...}      # headless: no ClusterIP, no kube-proxy rules
    outside:                                     # machines outside the cluster, on the fabric
      - {name: lb-a, kind: load-balancer, zone: zone-a, type: aws-alb}
      - {name: orders-db, kind: database, zone: zone-b, ports: [{port: 5432}]}
      - {name: partner, kind: external}         # no zone: no zone-CIDR entry

:meth:`Topology.from_dict` validates everything and resolves ``auto`` addresses, so a
:class:`Topology` is always complete: every pod has its IPv4 (and IPv6 when enabled)
address, every Service its ClusterIP(s) and endpoint pods. Bad input raises
:class:`agent.errors.InputError` naming the object and field.

Address plan (defaults, all only ever configured inside the lab's namespaces): node ``i``
(0-based, file order) gets ``node_cidr`` host ``i+1`` on the fabric, pod CIDR number
``i+1`` of size /24 inside ``pod_cidr`` (IPv6: /64 number ``i+1`` inside ``pod_cidr_v6``)
and, in vxlan mode, ``overlay_cidr`` host ``i+1`` on its VXLAN device. Pods get hosts
``.2`` upwards of their node's pod CIDR in file order. Outside peer ``i`` gets the address
``i+3`` below the top of ``node_cidr`` (and ``node_cidr_v6``): the last is the control
plane's (tools/lab/kube.py), the second-last the anonymous outside peer's
(``Lab.build_outside``).
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from agent.errors import InputError

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
#: accepted spec.trafficDistribution values (KEP-4444, KEP-3015)
TRAFFIC_DISTRIBUTIONS = ("PreferClose", "PreferSameZone", "PreferSameNode")
MODES = ("flat", "vxlan")
PROTOCOLS = ("TCP", "UDP")
#: accepted Service ``type`` values: the lab's data paths serve ClusterIP and NodePort; a
#: LoadBalancer is a NodePort Service whose load balancers are outside peers (no cloud
#: controller writes ``status.loadBalancer``)
SERVICE_TYPES = ("ClusterIP", "NodePort", "LoadBalancer")
#: ``spec.externalTrafficPolicy`` values (NodePort and LoadBalancer Services)
EXTERNAL_TRAFFIC_POLICIES = ("Cluster", "Local")
#: kinds of outside peers, and the client class (``client_kind``) each stands for:
#: ``load-balancer`` (a zone-CIDR range marked as a load balancer), ``database`` and ``vm``
#: (a plain zone-CIDR range: ``cidr``), ``external`` (no zone-CIDR entry)
OUTSIDE_KINDS = {"load-balancer": "load-balancer", "database": "cidr", "vm": "cidr",
                 "external": "external"}
_TOKEN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
#: kube-apiserver's default ``--service-node-port-range``
NODE_PORTS = (30000, 32767)
#: clients' ephemeral source ports (the kernel's default net.ipv4.ip_local_port_range)
EPHEMERAL_PORTS = (32768, 60999)


@dataclass(frozen=True, slots=True)
class Options:
    """Lab-wide settings.

    Attributes:
        mode: ``flat`` (node netns route each other's pod CIDRs via the fabric) or
            ``vxlan`` (an overlay device per node, VNI ``vni``, UDP port 4789).
        ipv6: give every pod, node and ClusterIP an IPv6 address as well (dual stack).
        node_cidr, node_cidr_v6: fabric (underlay) subnets of the node addresses.
        pod_cidr, pod_cidr_v6: cluster pod ranges, cut into one /24 (/64) per node.
        service_cidr, service_cidr_v6: ClusterIP ranges.
        overlay_cidr, overlay_cidr_v6: addresses of the VXLAN devices (vxlan mode).
        mtu: MTU of the fabric links (bytes); VXLAN devices and, in vxlan mode, pod veths
            use ``mtu - 50``.
        vni: VXLAN network identifier.
        offloads: leave TSO/GSO/GRO on and ``gso_max_segs`` at the kernel's default, so
            TCP sends GSO packets (one skb, several wire packets); the ground truth then
            counts skbs, not wire packets. Off by default (docs/lab.md).
    """

    mode: str = "flat"
    ipv6: bool = False
    node_cidr: ipaddress.IPv4Network = ipaddress.IPv4Network("192.168.100.0/24")
    node_cidr_v6: ipaddress.IPv6Network = ipaddress.IPv6Network("fd00:100::/64")
    pod_cidr: ipaddress.IPv4Network = ipaddress.IPv4Network("10.244.0.0/16")
    pod_cidr_v6: ipaddress.IPv6Network = ipaddress.IPv6Network("fd00:244::/48")
    service_cidr: ipaddress.IPv4Network = ipaddress.IPv4Network("10.96.0.0/16")
    service_cidr_v6: ipaddress.IPv6Network = ipaddress.IPv6Network("fd00:96::/108")
    overlay_cidr: ipaddress.IPv4Network = ipaddress.IPv4Network("192.168.101.0/24")
    overlay_cidr_v6: ipaddress.IPv6Network = ipaddress.IPv6Network("fd00:101::/64")
    mtu: int = 1500
    vni: int = 42
    offloads: bool = False

    @property
    def pod_mtu(self) -> int:
        """MTU of pod veths (bytes): the fabric MTU, minus VXLAN overhead in vxlan mode."""
        return self.mtu - 50 if self.mode == "vxlan" else self.mtu


@dataclass(frozen=True, slots=True)
class Zone:
    """A zone (``topology.kubernetes.io/zone``), optionally in a region."""

    name: str
    region: str | None = None


@dataclass(frozen=True, slots=True)
class Node:
    """A lab node: one network namespace.

    Attributes:
        name: Node name.
        zone: zone name (label ``topology.kubernetes.io/zone``).
        cpu: allocatable CPUs (the EndpointSlice controller weighs zones by it).
        index: position in the topology (0-based), fixes the node's address block.
        ip, ip6: fabric address(es); ``ip6`` is ``None`` without IPv6.
        overlay_ip, overlay_ip6: VXLAN device addresses (vxlan mode), else ``None``.
        pod_cidr, pod_cidr_v6: this node's pod ranges.
        ignore_hints: this node's kube-proxy emulation ignores hints (a data plane that
            does not honour them); recorded for the caller that programs endpoints.
        data_plane: ``"kube-proxy"`` (default: host veths, host routing, the iptables
            emulation) or ``"bypass"`` (YAML ``dataPlane: bypass``, flat mode only): the
            node's pod packets are moved by ``bpf_redirect_peer``/``bpf_redirect_neigh`` and
            its sockets' ClusterIPs resolved by a socket-LB, as Cilium's BPF host routing
            does (:mod:`tools.lab.bypass`; the lab installs it while its process runs).
    """

    name: str
    zone: str
    cpu: float
    index: int
    ip: ipaddress.IPv4Address
    ip6: ipaddress.IPv6Address | None
    overlay_ip: ipaddress.IPv4Address | None
    overlay_ip6: ipaddress.IPv6Address | None
    pod_cidr: ipaddress.IPv4Network
    pod_cidr_v6: ipaddress.IPv6Network | None
    ignore_hints: bool = False
    data_plane: str = "kube-proxy"


#: values of a node's ``dataPlane``
DATA_PLANES = ("kube-proxy", "bypass")


@dataclass(frozen=True, slots=True)
class PodPort:
    """A container port: ``port`` (host byte order), ``protocol`` TCP|UDP, optional name,
    and ``host_port``: the node port the CNI's portmap plugin DNATs to it (``hostPort``;
    a host-network pod's equals ``port``), or None."""

    port: int
    protocol: str = "TCP"
    name: str | None = None
    host_port: int | None = None


@dataclass(frozen=True, slots=True)
class Pod:
    """A lab pod: its own network namespace (or its node's when ``host_network``).

    Attributes:
        name: Pod name, unique in the lab (the lab keys everything by it).
        namespace: Kubernetes namespace.
        node: node name.
        index: names its host-side veth and ground-truth table: the position in the
            topology (0-based), unless given as ``labIndex`` (the lab writes it in
            :meth:`Topology.to_dict` so indexes stay put when pods come and go).
        ip, ip6: pod address(es); the node's fabric address(es) when ``host_network``.
        ports: listening ports; the lab starts a server for each.
        labels: pod labels (``app`` given alone becomes ``{"app": value}``).
        host_network: runs in the node's namespace, no veth.
    """

    name: str
    namespace: str
    node: str
    index: int
    ip: ipaddress.IPv4Address
    ip6: ipaddress.IPv6Address | None
    ports: tuple[PodPort, ...]
    labels: Mapping[str, str]
    host_network: bool = False

    def address(self, family: int = 4) -> IPAddress:
        """Return the pod's IPv4 (``family=4``) or IPv6 (``6``) address.

        Raises:
            InputError: IPv6 requested in a lab without IPv6.
        """
        if family == 6:
            if self.ip6 is None:
                raise InputError("the lab has no IPv6 (options.ipv6 is false)",
                                 obj=f"Pod {self.name}", field="ip6")
            return self.ip6
        return self.ip


@dataclass(frozen=True, slots=True)
class ServicePort:
    """A Service port: ``port`` on the ClusterIP, ``target_port`` (number or a pod port
    name), ``protocol`` TCP|UDP, optional ``name``, and for a ``NodePort`` Service its
    ``node_port`` on every node address (``None``: the apiserver allocates one from
    :data:`NODE_PORTS`; always ``None`` for a ClusterIP Service)."""

    port: int
    target_port: int | str
    protocol: str = "TCP"
    name: str | None = None
    node_port: int | None = None


@dataclass(frozen=True, slots=True)
class Service:
    """A Service (``ClusterIP`` or ``NodePort``) with its locality settings.

    Attributes:
        name, namespace: identity; :attr:`key` is ``namespace/name``.
        cluster_ip, cluster_ip6: ClusterIP(s) (``cluster_ip6`` only with IPv6).
        ports: Service ports.
        selector: pod label selector, or ``None`` when ``endpoints`` were listed.
        endpoints: endpoint pod names (from the selector, or listed), in topology order.
        annotations: ``metadata.annotations`` (e.g. ``service.kubernetes.io/topology-mode``).
        traffic_distribution: ``spec.trafficDistribution`` or ``None``.
        internal_traffic_policy: ``Cluster`` or ``Local``.
        type: ``ClusterIP``, ``NodePort`` or ``LoadBalancer`` (``spec.type``; a LoadBalancer is
            served on its node ports, its load balancers being outside peers).
        external_traffic_policy: ``Cluster`` (the receiving node masquerades a node-port call
            to its own address and forwards it to the endpoints it selects for ClusterIP
            traffic) or ``Local`` (its own endpoints only, the client's address kept); always
            ``Cluster`` for a ClusterIP Service.

    A headless Service (``clusterIP: None``) has ``cluster_ip`` None: kube-proxy has no rule
    for it, clients dial its endpoints (:attr:`headless`).
    """

    name: str
    namespace: str
    cluster_ip: ipaddress.IPv4Address | None
    cluster_ip6: ipaddress.IPv6Address | None
    ports: tuple[ServicePort, ...]
    selector: Mapping[str, str] | None
    endpoints: tuple[str, ...]
    annotations: Mapping[str, str] = field(default_factory=dict)
    traffic_distribution: str | None = None
    internal_traffic_policy: str = "Cluster"
    type: str = "ClusterIP"
    external_traffic_policy: str = "Cluster"

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"

    @property
    def headless(self) -> bool:
        """``clusterIP: None``: no ClusterIP, no kube-proxy rule."""
        return self.cluster_ip is None

    @property
    def node_ports(self) -> bool:
        """Whether the Service is served on node ports (``NodePort``, ``LoadBalancer``)."""
        return self.type in ("NodePort", "LoadBalancer")


@dataclass(frozen=True, slots=True)
class OutsidePeer:
    """A machine outside the cluster on the lab's fabric (its own network namespace): a load
    balancer, a managed database, a VM, or an external host.

    Attributes:
        name: unique among peers and pods (flows name it).
        kind: one of :data:`OUTSIDE_KINDS`.
        zone: the zone its zone-CIDR entry maps it to; None for ``external``.
        lb_type: a load balancer's type (``aws-alb``, ``aws-nlb``...; the zone-CIDR entry's
            price class), else None.
        index: position in the topology's ``outside`` list (0-based): names its veth.
        ip, ip6: fabric address(es) (``ip6`` only with IPv6): :data:`OUTSIDE_OFFSET` + index
            below the top of ``options.node_cidr`` (``node_cidr_v6``).
        ports: ports it serves (a database), with a server and ground-truth counters.
    """

    name: str
    kind: str
    zone: str | None
    lb_type: str | None
    index: int
    ip: ipaddress.IPv4Address
    ip6: ipaddress.IPv6Address | None
    ports: tuple[PodPort, ...] = ()

    @property
    def client_kind(self) -> str:
        """The client class its bytes carry (``load-balancer``, ``cidr``, ``external``)."""
        return OUTSIDE_KINDS[self.kind]

    @property
    def key(self) -> str:
        """``outside/<name>``: how ground truth and flows name it."""
        return f"outside/{self.name}"

    def address(self, family: int = 4) -> IPAddress:
        """Return the IPv4 (``family=4``) or IPv6 (``6``) address.

        Raises:
            InputError: IPv6 requested in a lab without IPv6.
        """
        if family == 6:
            if self.ip6 is None:
                raise InputError("the lab has no IPv6 (options.ipv6 is false)",
                                 obj=f"outside peer {self.name}", field="ip6")
            return self.ip6
        return self.ip


#: outside peer ``i`` sits ``OUTSIDE_OFFSET + i`` addresses below the top of node_cidr
OUTSIDE_OFFSET = 3


@dataclass(frozen=True, slots=True)
class Topology:
    """A validated, fully resolved lab topology (see the module docstring for the format)."""

    zones: tuple[Zone, ...]
    nodes: tuple[Node, ...]
    pods: tuple[Pod, ...]
    services: tuple[Service, ...]
    options: Options
    source: str = "<memory>"
    outside: tuple[OutsidePeer, ...] = ()

    # ------------------------------------------------------------ constructors

    @classmethod
    def from_yaml(cls, path_or_text: str | Path) -> Topology:
        """Parse a topology from a YAML file path or YAML text.

        A ``Path``, or a ``str`` without a newline that names an existing file, is read
        as a file; any other string is YAML text.

        Raises:
            InputError: unreadable file, invalid YAML, or an invalid topology (the error
                names the file, object and field).
        """
        source = "<yaml>"
        text: str
        if isinstance(path_or_text, Path) or ("\n" not in path_or_text
                                               and Path(path_or_text).is_file()):
            source = str(path_or_text)
            try:
                text = Path(path_or_text).read_text()
            except OSError as err:
                raise InputError(f"cannot read: {err.strerror}", source=source) from None
        else:
            text = str(path_or_text)
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark else None
            raise InputError(f"invalid YAML: {getattr(err, 'problem', err)}", source=source,
                             obj=where) from None
        try:
            return cls.from_dict(data, source=source)
        except InputError as err:
            raise err.with_source(source) from None

    @classmethod
    def from_dict(cls, data: Any, source: str = "<memory>") -> Topology:
        """Validate a topology given as plain data and resolve ``auto`` addresses.

        Raises:
            InputError: naming the object (``Pod web-a1``) and field (``ports[0].port``).
        """
        return _Parser(source).parse(data)

    # ------------------------------------------------------------ lookups

    def node(self, name: str) -> Node:
        """Return the node called ``name``.

        Raises:
            InputError: no such node.
        """
        for node in self.nodes:
            if node.name == name:
                return node
        raise InputError("no such node in the lab topology", obj=f"Node {name}")

    def pod(self, name: str) -> Pod:
        """Return the pod called ``name``.

        Raises:
            InputError: no such pod.
        """
        for pod in self.pods:
            if pod.name == name:
                return pod
        raise InputError("no such pod in the lab topology", obj=f"Pod {name}")

    def service(self, key: str) -> Service:
        """Return the Service ``namespace/name`` (or ``name`` when that is unambiguous).

        Raises:
            InputError: no such Service, or ``name`` alone matches several namespaces.
        """
        if "/" in key:
            found = [s for s in self.services if s.key == key]
        else:
            found = [s for s in self.services if s.name == key]
        if len(found) == 1:
            return found[0]
        problem = "no such Service in the lab topology" if not found else \
            "Service name is ambiguous, use namespace/name"
        raise InputError(problem, obj=f"Service {key}")

    def zone_of(self, node: str) -> str:
        """Return the zone name of ``node``."""
        return self.node(node).zone

    def peer(self, name: str) -> OutsidePeer:
        """Return the outside peer called ``name`` (or ``outside/<name>``).

        Raises:
            InputError: no such peer.
        """
        bare = name.removeprefix("outside/")
        for p in self.outside:
            if p.name == bare:
                return p
        raise InputError("no such outside peer in the lab topology", obj=f"outside peer {bare}")

    def pods_on(self, node: str) -> tuple[Pod, ...]:
        """Return the pods scheduled on ``node``, in topology order."""
        return tuple(p for p in self.pods if p.node == node)

    def to_dict(self) -> dict[str, Any]:
        """Return the resolved topology as plain data (addresses filled in), suitable for
        :meth:`from_dict` and for the lab's state file."""
        opt = self.options
        return {
            "options": {
                "mode": opt.mode, "ipv6": opt.ipv6, "mtu": opt.mtu, "vni": opt.vni,
                **({"offloads": True} if opt.offloads else {}),
                **{k: str(getattr(opt, k)) for k in (
                    "node_cidr", "node_cidr_v6", "pod_cidr", "pod_cidr_v6", "service_cidr",
                    "service_cidr_v6", "overlay_cidr", "overlay_cidr_v6")},
            },
            "zones": [{"name": z.name, **({"region": z.region} if z.region else {})}
                      for z in self.zones],
            "nodes": [{"name": n.name, "zone": n.zone, "cpu": n.cpu,
                       "ignoreHints": n.ignore_hints,
                       **({"dataPlane": n.data_plane} if n.data_plane != "kube-proxy" else {})}
                      for n in self.nodes],
            "pods": [{
                "name": p.name, "namespace": p.namespace, "node": p.node, "labIndex": p.index,
                **({} if p.host_network else {"ip": str(p.ip)}),
                **({"ip6": str(p.ip6)} if p.ip6 and not p.host_network else {}),
                "ports": [_port_dict(pp) for pp in p.ports],
                "labels": dict(p.labels), "hostNetwork": p.host_network,
            } for p in self.pods],
            "services": [{
                "name": s.name, "namespace": s.namespace,
                "clusterIP": "None" if s.cluster_ip is None else str(s.cluster_ip),
                **({"clusterIP6": str(s.cluster_ip6)} if s.cluster_ip6 else {}),
                "ports": [{"port": sp.port, "targetPort": sp.target_port,
                           "protocol": sp.protocol, **({"name": sp.name} if sp.name else {}),
                           **({"nodePort": sp.node_port} if sp.node_port is not None else {})}
                          for sp in s.ports],
                **({"selector": dict(s.selector)} if s.selector is not None
                   else {"endpoints": list(s.endpoints)}),
                "annotations": dict(s.annotations),
                **({"trafficDistribution": s.traffic_distribution}
                   if s.traffic_distribution else {}),
                "internalTrafficPolicy": s.internal_traffic_policy,
                **({"type": s.type} if s.type != "ClusterIP" else {}),
                **({"externalTrafficPolicy": s.external_traffic_policy} if s.node_ports else {}),
            } for s in self.services],
            **({"outside": [{
                "name": o.name, "kind": o.kind, **({"zone": o.zone} if o.zone else {}),
                **({"type": o.lb_type} if o.lb_type else {}),
                "ports": [_port_dict(pp) for pp in o.ports]} for o in self.outside]}
               if self.outside else {}),
        }


def _port_dict(pp: PodPort) -> dict[str, Any]:
    return {"port": pp.port, "protocol": pp.protocol, **({"name": pp.name} if pp.name else {}),
            **({"hostPort": pp.host_port} if pp.host_port is not None else {})}


# ---------------------------------------------------------------- parsing


class _Parser:
    """Validates one topology document; every error names the object and field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, problem: str, obj: str | None = None, fld: str | None = None) -> InputError:
        return InputError(problem, source=self.source, obj=obj, field=fld)

    # --- small typed readers ------------------------------------------------

    def mapping(self, value: Any, obj: str | None, fld: str | None) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(f"must be a mapping, got {type(value).__name__}", obj, fld)
        return value

    def seq(self, value: Any, obj: str | None, fld: str) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise self.fail(f"must be a list, got {type(value).__name__}", obj, fld)
        return value

    def name(self, value: Any, obj: str | None, fld: str, subdomain: bool = False) -> str:
        pattern = _DNS_SUBDOMAIN if subdomain else _DNS_LABEL
        if not isinstance(value, str) or not value or len(value) > 63 or not pattern.match(value):
            raise self.fail(f"must be a DNS label (lowercase letters, digits, '-'), got {value!r}",
                            obj, fld)
        return value

    def port(self, value: Any, obj: str, fld: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
            raise self.fail(f"must be a port number 1-65535, got {value!r}", obj, fld)
        return value

    def protocol(self, value: Any, obj: str, fld: str) -> str:
        text = "TCP" if value is None else value
        if not isinstance(text, str) or text.upper() not in PROTOCOLS:
            raise self.fail(f"must be TCP or UDP, got {value!r}", obj, fld)
        return text.upper()

    def labels(self, value: Any, obj: str, fld: str) -> dict[str, str]:
        if value is None:
            return {}
        m = self.mapping(value, obj, fld)
        out = {}
        for k, v in m.items():
            if not isinstance(k, str) or not isinstance(v, (str, int, float)) or isinstance(v, bool):
                raise self.fail(f"labels must map strings to strings, got {k!r}: {v!r}", obj, fld)
            out[k] = str(v)
        return out

    def network(self, value: Any, version: int, fld: str) -> Any:
        try:
            net = ipaddress.ip_network(str(value), strict=True)
        except ValueError as err:
            raise self.fail(f"not a CIDR: {err}", "options", fld) from None
        if net.version != version:
            raise self.fail(f"must be an IPv{version} CIDR, got {value!r}", "options", fld)
        return net

    def unknown_keys(self, m: Mapping[str, Any], allowed: set[str], obj: str | None) -> None:
        for key in m:
            if key not in allowed:
                raise self.fail(f"unknown field (allowed: {', '.join(sorted(allowed))})", obj,
                                str(key))

    # --- sections -------------------------------------------------------------

    def parse(self, data: Any) -> Topology:
        top = self.mapping(data, None, "topology")
        self.unknown_keys(top, {"options", "zones", "nodes", "pods", "services", "outside"}, None)
        options = self.options(top.get("options") or {})
        zones = self.zones(self.seq(top.get("zones"), None, "zones"))
        nodes = self.nodes(self.seq(top.get("nodes"), None, "nodes"), zones, options)
        pods = self.pods(self.seq(top.get("pods"), None, "pods"), nodes, options)
        services = self.services(self.seq(top.get("services"), None, "services"), pods, options)
        outside = self.outside(self.seq(top.get("outside"), None, "outside"), zones, nodes, pods,
                               options)
        return Topology(zones=tuple(zones), nodes=tuple(nodes), pods=tuple(pods),
                        services=tuple(services), options=options, source=self.source,
                        outside=tuple(outside))

    def outside(self, raw: list[Any], zones: list[Zone], nodes: list[Node], pods: list[Pod],
                opt: Options) -> list[OutsidePeer]:
        zone_names = {z.name for z in zones}
        pod_names = {p.name for p in pods}
        out: list[OutsidePeer] = []
        for i, item in enumerate(raw):
            obj = f"outside[{i}]"
            m = self.mapping(item, obj, None)
            self.unknown_keys(m, {"name", "kind", "zone", "type", "ports"}, obj)
            name = self.name(m.get("name"), obj, "name")
            obj = f"outside peer {name}"
            if name in pod_names or any(o.name == name for o in out):
                raise self.fail("duplicate name (outside peers and pods share one namespace "
                                "of names: flows name them)", obj, "name")
            kind = m.get("kind")
            if kind not in OUTSIDE_KINDS:
                raise self.fail(f"must be one of {', '.join(OUTSIDE_KINDS)}, got {kind!r}", obj, "kind")
            zone = m.get("zone")
            if kind == "external":
                if zone is not None:
                    raise self.fail("an external peer has no zone (no zone-CIDR entry); use kind "
                                    "vm or database for a peer in a zone", obj, "zone")
            elif zone not in zone_names:
                raise self.fail(f"unknown zone {zone!r} (zones: {', '.join(sorted(zone_names))})",
                                obj, "zone")
            lb_type = m.get("type")
            if lb_type is not None:
                if kind != "load-balancer":
                    raise self.fail("only a load-balancer peer has a type", obj, "type")
                if not isinstance(lb_type, str) or not _TOKEN.match(lb_type) or len(lb_type) > 63:
                    raise self.fail(f"must be a lowercase token such as aws-alb, got {lb_type!r}",
                                    obj, "type")
            ports: list[PodPort] = []
            for j, p in enumerate(self.seq(m.get("ports"), obj, "ports")):
                fld = f"ports[{j}]"
                if isinstance(p, int) and not isinstance(p, bool):
                    p = {"port": p}
                pm = self.mapping(p, obj, fld)
                self.unknown_keys(pm, {"port", "protocol", "name"}, obj)
                number = self.port(pm.get("port"), obj, f"{fld}.port")
                if EPHEMERAL_PORTS[0] <= number <= EPHEMERAL_PORTS[1]:
                    raise self.fail(f"port {number} lies in the clients' ephemeral range "
                                    f"{EPHEMERAL_PORTS[0]}-{EPHEMERAL_PORTS[1]}", obj, f"{fld}.port")
                proto = self.protocol(pm.get("protocol"), obj, f"{fld}.protocol")
                if any(q.port == number and q.protocol == proto for q in ports):
                    raise self.fail(f"duplicate port {number}/{proto}", obj, f"{fld}.port")
                pname = pm.get("name")
                ports.append(PodPort(number, proto, None if pname is None else
                                     self.name(pname, obj, f"{fld}.name")))
            offset = OUTSIDE_OFFSET + i
            if opt.node_cidr.num_addresses - 2 - offset <= len(nodes):
                raise self.fail("options.node_cidr has no address left for this peer above the "
                                "nodes'", obj, "name")
            ip = opt.node_cidr.broadcast_address - offset
            ip6 = opt.node_cidr_v6.broadcast_address - offset if opt.ipv6 else None
            out.append(OutsidePeer(name=name, kind=kind, zone=zone, lb_type=lb_type, index=i,
                                   ip=ip, ip6=ip6, ports=tuple(ports)))
        return out

    def options(self, raw: Any) -> Options:
        m = self.mapping(raw, "options", None)
        nets = {"node_cidr": 4, "node_cidr_v6": 6, "pod_cidr": 4, "pod_cidr_v6": 6,
                "service_cidr": 4, "service_cidr_v6": 6, "overlay_cidr": 4, "overlay_cidr_v6": 6}
        self.unknown_keys(m, {"mode", "ipv6", "mtu", "vni", "offloads", *nets}, "options")
        kwargs: dict[str, Any] = {}
        mode = m.get("mode", "flat")
        if mode not in MODES:
            raise self.fail(f"must be one of {', '.join(MODES)}, got {mode!r}", "options", "mode")
        kwargs["mode"] = mode
        ipv6 = m.get("ipv6", False)
        if not isinstance(ipv6, bool):
            raise self.fail(f"must be true or false, got {ipv6!r}", "options", "ipv6")
        kwargs["ipv6"] = ipv6
        mtu = m.get("mtu", 1500)
        if isinstance(mtu, bool) or not isinstance(mtu, int) or not 1280 <= mtu <= 9000:
            raise self.fail(f"must be an integer 1280-9000, got {mtu!r}", "options", "mtu")
        kwargs["mtu"] = mtu
        vni = m.get("vni", 42)
        if isinstance(vni, bool) or not isinstance(vni, int) or not 1 <= vni < 2**24:
            raise self.fail(f"must be an integer 1-16777215, got {vni!r}", "options", "vni")
        kwargs["vni"] = vni
        offloads = m.get("offloads", False)
        if not isinstance(offloads, bool):
            raise self.fail(f"must be true or false, got {offloads!r}", "options", "offloads")
        kwargs["offloads"] = offloads
        for key, version in nets.items():
            if key in m:
                kwargs[key] = self.network(m[key], version, key)
        opt = Options(**kwargs)
        if opt.pod_cidr.prefixlen > 22:
            raise self.fail("must be /22 or larger (one /24 per node)", "options", "pod_cidr")
        if opt.pod_cidr_v6.prefixlen > 56:
            raise self.fail("must be /56 or larger (one /64 per node)", "options", "pod_cidr_v6")
        return opt

    def zones(self, raw: list[Any]) -> list[Zone]:
        if not raw:
            raise self.fail("at least one zone is required", None, "zones")
        zones: list[Zone] = []
        for i, item in enumerate(raw):
            obj = f"zones[{i}]"
            m = self.mapping(item, obj, None)
            self.unknown_keys(m, {"name", "region"}, obj)
            name = self.name(m.get("name"), obj, "name", subdomain=True)
            obj = f"Zone {name}"
            region = m.get("region")
            if region is not None:
                region = self.name(region, obj, "region", subdomain=True)
            if any(z.name == name for z in zones):
                raise self.fail("duplicate zone name", obj, "name")
            zones.append(Zone(name, region))
        return zones

    def nodes(self, raw: list[Any], zones: list[Zone], opt: Options) -> list[Node]:
        if not raw:
            raise self.fail("at least one node is required", None, "nodes")
        zone_names = {z.name for z in zones}
        pod_blocks = opt.pod_cidr.subnets(new_prefix=24)
        pod_blocks6 = opt.pod_cidr_v6.subnets(new_prefix=64)
        next(pod_blocks)  # block 0 stays unused: node i gets block i+1
        next(pod_blocks6)
        nodes: list[Node] = []
        for i, item in enumerate(raw):
            obj = f"nodes[{i}]"
            m = self.mapping(item, obj, None)
            self.unknown_keys(m, {"name", "zone", "cpu", "ignoreHints", "dataPlane"}, obj)
            name = self.name(m.get("name"), obj, "name", subdomain=True)
            obj = f"Node {name}"
            if any(n.name == name for n in nodes):
                raise self.fail("duplicate node name", obj, "name")
            zone = m.get("zone")
            if zone not in zone_names:
                raise self.fail(f"unknown zone {zone!r} (zones: {', '.join(sorted(zone_names))})",
                                obj, "zone")
            cpu = m.get("cpu", 4)
            if isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or not 0 < cpu < math.inf:
                raise self.fail(f"must be a positive number of CPUs, got {cpu!r}", obj, "cpu")
            ignore = m.get("ignoreHints", False)
            if not isinstance(ignore, bool):
                raise self.fail(f"must be true or false, got {ignore!r}", obj, "ignoreHints")
            plane = m.get("dataPlane", "kube-proxy")
            if plane not in DATA_PLANES:
                raise self.fail(f"must be one of {', '.join(DATA_PLANES)}, got {plane!r}", obj,
                                "dataPlane")
            if plane == "bypass" and opt.mode != "flat":
                raise self.fail("the bypass data plane needs options.mode flat", obj, "dataPlane")
            ip, overlay_ip = _nth_host(opt.node_cidr, i), _nth_host(opt.overlay_cidr, i)
            if ip is None or overlay_ip is None:
                raise self.fail("too many nodes for options.node_cidr/overlay_cidr", obj, "name")
            try:
                block, block6 = next(pod_blocks), next(pod_blocks6)
            except StopIteration:
                raise self.fail("too many nodes for options.pod_cidr", obj, "name") from None
            vx = opt.mode == "vxlan"
            for key in ("node_cidr_v6", "overlay_cidr_v6"):
                if opt.ipv6 and i + 1 >= getattr(opt, key).num_addresses:
                    raise self.fail(f"too many nodes for options.{key}", obj, "name")
            nodes.append(Node(
                name=name, zone=zone, cpu=float(cpu), index=i, ip=ip,
                ip6=opt.node_cidr_v6[i + 1] if opt.ipv6 else None,
                overlay_ip=overlay_ip if vx else None,
                overlay_ip6=opt.overlay_cidr_v6[i + 1] if vx and opt.ipv6 else None,
                pod_cidr=block, pod_cidr_v6=block6 if opt.ipv6 else None, ignore_hints=ignore,
                data_plane=plane))
        return nodes

    def pods(self, raw: list[Any], nodes: list[Node], opt: Options) -> list[Pod]:
        by_name = {n.name: n for n in nodes}
        next_host: dict[str, int] = {n.name: 2 for n in nodes}
        used: dict[IPAddress, str] = {}
        host_ports: dict[tuple[str, str, int], str] = {}
        parsed: list[tuple[dict[str, Any], Any, Any]] = []
        pods: list[Pod] = []
        names: set[str] = set()
        indexes: set[int] = set()
        # first pass: fields and explicit addresses; second: auto addresses
        for i, item in enumerate(raw):
            obj = f"pods[{i}]"
            m = self.mapping(item, obj, None)
            self.unknown_keys(m, {"name", "namespace", "node", "ip", "ip6", "ports", "labels",
                                  "app", "hostNetwork", "labIndex"}, obj)
            name = self.name(m.get("name"), obj, "name", subdomain=True)
            obj = f"Pod {name}"
            if name in names:
                raise self.fail("duplicate pod name (pod names are unique in a lab)", obj, "name")
            names.add(name)
            namespace = self.name(m.get("namespace", "default"), obj, "namespace")
            node_name = m.get("node")
            if node_name not in by_name:
                raise self.fail(f"unknown node {node_name!r}", obj, "node")
            node = by_name[node_name]
            host = m.get("hostNetwork", False)
            if not isinstance(host, bool):
                raise self.fail(f"must be true or false, got {host!r}", obj, "hostNetwork")
            ports: list[PodPort] = []
            for j, p in enumerate(self.seq(m.get("ports"), obj, "ports")):
                fld = f"ports[{j}]"
                if isinstance(p, int) and not isinstance(p, bool):
                    p = {"port": p}
                pm = self.mapping(p, obj, fld)
                self.unknown_keys(pm, {"port", "containerPort", "protocol", "name", "hostPort"}, obj)
                number = self.port(pm.get("port", pm.get("containerPort")), obj, f"{fld}.port")
                if EPHEMERAL_PORTS[0] <= number <= EPHEMERAL_PORTS[1]:
                    raise self.fail(f"port {number} lies in the clients' ephemeral range "
                                    f"{EPHEMERAL_PORTS[0]}-{EPHEMERAL_PORTS[1]}, where the lab's "
                                    "ground truth could not tell requests from responses",
                                    obj, f"{fld}.port")
                proto = self.protocol(pm.get("protocol"), obj, f"{fld}.protocol")
                pname = pm.get("name")
                if pname is not None:
                    pname = self.name(pname, obj, f"{fld}.name")
                if any(q.port == number and q.protocol == proto for q in ports):
                    raise self.fail(f"duplicate port {number}/{proto}", obj, f"{fld}.port")
                hport = pm.get("hostPort")
                if hport is not None:
                    hport = self.port(hport, obj, f"{fld}.hostPort")
                    if host and hport != number:
                        raise self.fail(f"a hostNetwork pod's hostPort must equal its port {number} "
                                        "(as the apiserver requires)", obj, f"{fld}.hostPort")
                    if EPHEMERAL_PORTS[0] <= hport <= EPHEMERAL_PORTS[1] or \
                            NODE_PORTS[0] <= hport <= NODE_PORTS[1]:
                        raise self.fail(f"hostPort {hport} lies in the clients' ephemeral range or "
                                        "the node-port range", obj, f"{fld}.hostPort")
                if host or hport is not None:
                    on_node = number if host else hport
                    other = host_ports.get((node.name, proto, on_node))
                    if other:
                        raise self.fail(f"port {on_node}/{proto} already used on node {node.name} "
                                        f"by pod {other} (hostNetwork or hostPort)", obj,
                                        f"{fld}.hostPort" if hport is not None else f"{fld}.port")
                    host_ports[(node.name, proto, on_node)] = name
                ports.append(PodPort(number, proto, pname, hport))
            labels = self.labels(m.get("labels"), obj, "labels")
            if "app" in m:
                labels.setdefault("app", str(self.labels({"app": m["app"]}, obj, "app")["app"]))
            ip: Any = None
            ip6: Any = None
            if host:
                if m.get("ip", "auto") != "auto" or m.get("ip6", "auto") != "auto":
                    raise self.fail("a hostNetwork pod uses its node's address; omit ip", obj, "ip")
                ip, ip6 = node.ip, node.ip6
            else:
                ip = self.pod_ip(m.get("ip", "auto"), 4, node.pod_cidr, obj, "ip", used, name)
                if opt.ipv6:
                    ip6 = self.pod_ip(m.get("ip6", "auto"), 6, node.pod_cidr_v6, obj, "ip6", used,
                                      name)
                elif m.get("ip6", "auto") != "auto":
                    raise self.fail("options.ipv6 is false", obj, "ip6")
            index = m.get("labIndex")
            if index is not None:
                if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < 10**5:
                    raise self.fail(f"must be an integer 0-99999, got {index!r}", obj, "labIndex")
                if index in indexes:
                    raise self.fail(f"labIndex {index} is already used", obj, "labIndex")
                indexes.add(index)
            parsed.append((dict(name=name, namespace=namespace, node=node.name, index=index,
                                ports=tuple(ports), labels=labels, host_network=host), ip, ip6))
        free = (i for i in range(10**6) if i not in indexes)
        for kwargs, ip, ip6 in parsed:
            if kwargs["index"] is None:
                kwargs["index"] = next(free)
            node = by_name[kwargs["node"]]
            if ip == "auto":
                ip = self.next_free(node.pod_cidr, next_host, node.name, used, kwargs["name"])
            if ip6 == "auto":
                ip6 = self.next_free(node.pod_cidr_v6, next_host, node.name + "/6", used,
                                     kwargs["name"])
            pods.append(Pod(ip=ip, ip6=ip6, **kwargs))
        return pods

    def pod_ip(self, value: Any, version: int, cidr: Any, obj: str, fld: str,
               used: dict[IPAddress, str], name: str) -> Any:
        if value == "auto" or value is None:
            return "auto"
        try:
            addr = ipaddress.ip_address(str(value))
        except ValueError:
            raise self.fail(f"not an IP address: {value!r}", obj, fld) from None
        if addr.version != version:
            raise self.fail(f"must be an IPv{version} address, got {value!r}", obj, fld)
        if addr not in cidr or addr in (cidr.network_address, cidr.network_address + 1) or (
                version == 4 and addr == cidr.broadcast_address):
            raise self.fail(f"{addr} is not a usable address of its node's pod CIDR {cidr} "
                            f"(.0, .1 and broadcast are reserved)", obj, fld)
        if addr in used:
            raise self.fail(f"{addr} is already used by pod {used[addr]}", obj, fld)
        used[addr] = name
        return addr

    def next_free(self, cidr: Any, next_host: dict[str, int], key: str,
                  used: dict[IPAddress, str], name: str) -> Any:
        n = next_host.get(key, 2)
        while True:
            if n >= cidr.num_addresses - 1:
                raise self.fail(f"no free address left in pod CIDR {cidr}", f"Pod {name}", "ip")
            addr = cidr[n]
            n += 1
            if addr not in used:
                next_host[key] = n
                used[addr] = name
                return addr

    def services(self, raw: list[Any], pods: list[Pod], opt: Options) -> list[Service]:
        services: list[Service] = []
        used: dict[IPAddress, str] = {}
        node_ports: dict[tuple[str, int], str] = {}
        pending: list[tuple[dict[str, Any], Any, Any]] = []
        pod_by_name = {p.name: p for p in pods}
        for i, item in enumerate(raw):
            obj = f"services[{i}]"
            m = self.mapping(item, obj, None)
            self.unknown_keys(m, {"name", "namespace", "clusterIP", "clusterIP6", "ports",
                                  "selector", "endpoints", "annotations", "trafficDistribution",
                                  "internalTrafficPolicy", "type", "externalTrafficPolicy"}, obj)
            name = self.name(m.get("name"), obj, "name")
            namespace = self.name(m.get("namespace", "default"), f"Service {name}", "namespace")
            obj = f"Service {namespace}/{name}"
            if any(s[0]["name"] == name and s[0]["namespace"] == namespace for s in pending):
                raise self.fail("duplicate Service", obj, "name")
            stype = m.get("type", "ClusterIP")
            if stype not in SERVICE_TYPES:
                raise self.fail(f"must be one of {', '.join(SERVICE_TYPES)}, got {stype!r}", obj, "type")
            headless = m.get("clusterIP") == "None"
            if headless and stype != "ClusterIP":
                raise self.fail(f"a headless Service (clusterIP: None) is of type ClusterIP, not {stype}",
                                obj, "clusterIP")
            if headless and m.get("clusterIP6", "None") not in ("None", "auto"):
                raise self.fail("a headless Service has no ClusterIP in either family", obj, "clusterIP6")
            etp = m.get("externalTrafficPolicy", "Cluster")
            if "externalTrafficPolicy" in m and stype == "ClusterIP":
                raise self.fail("only NodePort and LoadBalancer Services have an externalTrafficPolicy",
                                obj, "externalTrafficPolicy")
            if etp not in EXTERNAL_TRAFFIC_POLICIES:
                raise self.fail(f"must be Cluster or Local, got {etp!r}", obj, "externalTrafficPolicy")
            ports: list[ServicePort] = []
            raw_ports = self.seq(m.get("ports"), obj, "ports")
            if not raw_ports:
                raise self.fail("at least one port is required", obj, "ports")
            for j, p in enumerate(raw_ports):
                fld = f"ports[{j}]"
                pm = self.mapping(p, obj, fld)
                self.unknown_keys(pm, {"port", "targetPort", "protocol", "name", "nodePort"}, obj)
                number = self.port(pm.get("port"), obj, f"{fld}.port")
                target = pm.get("targetPort", number)
                if isinstance(target, str):
                    target = self.name(target, obj, f"{fld}.targetPort")
                else:
                    target = self.port(target, obj, f"{fld}.targetPort")
                proto = self.protocol(pm.get("protocol"), obj, f"{fld}.protocol")
                pname = pm.get("name")
                if pname is not None:
                    pname = self.name(pname, obj, f"{fld}.name")
                elif len(raw_ports) > 1:
                    raise self.fail("ports need names when a Service has several", obj,
                                    f"{fld}.name")
                if any(q.port == number and q.protocol == proto for q in ports):
                    raise self.fail(f"duplicate port {number}/{proto}", obj, f"{fld}.port")
                node_port = pm.get("nodePort")
                if node_port is not None:
                    if stype == "ClusterIP":
                        raise self.fail("only a Service of type NodePort or LoadBalancer has node "
                                        "ports", obj, f"{fld}.nodePort")
                    if isinstance(node_port, bool) or not isinstance(node_port, int) or \
                            not NODE_PORTS[0] <= node_port <= NODE_PORTS[1]:
                        raise self.fail(f"must be a port number {NODE_PORTS[0]}-{NODE_PORTS[1]} "
                                        "(the apiserver's default --service-node-port-range), "
                                        f"got {node_port!r}", obj, f"{fld}.nodePort")
                    other = node_ports.get((proto, node_port))
                    if other:
                        raise self.fail(f"nodePort {node_port}/{proto} is already used by {other}",
                                        obj, f"{fld}.nodePort")
                    node_ports[(proto, node_port)] = obj
                ports.append(ServicePort(number, target, proto, pname, node_port))
            if ("selector" in m) == ("endpoints" in m):
                raise self.fail("give exactly one of selector or endpoints", obj, "selector")
            selector: dict[str, str] | None = None
            if "selector" in m:
                selector = self.labels(m["selector"], obj, "selector")
                if not selector:
                    raise self.fail("an empty selector would select every pod", obj, "selector")
                endpoints = [p.name for p in pods if p.namespace == namespace
                             and all(p.labels.get(k) == v for k, v in selector.items())]
            else:
                endpoints = []
                for j, ep in enumerate(self.seq(m["endpoints"], obj, "endpoints")):
                    if ep not in pod_by_name:
                        raise self.fail(f"unknown pod {ep!r}", obj, f"endpoints[{j}]")
                    if pod_by_name[ep].namespace != namespace:
                        raise self.fail(f"pod {ep} is in namespace {pod_by_name[ep].namespace}",
                                        obj, f"endpoints[{j}]")
                    endpoints.append(ep)
            for ep in endpoints:
                for j, sp in enumerate(ports):
                    pod = pod_by_name[ep]
                    if not any(_pod_port_matches(pp, sp) for pp in pod.ports):
                        raise self.fail(f"endpoint pod {ep} has no port {sp.target_port}/"
                                        f"{sp.protocol}", obj, f"ports[{j}].targetPort")
            annotations = self.labels(m.get("annotations"), obj, "annotations")
            td = m.get("trafficDistribution")
            if td is not None and td not in TRAFFIC_DISTRIBUTIONS:
                raise self.fail(f"must be one of {', '.join(TRAFFIC_DISTRIBUTIONS)}, got {td!r}",
                                obj, "trafficDistribution")
            itp = m.get("internalTrafficPolicy", "Cluster")
            if itp not in ("Cluster", "Local"):
                raise self.fail(f"must be Cluster or Local, got {itp!r}", obj,
                                "internalTrafficPolicy")
            cip = None if headless else self.cluster_ip(m.get("clusterIP", "auto"), opt.service_cidr,
                                                        obj, "clusterIP", used)
            cip6 = None
            if opt.ipv6 and not headless:
                cip6 = self.cluster_ip(m.get("clusterIP6", "auto"), opt.service_cidr_v6, obj,
                                       "clusterIP6", used)
            elif m.get("clusterIP6", "auto") != "auto":
                raise self.fail("options.ipv6 is false", obj, "clusterIP6")
            pending.append((dict(name=name, namespace=namespace, ports=tuple(ports),
                                 selector=selector, endpoints=tuple(endpoints),
                                 annotations=annotations, traffic_distribution=td,
                                 internal_traffic_policy=itp, type=stype,
                                 external_traffic_policy=etp), cip, cip6))
        nxt = {4: 10, 6: 10}
        for kwargs, cip, cip6 in pending:
            key = f"{kwargs['namespace']}/{kwargs['name']}"
            if cip is None:
                services.append(Service(cluster_ip=None, cluster_ip6=None, **kwargs))
                continue
            if cip == "auto":
                cip = self.next_cluster_ip(opt.service_cidr, nxt, 4, used, key)
            if opt.ipv6 and cip6 == "auto":
                cip6 = self.next_cluster_ip(opt.service_cidr_v6, nxt, 6, used, key)
            services.append(Service(cluster_ip=cip, cluster_ip6=cip6, **kwargs))
        return services

    def cluster_ip(self, value: Any, cidr: Any, obj: str, fld: str,
                   used: dict[IPAddress, str]) -> Any:
        if value in ("auto", None):
            return "auto"
        try:
            addr = ipaddress.ip_address(str(value))
        except ValueError:
            raise self.fail(f"not an IP address: {value!r}", obj, fld) from None
        if addr not in cidr or addr == cidr.network_address:
            raise self.fail(f"{addr} is outside options.service_cidr {cidr}", obj, fld)
        if addr in used:
            raise self.fail(f"{addr} is already the ClusterIP of {used[addr]}", obj, fld)
        used[addr] = obj
        return addr

    def next_cluster_ip(self, cidr: Any, nxt: dict[int, int], version: int,
                        used: dict[IPAddress, str], key: str) -> Any:
        while nxt[version] < cidr.num_addresses - 1:
            addr = cidr[nxt[version]]
            nxt[version] += 1
            if addr not in used:
                used[addr] = key
                return addr
        raise self.fail("service CIDR exhausted", f"Service {key}", "clusterIP")


def _nth_host(net: Any, i: int) -> Any:
    """``list(net.hosts())[i]``, or None past the end, without building the list (a /8
    has 16 million hosts, and building them took gigabytes)."""
    if net.num_addresses <= 4:
        hosts = list(net.hosts())
        return hosts[i] if i < len(hosts) else None
    count = net.num_addresses - (2 if net.version == 4 else 1)  # hosts() rules per family
    return net.network_address + 1 + i if i < count else None


def _pod_port_matches(pp: PodPort, sp: ServicePort) -> bool:
    if pp.protocol != sp.protocol:
        return False
    if isinstance(sp.target_port, str):
        return pp.name == sp.target_port
    return pp.port == sp.target_port


def resolve_target_port(pod: Pod, sp: ServicePort) -> int:
    """Return the pod port number a Service port targets on ``pod`` (host byte order).

    Raises:
        InputError: the pod has no matching port.
    """
    for pp in pod.ports:
        if _pod_port_matches(pp, sp):
            return pp.port
    if isinstance(sp.target_port, int):
        return sp.target_port
    raise InputError(f"no port named {sp.target_port}", obj=f"Pod {pod.name}", field="ports")
