"""Address and Service-port resolution for attribution, over the metadata cache.

:class:`MetadataAdapter` implements the ``MetadataView`` and ``ObjectView`` protocols of
:mod:`agent.attribution` over :class:`agent.k8s.cache.ClusterMetadata`: ``resolve()``,
``endpoint_services()``, ``service_address()`` (ClusterIPs and the other Service front
doors: NodePorts, ``spec.externalIPs``, LoadBalancer ingress IPs), ``live_services()``,
``live_workloads()`` and ``node()``. See docs/metadata.md.
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from agent.k8s.cache import ClusterMetadata
from agent.records import IPAddress, Peer, PeerKind, ServicePort


class MetadataAdapter:
    """``MetadataView`` and ``ObjectView`` (agent/attribution/join.py, agent/attribution/expiry.py) over a
    :class:`ClusterMetadata` cache.

    Args:
        cache: the metadata cache (snapshot or live watch); read only.
        veth_order: on the cgroup hook, maps a key's pod id (its ``ifindex``) to the value
            :meth:`resolve_veth` orders an address's holders by
            (:class:`agent.datapath.cgroup.PodCgroupOrder`); None: the id itself.
    """

    def __init__(self, cache: ClusterMetadata,
                 veth_order: Callable[[int], int] | None = None) -> None:
        self.cache = cache
        self._veth_order = veth_order

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

    def resolve_host_port(self, ip: IPAddress, port: int, protocol: int) -> Peer | None:
        """The host-network pod serving a node address's ``port``/``protocol`` when exactly
        one on that node declares it; see ``ClusterMetadata.resolve_host_port``."""
        return self.cache.resolve_host_port(ip, port, protocol)

    def is_entry_point(self, ip: IPAddress, port: int, protocol: int) -> bool:
        """True when ``ip`` is a node's address and ``port``/``protocol`` a node port of a
        Service with ``externalTrafficPolicy: Cluster`` there: that node's uplink counts a
        call to it as the first hop (``ClusterMetadata.entry_points`` of the node)."""
        peer = self.cache.resolve(ip)
        if peer.kind is not PeerKind.NODE or peer.node is None:
            return False
        return (ip, port, protocol) in self.cache.entry_points(peer.node)

    def host_port_target(self, ip: IPAddress, port: int, protocol: int) -> tuple[IPAddress, int] | None:
        """The pod address and ``containerPort`` a ``hostPort`` of ``ip`` leads to; see
        ``ClusterMetadata.host_port_target``."""
        return self.cache.host_port_target(ip, port, protocol)

    def resolve_veth(self, ip: IPAddress, ifindex: int, at: float, final: bool
                     ) -> tuple[Peer, bool]:
        """Resolve a local pod address by the host veth its bytes crossed (on the cgroup
        hook: by its pod cgroup, ordered by ``veth_order``); see
        ``ClusterMetadata.resolve_veth`` (``(peer, settled)``)."""
        if self._veth_order is not None:
            ifindex = self._veth_order(ifindex)
            if not ifindex:  # no pod cgroup of its own: by time
                return self.cache.resolve(ip, at), True
        return self.cache.resolve_veth(ip, ifindex, at, final)

    def endpoint_gone(self, ip: IPAddress, port: int, protocol: int) -> bool:
        """True while an endpoint no slice lists any more is kept for the grace; see
        ``ClusterMetadata.endpoint_gone``."""
        return self.cache.endpoint_gone(ip, port, protocol)

    def _is_service_ip(self, ip: IPAddress) -> bool:
        return self.cache.is_cluster_ip(ip) or ip in self.cache.door_index().service_ips

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
        (docs/metadata.md, Limits); the other doors are indexed by
        :func:`agent.k8s.services.build_door_index` from the cache's Service records,
        rebuilt when they change (a NodePort answers on any address
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
        doors = self.cache.door_index()
        if not port:
            return doors.by_addr.get((ip, protocol)) if protocol in (6, 132) else None
        sp = doors.doors.get((ip, port, protocol))
        if sp is None:
            sp = doors.nodeports.get((port, protocol))
            if sp is not None and self.cache.resolve(ip).kind is not PeerKind.NODE:
                return None
        return sp

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


