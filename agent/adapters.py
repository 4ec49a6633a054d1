"""Adapters that plug the metadata cache and the hint model into attribution.

:class:`agent.attribution.Attributor` reads the cluster through two ``typing.Protocol``s
(``MetadataView``, ``HintView``). This module implements them over the real stages:

* :class:`MetadataAdapter` over :class:`agent.k8s.cache.ClusterMetadata` (a thin
  pass-through; ``node()`` turns a ``NodeRecord`` into a NODE ``Peer``);
* :class:`HintModel` over :func:`agent.hints.evaluate_cluster`: it keeps one set of
  :class:`agent.hints.ServiceDiagnosis` per Service (one per address family) and
  re-evaluates only the Services the cache reports dirty (``ClusterMetadata.take_dirty``),
  all of them after a Node change, a relist or a snapshot load.

Dual-stack Services have one diagnosis per family; the adapter merges them (see
:meth:`HintModel.proxy_view` and :meth:`HintModel.locality`).
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from agent import records
from agent.errors import InputError
from agent.hints import DEFAULT_VERSION, KubeVersion, ServiceDiagnosis, evaluate_cluster
from agent.k8s.cache import ClusterMetadata, DirtySet, protocol_number
from agent.logs import LogOnce
from agent.records import IPAddress, Peer, PeerKind, ProxyView, ServicePort

log = logging.getLogger(__name__)

ServiceName = tuple[str, str]  # (namespace, name)


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


@dataclass(frozen=True, slots=True)
class Locality:
    """A Service's locality state (``LocalityDiagnosis`` of agent/attribution.py).

    Attributes:
        mode: requested mode (hint-model vocabulary: ``none``, ``topology-mode``,
            ``PreferClose``, ``internalTrafficPolicy-Local``, ...).
        reason: why locality is off, ``none`` when in effect in every client zone.
        in_effect: client zone -> kube-proxy in that zone filters by topology (read-only).
    """

    mode: str
    reason: str
    in_effect: Mapping[str, bool]


def merge_locality(diags: Iterable[ServiceDiagnosis]) -> Locality:
    """Merge the per-family diagnoses of one Service into one :class:`Locality`.

    A dual-stack Service has locality in a zone only when every family has it (a client
    may use either family); ``reason`` is the first family's that is not ``none``; ``mode``
    is the first family's (both families share the Service's spec).
    """
    ds = list(diags)
    mode = ds[0].mode if ds else "none"
    reason = next((d.reason for d in ds if d.reason != "none"), "none")
    zones: dict[str, bool] = {}
    for d in ds:
        for zone, on in d.locality_in_effect.items():
            zones[zone] = zones.get(zone, True) and bool(on)
    return Locality(mode, reason, MappingProxyType(dict(sorted(zones.items()))))


def merge_views(views: Iterable[ProxyView | None]) -> ProxyView | None:
    """Merge the per-family kube-proxy views of one Service on one node.

    ``selected`` is the union (addresses of both families); ``topology_mode`` is the first
    non-empty one (a family that filters by topology still selects only its own set);
    ``internal_traffic`` is the first family's. None when no family has a view.
    """
    vs = [v for v in views if v is not None]
    if not vs:
        return None
    if len(vs) == 1:
        return vs[0]
    selected: frozenset[str] = frozenset().union(*(v.selected for v in vs))
    mode = next((v.topology_mode for v in vs if v.topology_mode), "")
    return ProxyView(mode, selected, vs[0].internal_traffic)


class HintModel:
    """``HintView`` (agent/attribution.py) over :func:`agent.hints.evaluate_cluster`.

    Call :meth:`refresh` once per interval, from the agent loop; the Attributor then reads
    :meth:`proxy_view`, :meth:`services` and :meth:`locality` from the same thread.

    Args:
        cache: the metadata cache whose pruned API objects feed the model.
        version: Kubernetes minor version the model reproduces (``"1.27"`` .. ``"1.35"``).
        feature_gates: gate overrides for that version.

    Raises:
        InputError: a bad version or feature gate (``--kubernetes-version``,
            ``--feature-gates``).
    """

    def __init__(self, cache: ClusterMetadata, version: str = DEFAULT_VERSION,
                 feature_gates: Mapping[str, bool] | None = None) -> None:
        try:
            KubeVersion.parse(version, feature_gates)
        except InputError as err:
            raise err.with_source("--kubernetes-version/--feature-gates") from None
        self.cache = cache
        self.version = version
        self.feature_gates = dict(feature_gates or {})
        self._diags: dict[ServiceName, tuple[ServiceDiagnosis, ...]] = {}
        self._locality: dict[ServiceName, Locality] = {}
        self._localities: dict[records.ServiceRef, records.Locality] = {}
        self._views: dict[tuple[str, str, str], ProxyView | None] = {}
        self._once = LogOnce(log, limit=1000)
        #: objects the model skipped as malformed (cumulative)
        self.bad_objects = 0
        #: Services (re-)evaluated by the last refresh
        self.last_evaluated = 0

    def refresh(self, dirty: DirtySet | None = None, *, at: float | None = None) -> int:
        """Re-evaluate the Services that changed.

        Args:
            dirty: from ``ClusterMetadata.take_dirty()``; None or ``all=True`` re-evaluates
                every Service (zones and allocatable CPU feed every Service's hints).
            at: Unix seconds stamped as ``last_change`` on Services whose locality changed
                (or appeared) in this refresh; default ``time.time()``.

        Returns:
            number of Services evaluated.
        """
        n = self._refresh(dirty)
        self._stamp(time.time() if at is None else at)
        return n

    def _stamp(self, at: float) -> None:
        """Rebuild :meth:`localities`: a Service keeps its record (and ``last_change``)
        while ``(mode, reason, in_effect)`` is unchanged; Services gone are dropped."""
        old = self._localities
        new: dict[records.ServiceRef, records.Locality] = {}
        for (ns, name), loc in self._locality.items():
            ref = records.ServiceRef(ns, name)
            prev = old.get(ref)
            if (prev is not None and prev.mode == loc.mode and prev.reason == loc.reason
                    and dict(prev.in_effect) == dict(loc.in_effect)):
                new[ref] = prev
            else:
                new[ref] = records.Locality(loc.mode, loc.reason, loc.in_effect, at)
        self._localities = new

    def localities(self) -> Mapping[records.ServiceRef, records.Locality]:
        """Every diagnosed Service's locality with its change time (read by the exporter).

        Returns:
            ``{ServiceRef: Locality}`` as of the last :meth:`refresh` (read-only);
            ``last_change`` is the ``at`` of the refresh in which the Service's
            ``(mode, reason, in_effect)`` last changed or first appeared.
        """
        return MappingProxyType(self._localities)

    def _refresh(self, dirty: DirtySet | None) -> int:
        nodes, services, slices = self.cache.raw_objects()
        if dirty is None or dirty.all:
            diags = self._evaluate(nodes, services, slices)
            new: dict[ServiceName, list[ServiceDiagnosis]] = {}
            for d in diags:
                new.setdefault((d.namespace, d.name), []).append(d)
            self._diags = {k: tuple(v) for k, v in new.items()}
            self._locality = {k: merge_locality(v) for k, v in self._diags.items()}
            self._views = {}
            self.last_evaluated = len(self._diags)
            return self.last_evaluated
        # one evaluate_cluster call for every dirty Service: the node index (O(nodes)) is
        # built once per refresh, not once per Service
        keys = sorted(dirty.services)
        svcs: list[dict[str, Any]] = []
        svc_slices: list[dict[str, Any]] = []
        for ns, name in keys:
            svc, slices_ = self.cache.raw_service(ns, name)
            if svc is not None:
                svcs.append(svc)
                svc_slices.extend(slices_)
        got: dict[ServiceName, list[ServiceDiagnosis]] = {}
        for d in self._evaluate(nodes, svcs, svc_slices) if svcs else []:
            got.setdefault((d.namespace, d.name), []).append(d)
        for key in keys:
            mine = got.get(key)
            if mine:
                self._diags[key] = tuple(mine)
                self._locality[key] = merge_locality(mine)
            else:  # deleted, ExternalName, or malformed
                self._diags.pop(key, None)
                self._locality.pop(key, None)
        changed = set(keys)
        self._views = {k: v for k, v in self._views.items() if (k[0], k[1]) not in changed}
        self.last_evaluated = len(keys)
        return len(keys)

    def _evaluate(self, nodes: list[dict[str, Any]], services: list[dict[str, Any]],
                  slices: list[dict[str, Any]]) -> list[ServiceDiagnosis]:
        errors: list[InputError] = []
        out = evaluate_cluster(nodes, services, slices, version=self.version,
                               feature_gates=self.feature_gates, errors=errors)
        self.bad_objects += len(errors)
        for err in errors:
            text = str(err)
            self._once(text, logging.WARNING, "hint model skipped an object: %s", text)
        return out

    # ------------------------------------------------------------------ HintView

    def proxy_view(self, namespace: str, service: str, node: str) -> ProxyView | None:
        """What kube-proxy on ``node`` does with the Service's ClusterIP traffic (kube-proxy
        ``pkg/proxy/topology.go`` ``CategorizeEndpoints``), both families merged; None when
        the Service or node is unknown to the model, or the Service is headless."""
        k = (namespace, service, node)
        if k in self._views:
            return self._views[k]
        diags = self._diags.get((namespace, service), ())
        v = merge_views(d.proxy_view(node) for d in diags)
        self._views[k] = v
        return v

    def services(self) -> Iterable[tuple[str, str]]:
        """Every Service the model diagnosed, as ``(namespace, name)``, sorted."""
        return sorted(self._diags)

    def locality(self, namespace: str, service: str) -> Locality | None:
        """The Service's merged locality (same object until the Service is re-evaluated)."""
        return self._locality.get((namespace, service))

    def diagnoses(self, namespace: str, service: str) -> tuple[ServiceDiagnosis, ...]:
        """The model's per-family diagnoses of a Service (empty when unknown)."""
        return self._diags.get((namespace, service), ())
