"""Address and Service-port resolution for attribution, over the metadata cache.

:class:`MetadataAdapter` implements the ``MetadataView`` and ``ObjectView`` protocols of
:mod:`agent.attribution` over :class:`agent.k8s.cache.ClusterMetadata`: ``resolve()``,
``endpoint_services()``, ``service_address()`` (ClusterIPs and the other Service front
doors: NodePorts, ``spec.externalIPs``, LoadBalancer ingress IPs), ``live_services()``,
``live_workloads()`` and ``node()``. See docs/metadata.md.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from typing import Any

from agent.k8s.cache import ClusterMetadata
from agent.k8s.parse import protocol_number
from agent.records import IPAddress, Peer, PeerKind, ServicePort


class MetadataAdapter:
    """``MetadataView`` and ``ObjectView`` (agent/attribution.py) over a
    :class:`ClusterMetadata` cache.

    Args:
        cache: the metadata cache (snapshot or live watch); read only.
    """

    def __init__(self, cache: ClusterMetadata) -> None:
        self.cache = cache
        # (address, port, protocol) -> Service port of NodePorts, externalIPs and
        # LoadBalancer ingress IPs, rebuilt when Services or Nodes change
        self._doors: dict[tuple[IPAddress, int, int], ServicePort] = {}
        self._nodeports: dict[tuple[int, int], ServicePort] = {}
        self._door_gen: int | None = None
        # (ClusterIP / externalIP / LB IP, protocol) -> a Service port, for port 0
        self._by_addr: dict[tuple[IPAddress, int], ServicePort] = {}
        self._service_ips: frozenset[IPAddress] = frozenset()

    def resolve(self, ip: IPAddress, at: float) -> Peer:
        """Resolve ``ip`` as of ``at`` (Unix seconds); see ``ClusterMetadata.resolve``.

        A ClusterIP, ``externalIPs`` address or LoadBalancer IP (which the cache answers as
        EXTERNAL) is UNKNOWN with reason ``service_address_port_unknown``: attribution
        asks this only when :meth:`service_address` had no answer for its port (UDP
        non-first fragments, ICMP errors of a Service flow). Like an unresolved pod, only
        the client's outbound bytes count then: the endpoint's node counts its side as
        the pod's egress.
        """
        peer = self.cache.resolve(ip, at)
        if peer.kind is PeerKind.EXTERNAL and self._is_service_ip(ip):
            return _SERVICE_IP_PEER
        return peer

    def _is_service_ip(self, ip: IPAddress) -> bool:
        if self.cache.is_cluster_ip(ip):
            return True
        gen = self.cache.generation("services")
        if gen != self._door_gen:
            self._rebuild_doors(gen)
        return ip in self._service_ips

    def endpoint_services(self, ip: IPAddress, port: int, protocol: int) -> tuple[ServicePort, ...]:
        """Service ports the endpoint ``ip:port/protocol`` (target port, host order) serves."""
        return self.cache.endpoint_services(ip, port, protocol)

    def service_address(self, ip: IPAddress, port: int, protocol: int) -> ServicePort | None:
        """The Service port behind ``ip:port/protocol`` when it is a ClusterIP, a NodePort
        on a node address (InternalIP/ExternalIP), an ``spec.externalIPs`` address or a
        ``status.loadBalancer.ingress[].ip``; else None.

        All four are Service front doors: kube-proxy DNATs them (iptables/nftables/IPVS
        proxiers, ``pkg/proxy`` ``KUBE-SERVICES``/``KUBE-NODEPORTS``; a NodePort of another
        node is DNATed and masqueraded there, an LB IP with ``ipMode: Proxy`` comes back
        through a NodePort), so the endpoint's node counts the bytes as request/response
        and the client's veth copy must be skipped. The cache indexes ClusterIPs only
        (docs/metadata.md, Limits); the other doors are indexed here from the cache's
        pruned Services, rebuilt when they change (a NodePort answers on any address
        that resolves to a node). LoadBalancer ingress
        entries with only a ``hostname`` cannot be indexed.

        ``port`` 0 with TCP or SCTP means the datapath recorded the remote port as 0 (it
        lay in the node's ephemeral range, e.g. gRPC's 50051): a ClusterIP, externalIP or
        LoadBalancer IP only carries Service traffic, so the answer is one of the
        Service's ports of that protocol (the first inside Linux's default ephemeral
        range 32768-60999, else the lowest). Not for UDP: port 0 there is mostly a
        non-first fragment of a large datagram, which the endpoint's node cannot tell
        from pod traffic either (it skips it as a pod's ingress), so the client's copy is
        the only one counted.
        """
        if port:
            sp = self.cache.service_address(ip, port, protocol)
            if sp is not None:
                return sp
        gen = self.cache.generation("services")
        if gen != self._door_gen:
            self._rebuild_doors(gen)
        if not port:
            return self._by_addr.get((ip, protocol)) if protocol in (6, 132) else None
        sp = self._doors.get((ip, port, protocol))
        if sp is None:
            sp = self._nodeports.get((port, protocol))
            if sp is not None and self.cache.resolve(ip).kind is not PeerKind.NODE:
                return None
        return sp

    def _rebuild_doors(self, gen: int) -> None:
        """Index every Service's NodePorts (by port: any node address serves them),
        externalIPs and LoadBalancer IPs, O(Services x ports) per Service change
        (malformed fields are skipped: the hint model reports bad objects)."""
        _, services, _ = self.cache.raw_objects()
        nodeports: dict[tuple[int, int], ServicePort] = {}
        doors: dict[tuple[IPAddress, int, int], ServicePort] = {}
        by_addr: dict[tuple[IPAddress, int], ServicePort] = {}
        for svc in services:
            try:
                meta, spec = svc.get("metadata") or {}, svc.get("spec") or {}
                ns, name = meta.get("namespace") or "default", meta.get("name")
                if not isinstance(name, str) or not isinstance(spec, dict):
                    continue
                ext = [_ip_or_none(a) for a in spec.get("externalIPs") or ()]
                status = svc.get("status") or {}
                lb = ((status.get("loadBalancer") or {}).get("ingress") or ()) \
                    if isinstance(status, dict) else ()
                ext += [_ip_or_none(i.get("ip")) for i in lb if isinstance(i, dict)]
                cips = spec.get("clusterIPs") or [spec.get("clusterIP")]
                addrs = [a for a in [_ip_or_none(c) for c in cips] + ext if a is not None]
                candidates: dict[int, list[ServicePort]] = {}
                for p in spec.get("ports") or ():
                    if not isinstance(p, dict) or not _is_port(p.get("port")):
                        continue
                    proto = protocol_number(p.get("protocol"))
                    tp = p.get("targetPort", p["port"])
                    sp = ServicePort(ns, name, p["port"], str(p.get("name") or ""),
                                     tp if isinstance(tp, int) and _is_port(tp) else 0, proto)
                    candidates.setdefault(proto, []).append(sp)
                    for a in ext:
                        if a is not None:
                            doors.setdefault((a, p["port"], proto), sp)
                    np_ = p.get("nodePort")
                    if isinstance(np_, int) and _is_port(np_):
                        nodeports.setdefault((np_, proto), sp)
                for proto, sps in candidates.items():
                    best = min(sps, key=lambda x: (not 32768 <= x.port <= 60999, x.port))
                    for a in addrs:
                        by_addr.setdefault((a, proto), best)
            except Exception:  # noqa: BLE001 (a malformed Service must not stop the index)
                continue
        self._by_addr = by_addr
        self._service_ips = frozenset(a for a, _ in by_addr)
        self._doors = doors
        self._nodeports = nodeports
        self._door_gen = gen

    # ObjectView (series expiry) --------------------------------------------------------

    def live_services(self, services: Collection[tuple[str, str]]) -> set[tuple[str, str]]:
        """The Services of ``services`` (``(namespace, name)``) the cache still holds.

        All of them while the cache's Service list is not synced (a missing Service may
        then just not have arrived yet).
        """
        if not self.cache.synced().get("services", False):
            return set(services)
        return {s for s in services if self.cache.service(s[0], s[1]) is not None}

    def live_workloads(self, workloads: Collection[tuple[str, str, str]]
                       ) -> set[tuple[str, str, str]]:
        """The workloads of ``workloads`` (``(namespace, workload, workload_kind)``) that at
        least one pod in the cache belongs to (``PodRecord.workload``/``workload_kind``,
        owner walked as ``agent.k8s.cache.workload_of`` does; terminal pods count).

        All of them while the cache's pod list is not synced
        (:meth:`ClusterMetadata.live_workloads` otherwise).
        """
        if not self.cache.synced().get("pods", False):
            return set(workloads)
        return self.cache.live_workloads(workloads)

    def node(self, name: str) -> Peer | None:
        """The node ``name`` as a NODE peer (zone, region from its labels), or None."""
        rec = self.cache.node(name)
        if rec is None:
            return None
        return Peer(PeerKind.NODE, zone=rec.zone, region=rec.region, node=rec.name,
                    reason=None if rec.zone else "node_without_zone")


#: what :meth:`MetadataAdapter.resolve` answers for a Service address (see there)
_SERVICE_IP_PEER = Peer(PeerKind.UNKNOWN, reason="service_address_port_unknown")


def _ip_or_none(text: Any) -> IPAddress | None:
    try:
        return ipaddress.ip_address(text) if isinstance(text, str) else None
    except ValueError:
        return None


def _is_port(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= 65535
