"""Services' indexes: EndpointSlices and endpoints by (address, port, protocol), and the front doors.

* :class:`SliceIndex`: EndpointSlices by key and by Service, and the endpoint index that
  maps an endpoint ``(address, target port, protocol)`` to the slice ports it serves.
* :func:`build_door_index`: NodePorts, externalIPs and LoadBalancer IPs to Service ports.
  ClusterIPs are indexed by the cache itself
  (:meth:`agent.k8s.cache.ClusterMetadata.service_address`); the other doors are those
  kube-proxy DNATs to a Service (``pkg/proxy`` ``KUBE-SERVICES``/``KUBE-NODEPORTS`` of the
  iptables/nftables/IPVS proxiers).

Not thread-safe by themselves: the cache uses them under its lock. See docs/metadata.md.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agent.k8s.parse import ServiceRecord, SliceEntry, SliceRecord, slice_addresses
from agent.k8s.pods import tagged_address_key
from agent.records import IPAddress, ServicePort

ServiceKey = tuple[str, str]  # (namespace, name)
SliceKey = tuple[str, str]  # (namespace, slice name)
#: one endpoint-index entry: (slice name, namespace, service, slice port name)
EpEntry = tuple[str, str, str, str]

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


def endpoint_key(ip: IPAddress, port: int, protocol: int) -> int:
    """Endpoint index key: address key, port (16 bits) and protocol (8 bits) in one int."""
    return (tagged_address_key(ip) << 24) | ((port & 0xFFFF) << 8) | (protocol & 0xFF)


class SliceIndex:
    """EndpointSlices as records, by Service, and the endpoint index.

    Attributes:
        slices: slice key -> :class:`agent.k8s.parse.SliceRecord`, in arrival order.
        entries: slice key -> the hint model's :data:`agent.k8s.parse.SliceEntry`.
        service_of: slice key -> ``(namespace, service)`` of its ``kubernetes.io/service-name``
            label (labelled slices only).
        by_service: ``(namespace, service)`` -> its labelled slices' keys.
        endpoints: :func:`endpoint_key` -> :data:`EpEntry` tuples of the slice ports served there.
    """

    def __init__(self) -> None:
        self.slices: dict[SliceKey, SliceRecord] = {}
        self.entries: dict[SliceKey, SliceEntry] = {}
        self.by_service: dict[ServiceKey, set[SliceKey]] = {}
        self.service_of: dict[SliceKey, ServiceKey] = {}
        self.endpoints: dict[int, tuple[EpEntry, ...]] = {}

    def upsert(self, key: SliceKey, svc_name: Any, rec: SliceRecord, entry: SliceEntry) -> list[ServiceKey]:
        """Add or replace a slice.

        Args:
            key: ``(namespace, slice name)``.
            svc_name: its ``kubernetes.io/service-name`` label as written (indexed only
                when a non-empty string).
            rec, entry: the slice parsed (cache record, hint-model entry).

        Returns:
            the Services whose slices changed (the old owner, the new one).
        """
        dirty: list[ServiceKey] = []
        old = self.remove(key)
        if old is not None:
            dirty.append(old)
        if isinstance(svc_name, str) and svc_name:
            svc = sys.intern(svc_name)
            addresses = slice_addresses(rec)
            index = self.endpoints
            for port, proto, name in rec.ports:
                # one shared 1-tuple per slice port: most endpoints back a single Service
                ep: tuple[EpEntry, ...] = ((key[1], key[0], svc, name),)
                for ip in addresses:
                    k = endpoint_key(ip, port, proto)
                    have = index.get(k)
                    index[k] = ep if have is None else have + ep
            skey = (key[0], svc)
            self.service_of[key] = skey
            self.by_service.setdefault(skey, set()).add(key)
            dirty.append(skey)
        self.slices[key] = rec
        self.entries[key] = entry
        return dirty

    def remove(self, key: SliceKey) -> ServiceKey | None:
        """Drop a slice; returns the Service it was labelled for (None: unknown or unlabelled)."""
        old = self.slices.pop(key, None)
        self.entries.pop(key, None)
        if old is None:
            return None
        skey = self.service_of.pop(key, None)
        if skey is None:
            return None  # never indexed (no service-name label)
        members = self.by_service.get(skey)
        if members is not None:
            members.discard(key)
            if not members:
                del self.by_service[skey]
        index = self.endpoints
        for ip in slice_addresses(old):
            for port, proto, _name in old.ports:
                k = endpoint_key(ip, port, proto)
                entries = index.get(k)
                if entries is None:
                    continue
                kept = tuple(e for e in entries if (e[1], e[0]) != key)
                if kept:
                    index[k] = kept
                else:
                    del index[k]
        return skey
