"""The Service front-door index: NodePorts, externalIPs and LoadBalancer IPs to Service ports.

ClusterIPs are indexed by the cache itself (:meth:`agent.k8s.cache.ClusterMetadata.service_address`);
this module indexes the other doors kube-proxy DNATs to a Service (``pkg/proxy``
``KUBE-SERVICES``/``KUBE-NODEPORTS`` of the iptables/nftables/IPVS proxiers), from the
cache's :class:`agent.k8s.parse.ServiceRecord`. See docs/metadata.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from agent.k8s.parse import ServiceRecord
from agent.records import IPAddress, ServicePort

#: Linux's default ephemeral port range (``net.ipv4.ip_local_port_range``), inclusive
EPHEMERAL_FIRST, EPHEMERAL_LAST = 32768, 60999


@dataclass(frozen=True, slots=True)
class DoorIndex:
    """Service ports by front door, built by :func:`build_door_index`.

    Attributes:
        doors: ``(externalIP or LB IP, port, protocol) -> ServicePort``.
        nodeports: ``(nodePort, protocol) -> ServicePort`` (any node address serves them).
        by_addr: ``(ClusterIP, externalIP or LB IP, protocol) -> ServicePort`` for a
            remote port the datapath recorded as 0: the Service's first port of that
            protocol inside the ephemeral range, else its lowest.
        service_ips: every address of ``by_addr``.
    """

    doors: Mapping[tuple[IPAddress, int, int], ServicePort]
    nodeports: Mapping[tuple[int, int], ServicePort]
    by_addr: Mapping[tuple[IPAddress, int], ServicePort]
    service_ips: frozenset[IPAddress]


def build_door_index(services: Iterable[ServiceRecord]) -> DoorIndex:
    """Index every Service's NodePorts, externalIPs and LoadBalancer IPs.

    O(Services x ports); where two Services claim the same door the first one wins.

    Args:
        services: the cache's Service records, in cache order.
    """
    nodeports: dict[tuple[int, int], ServicePort] = {}
    doors: dict[tuple[IPAddress, int, int], ServicePort] = {}
    by_addr: dict[tuple[IPAddress, int], ServicePort] = {}
    for svc in services:
        ext = svc.external_ips + svc.lb_ips
        addrs = svc.cluster_ips + ext
        candidates: dict[int, list[ServicePort]] = {}
        for p in svc.ports:
            sp = ServicePort(svc.namespace, svc.name, p.port, p.name, p.target_port, p.protocol)
            candidates.setdefault(p.protocol, []).append(sp)
            for a in ext:
                doors.setdefault((a, p.port, p.protocol), sp)
            if p.node_port:
                nodeports.setdefault((p.node_port, p.protocol), sp)
        for proto, sps in candidates.items():
            best = min(sps, key=lambda x: (not EPHEMERAL_FIRST <= x.port <= EPHEMERAL_LAST, x.port))
            for a in addrs:
                by_addr.setdefault((a, proto), best)
    return DoorIndex(doors, nodeports, by_addr, frozenset(a for a, _ in by_addr))
