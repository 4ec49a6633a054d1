"""Thread-safe cache of Pods, Nodes, Services and EndpointSlices as parsed records, and IP resolution.

Watch threads (:mod:`agent.k8s.watch`) or a snapshot file (:mod:`agent.k8s.snapshot`)
write; the agent loop reads. Every object is parsed once, when it arrives, by
:mod:`agent.k8s.parse`: into the cache's own records (pods by IP, node addresses and
CIDRs, Service ports and doors, slice endpoints) and, for Nodes, Services and
EndpointSlices, into the hint model's records (:meth:`ClusterMetadata.model_inputs`,
read by :class:`agent.hints.HintModel`). No API dict is kept.

Resolution order (:meth:`ClusterMetadata.resolve`):

1. a pod IP of a live (or recently deleted, within the grace) non-host-network pod: POD;
2. a node address (InternalIP, ExternalIP) or a host-network pod's IP: NODE; also the
   first address of a node's ``spec.podCIDRs`` when no pod holds it: bridge CNIs (the
   ``bridge`` plugin with host-local IPAM, flannel's ``cni0``, kubenet) give it to the
   node's bridge, the source of kubelet probes and of node-to-pod traffic. Without this
   those bytes would be ``no_pod_for_ip`` and their ingress copy skipped as a pod's
   (counted by no veth);
3. a ``--zone-cidrs`` range: CIDR, or LOAD_BALANCER (with its ``lb_type``) for a range
   marked ``kind: load-balancer``;
4. inside a node's ``spec.podCIDRs`` (or an extra pod CIDR) but no pod: UNKNOWN, reason
   ``no_pod_for_ip``;
5. anything else: EXTERNAL.

Workloads: ownerReferences are walked one level. A pod owned by a ReplicaSet whose name is
``<deployment>-<pod-template-hash>`` (the ``pod-template-hash`` label) is attributed to the
Deployment ``<deployment>``: the Deployment controller names ReplicaSets that way
(kubernetes ``pkg/controller/deployment/sync.go`` ``getNewReplicaSet``, name
``deployment.Name + "-" + podTemplateSpecHash``). ReplicaSets themselves are not watched:
RBAC grants only pods, nodes, services and endpointslices.

IP reuse (:mod:`agent.k8s.pods`): each IP keeps its tenures ``(pod, first_seen, deleted_at)``; deleted tenures stay
in a bounded :class:`cachetools.TTLCache` for ``grace_seconds`` so bytes counted just
before a pod went away (or just before its IP went to a new pod) still go to the pod that
owned the IP at that time. ``first_seen`` is when this cache learnt of the assignment (watch
latency, typically well under a second, is the error bar). Pods in phase Succeeded or
Failed release their IPs (the kubelet and CNI reuse them) even though the object remains.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cachetools import TTLCache

from agent.k8s.cidrs import KIND_LOAD_BALANCER, IPNetwork, PrefixTable, ZoneCidr
from agent.k8s.parse import (
    BAD_SHAPE,
    NO_NODE_NAME,
    BadObject,
    NodeEntry,
    NodeRecord,
    PodRecord,
    ServiceEntry,
    ServiceRecord,
    SliceEntry,
    SliceRecord,
    entry_key,
    object_key,
    parse_node,
    parse_node_entry,
    parse_pod,
    parse_service,
    parse_service_entry,
    parse_slice_entry,
    parse_slice_record,
    prune_endpointslice,
    prune_node,
    prune_service,
    slice_addresses,
    slice_service_label,
)
from agent.k8s.pods import PodTable, tagged_address_key
from agent.k8s.services import DoorIndex, EpEntry, SliceIndex, build_door_index, endpoint_key
from agent.logs import LogOnce
from agent.records import IPAddress, Peer, PeerKind, ServicePort

log = logging.getLogger(__name__)

#: resource names used for per-kind state (synced flags, generations)
RESOURCES = ("pods", "nodes", "services", "endpointslices")

ServiceKey = tuple[str, str]  # (namespace, name)

#: ``--pod-scope`` values: every agent watches every Pod, or only its own node's
#: (:attr:`MetadataSettings.pod_node`; docs/metadata.md, "Pod scope")
POD_SCOPES = ("cluster", "node")


@dataclass(frozen=True, slots=True)
class DirtySet:
    """What changed since the last :meth:`ClusterMetadata.take_dirty`.

    Attributes:
        services: Services whose Service object or EndpointSlices changed.
        all: True when every Service must be re-evaluated (a Node changed, a relist or a
            snapshot load happened).
    """

    services: frozenset[ServiceKey]
    all: bool


@dataclass
class MetadataSettings:
    """Settings of :class:`ClusterMetadata`.

    Attributes:
        grace_seconds: how long a deleted pod (or a released IP) stays resolvable.
        max_deleted: bound on remembered deleted tenures (oldest dropped first when full).
        zone_cidrs: ranges outside the cluster mapped to zones (``--zone-cidrs``).
        extra_pod_cidrs: pod ranges not declared in ``node.spec.podCIDRs`` (e.g. a VPC CNI
            subnet, ``--pod-cidrs``); unknown addresses inside them resolve to UNKNOWN, not
            EXTERNAL.
        pod_node: ``--pod-scope node``: the cache keeps only the Pods of this node (the
            watch asks for no others, a snapshot's others are dropped) and resolves other
            nodes' pod addresses through EndpointSlices and Nodes' ``spec.podCIDRs``
            (:meth:`ClusterMetadata.resolve`, docs/metadata.md "Pod scope"); None (default,
            ``--pod-scope cluster``): every Pod.
    """

    grace_seconds: float = 60.0
    max_deleted: int = 65536
    zone_cidrs: tuple[ZoneCidr, ...] = ()
    extra_pod_cidrs: tuple[IPNetwork, ...] = field(default_factory=tuple)
    pod_node: str | None = None


# ----------------------------------------------------------------------------- the cache



def _drop_older_half(memo: dict[Any, Any]) -> None:
    """Remove the first half of ``memo``'s keys in insertion order (the oldest entries)."""
    for k in list(itertools.islice(memo, len(memo) // 2)):
        del memo[k]


class ClusterMetadata:
    """Thread-safe cache of cluster metadata with IP and endpoint resolution.

    Writers: :meth:`apply` (one watch event), :meth:`replace` (a full list),
    :meth:`load_snapshot`. Readers: :meth:`resolve`, :meth:`endpoint_services`,
    :meth:`service_address`, :meth:`local_endpoints`, :meth:`model_inputs`,
    :meth:`take_dirty`, :meth:`synced`. All methods may be called from any thread.

    Args:
        settings: see :class:`MetadataSettings`.
        clock: seconds since the epoch (the same clock as the ``at`` passed to
            :meth:`resolve`); injectable for tests.
    """

    def __init__(self, settings: MetadataSettings | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.settings = settings or MetadataSettings()
        self._clock = clock
        self._lock = threading.RLock()
        # namespace -> name -> record: no (namespace, name) tuple per pod (8 MiB at 150k)
        # resolve() results per address key; entries are dropped whenever the address's
        # pod or host-network pod changes, all of them on any node change; bounded
        self._memo: dict[int, Peer] = {}
        # a node's pods reach well over 32,768 addresses in a large cluster (150,000 pods:
        # bench/bench_agent.py), and an emptied memo makes the next drain resolve every
        # address again; when full, the older half goes (insertion order), never all
        self._memo_max = 1 << 17
        self._pod_table = PodTable(self.settings.grace_seconds, self.settings.max_deleted, clock,
                                   self._memo)
        # endpoint_services() results; cleared on any Service or EndpointSlice change
        self._ep_memo: dict[int, tuple[ServicePort, ...]] = {}
        # endpoint key -> the index entries it had when its last slice dropped it, for the
        # grace (endpoint_services); a key listed again is dropped from here
        self._gone_eps: TTLCache[int, tuple[EpEntry, ...]] = TTLCache(
            maxsize=self.settings.max_deleted, ttl=self.settings.grace_seconds, timer=clock)
        self._nodes: dict[str, NodeRecord] = {}
        self._node_names: tuple[int, frozenset[str]] = (-1, frozenset())
        self._workload_nodes: dict[tuple[str, str], tuple[int, frozenset[str]]] = {}
        self._node_by_ip: dict[int, str] = {}
        #: first address of each node's podCIDRs -> node (the bridge gateway, see resolve)
        self._gateway_by_ip: dict[int, str] = {}
        # pod CIDR -> the nodes declaring it ("" for an extra pod CIDR); the table maps it
        # to its node when exactly one node declares it, else to "" (a pod range, node unknown)
        self._pod_cidr_nodes: dict[IPNetwork, list[str]] = {}
        self._pod_cidrs: PrefixTable[str] = PrefixTable()
        for net in self.settings.extra_pod_cidrs:
            self._pod_cidr_ref(net, +1, "")
        self._pod_node = self.settings.pod_node
        # --pod-scope node: EndpointSlice endpoint address key -> ((slice key, pod namespace,
        # pod name, nodeName), ...) from the endpoints' targetRef and nodeName; an address
        # no slice lists any more keeps its last entries for the grace
        self._ep_pods: dict[int, tuple[tuple[tuple[str, str], str | None, str | None, str | None], ...]] = {}
        self._gone_ep_pods: TTLCache[int, tuple[tuple[tuple[str, str], str | None, str | None, str | None], ...]] = (
            TTLCache(maxsize=self.settings.max_deleted, ttl=self.settings.grace_seconds, timer=clock))
        # slice key -> the (address key, pod namespace, pod name, nodeName) it lists
        self._ep_pods_by_slice: dict[tuple[str, str], tuple[tuple[int, str | None, str | None, str | None], ...]] = {}
        self._zone_cidrs: PrefixTable[ZoneCidr] = PrefixTable(
            (z.network, z) for z in self.settings.zone_cidrs)
        self._services: dict[ServiceKey, ServiceRecord] = {}
        self._cluster_ips: dict[int, ServiceKey] = {}
        # the hint model's records (agent.k8s.parse NodeEntry/ServiceEntry/SliceEntry), in
        # the order the objects arrived (a replaced object keeps its slot)
        self._node_entries: dict[str, NodeEntry] = {}
        self._service_entries: dict[ServiceKey, ServiceEntry] = {}
        self._doors: tuple[int, DoorIndex] | None = None  # (services generation, index)
        # node -> ((services, nodes generations), its entry points)
        self._entry_cache: dict[str, tuple[tuple[int, int], frozenset[tuple[IPAddress, int, int]]]] = {}
        self._slice_index = SliceIndex()
        self._generation: dict[str, int] = {r: 0 for r in RESOURCES}
        self._dirty: set[ServiceKey] = set()
        self._dirty_all = False
        self._synced: dict[str, bool] = {r: False for r in RESOURCES}
        self._bad: dict[str, int] = {r: 0 for r in RESOURCES}
        self._bad_once = LogOnce(log)
        # service_ports(): (generations, ports in use), and port -> when it left the set
        self._svc_ports: tuple[tuple[int, int], frozenset[int]] = ((-1, -1), frozenset())
        self._svc_ports_gone: dict[int, float] = {}
        # (node, host_network) -> (generations, endpoints with that nodeName, endpoints without nodeName)
        self._local_cache: dict[tuple[str, bool], tuple[
            tuple[int, int, int], frozenset[tuple[IPAddress, int, int]],
            tuple[tuple[int, IPAddress, tuple[tuple[int, int, str], ...]], ...]]] = {}

    # ------------------------------------------------------------------ writers

    def apply(self, resource: str, event_type: str, obj: Mapping[str, Any]) -> None:
        """Apply one watch event.

        Args:
            resource: one of :data:`RESOURCES`.
            event_type: ``ADDED``, ``MODIFIED`` or ``DELETED`` (others are ignored).
            obj: the object in API JSON shape.

        A malformed object is counted (:meth:`bad_objects`), logged once, and skipped.
        """
        with self._lock:
            try:
                if event_type in ("ADDED", "MODIFIED"):
                    if not self._upsert(resource, obj):
                        return
                elif event_type == "DELETED":
                    self._delete(resource, object_key(obj, resource))
                else:
                    return
            except BAD_SHAPE as err:
                self._count_bad(resource, obj, err)
                return
            self._generation[resource] += 1

    def replace(self, resource: str, objects: Iterable[Mapping[str, Any]], *,
                relist: bool = True) -> None:
        """Replace every object of ``resource`` with ``objects`` (a fresh list).

        Objects absent from the list are deleted (pods go to the grace cache); present
        ones are upserted, so a relist after 410 Gone repairs missed events. ``objects``
        may be a lazy iterator over list pages: it is consumed outside the lock in
        batches, so readers are not blocked while pages download and memory stays bounded
        by the page size.

        Args:
            resource: one of :data:`RESOURCES`.
            objects: the complete current list, API JSON shape.
            relist: True (a relist): every Service is marked dirty. False (a snapshot
                reload, a diff): objects equal to the cached ones are skipped, so only the
                Services whose Service or EndpointSlices changed become dirty (every
                Service when a Node changed).
        """
        seen: set[tuple[str, str]] = set()
        batch: list[Mapping[str, Any]] = []
        for obj in objects:
            batch.append(obj)
            if len(batch) >= 500:
                self._replace_batch(resource, batch, seen, relist)
                batch = []
        self._replace_batch(resource, batch, seen, relist)
        with self._lock:
            for key in [k for k in self._keys(resource) if k not in seen]:
                self._delete(resource, key)
            self._generation[resource] += 1
            if relist:
                self._dirty_all = True

    def _replace_batch(self, resource: str, batch: list[Mapping[str, Any]],
                       seen: set[tuple[str, str]], relist: bool = True) -> None:
        with self._lock:
            for obj in batch:
                try:
                    seen.add(object_key(obj, resource))
                    if not relist and self._unchanged(resource, obj):
                        continue
                    self._upsert(resource, obj)
                except BAD_SHAPE as err:
                    self._count_bad(resource, obj, err)

    def _unchanged(self, resource: str, obj: Mapping[str, Any]) -> bool:
        """True when ``obj`` would not change what the cache holds for it (diff reload)."""
        if not isinstance(obj, Mapping):
            return False
        key = object_key(obj, resource)
        if resource == "pods":
            old = self._pod_table.get(key[0], key[1])
            if old is None:
                return False
            rec = parse_pod(obj)
            return dataclasses.replace(rec, since=old.since) == old
        if resource == "nodes":
            old_n = self._nodes.get(key[1])
            return (old_n is not None and parse_node(obj) == old_n
                    and entry_key(parse_node_entry(prune_node(obj)))
                    == entry_key(self._node_entries.get(key[1])))
        if resource == "services":
            old_s = self._services.get(key)
            return (old_s is not None and parse_service(obj) == old_s
                    and entry_key(parse_service_entry(prune_service(obj)))
                    == entry_key(self._service_entries.get(key)))
        if resource == "endpointslices":
            old_e = self._slice_index.slices.get(key)
            if old_e is None:
                return False
            pruned = prune_endpointslice(obj)
            return (parse_slice_record(pruned) == old_e
                    and entry_key(parse_slice_entry(pruned)) == entry_key(self._slice_index.entries.get(key))
                    and (key in self._slice_index.service_of) == bool(slice_service_label(obj)))
        return False

    def load_snapshot(self, snap: Any, *, diff: bool = False) -> None:
        """Fill the cache from an :class:`agent.k8s.snapshot.Snapshot` and mark it synced.

        Args:
            snap: the snapshot.
            diff: a reload of a changed file (``zonemeter agent --snapshot``): objects
                equal to the cached ones are skipped, deleted pods go to the grace cache
                (late bytes and reused IPs resolve by time), and only changed Services
                become dirty. False (first load): every Service is dirty.

        Readers see the old state or the new one, never a mix (one lock held throughout).
        """
        with self._lock:
            self.replace("nodes", snap.nodes, relist=not diff)
            self.replace("services", snap.services, relist=not diff)
            self.replace("endpointslices", snap.endpointslices, relist=not diff)
            self.replace("pods", snap.pods, relist=not diff)
            for r in RESOURCES:
                self._synced[r] = True

    def set_synced(self, resource: str, synced: bool) -> None:
        """Record whether ``resource`` is in sync with the API (see :mod:`agent.k8s.watch`)."""
        with self._lock:
            self._synced[resource] = synced

    def _keys(self, resource: str) -> list[tuple[str, str]]:
        if resource == "pods":
            return self._pod_table.keys()
        if resource == "nodes":
            return [("", n) for n in self._nodes]
        if resource == "services":
            return list(self._service_entries)
        if resource == "endpointslices":
            return list(self._slice_index.slices)
        raise ValueError(f"unknown resource {resource!r}")

    def _count_bad(self, resource: str, obj: Any, err: Exception) -> None:
        self._bad[resource] = self._bad.get(resource, 0) + 1
        try:
            key = object_key(obj, resource)
        except BAD_SHAPE:
            key = ("?", "?")
        self._bad_once((resource, key), logging.WARNING, "skipping bad %s %s/%s: %s",
                       resource, key[0], key[1], err)

    def _upsert(self, resource: str, obj: Mapping[str, Any]) -> bool:
        """Add or replace one object; False when nothing the cache holds changed (a Node's
        periodic status report: kubelet ``nodeStatusReportFrequency``, 5 min, renews only
        heartbeat times, which are pruned), so no memo is dropped and no Service re-evaluated.
        """
        if not isinstance(obj, Mapping):
            raise BadObject("not an object")
        if resource in ("services", "endpointslices"):
            self._ep_memo.clear()
        if resource == "pods":
            rec_p = parse_pod(obj)
            if self._pod_node is not None and rec_p.node != self._pod_node:
                # --pod-scope node: another node's pod (a snapshot holds every pod; a
                # watch with spec.nodeName never sends one): not this cache's
                if self._pod_table.get(rec_p.namespace, rec_p.name) is None:
                    return False
                self._pod_table.delete(rec_p.namespace, rec_p.name)
                return True
            self._pod_table.upsert(rec_p)
        elif resource == "nodes":
            rec = parse_node(obj)
            node_entry = parse_node_entry(prune_node(obj))
            if self._nodes.get(rec.name) == rec and entry_key(node_entry) == entry_key(
                    self._node_entries.get(rec.name)):
                return False
            self._remove_node(rec.name)
            self._nodes[rec.name] = rec
            for ip in rec.addresses:
                self._node_by_ip[tagged_address_key(ip)] = rec.name
            self._node_entries[rec.name] = node_entry
            for net in rec.pod_cidrs:
                self._pod_cidr_ref(net, +1, rec.name)
                if net.num_addresses > 2:
                    self._gateway_by_ip[tagged_address_key(net.network_address + 1)] = rec.name
            self._memo.clear()
            self._dirty_all = True
        elif resource == "services":
            rec_s = parse_service(obj)
            svc_entry = parse_service_entry(prune_service(obj))
            key = (rec_s.namespace, rec_s.name)
            self._remove_service(key, keep_slot=True)
            self._services[key] = rec_s
            for ip in rec_s.cluster_ips:
                self._cluster_ips[tagged_address_key(ip)] = key
            self._service_entries[key] = svc_entry
            self._dirty.add(key)
        elif resource == "endpointslices":
            self._upsert_slice(obj)
        else:
            raise ValueError(f"unknown resource {resource!r}")
        return True

    def _delete(self, resource: str, key: tuple[str, str]) -> None:
        if resource in ("services", "endpointslices"):
            self._ep_memo.clear()
        if resource == "pods":
            self._pod_table.delete(key[0], key[1])
        elif resource == "nodes":
            self._remove_node(key[1])
            self._node_entries.pop(key[1], None)
            self._memo.clear()
            self._dirty_all = True
        elif resource == "services":
            self._remove_service(key)
            self._service_entries.pop(key, None)
            self._dirty.add(key)
        elif resource == "endpointslices":
            self._remove_slice(key)
        else:
            raise ValueError(f"unknown resource {resource!r}")

    # pods ------------------------------------------------------------------

    # nodes -----------------------------------------------------------------

    def _remove_node(self, name: str) -> None:
        old = self._nodes.pop(name, None)
        if old is not None:
            for ip in old.addresses:
                if self._node_by_ip.get(tagged_address_key(ip)) == name:
                    del self._node_by_ip[tagged_address_key(ip)]
            for net in old.pod_cidrs:
                self._pod_cidr_ref(net, -1, name)
                gw = tagged_address_key(net.network_address + 1)
                if self._gateway_by_ip.get(gw) == name:
                    del self._gateway_by_ip[gw]

    def _pod_cidr_ref(self, net: IPNetwork, delta: int, node: str) -> None:
        """Add (``delta`` +1) or remove (-1) ``node`` as a declarer of pod range ``net``
        (``node`` "" for an extra pod CIDR); the table holds the nets some node declares,
        mapped to that node when it is the only one, else to "". (Incremental: rebuilding
        the table on every Node event was O(nodes) per event.)"""
        names = self._pod_cidr_nodes.setdefault(net, [])
        if delta > 0:
            names.append(node)
        elif node in names:
            names.remove(node)
        if names:
            self._pod_cidrs.add(net, names[0] if len(names) == 1 else "")
        else:
            del self._pod_cidr_nodes[net]
            self._pod_cidrs.remove(net)

    # services --------------------------------------------------------------

    def _remove_service(self, key: ServiceKey, keep_slot: bool = False) -> None:
        """Drop a Service's record and ClusterIP entries (``keep_slot``: the record stays,
        about to be replaced in place, so the Services keep their order)."""
        old = self._services.get(key) if keep_slot else self._services.pop(key, None)
        if old is not None:
            for ip in old.cluster_ips:
                if self._cluster_ips.get(tagged_address_key(ip)) == key:
                    del self._cluster_ips[tagged_address_key(ip)]

    # endpointslices --------------------------------------------------------

    def _upsert_slice(self, obj: Mapping[str, Any]) -> None:
        key = object_key(obj, "endpointslices")
        svc_name = slice_service_label(obj)
        if obj.get("ports") is not None and not isinstance(obj.get("ports"), list):
            raise BadObject("ports is not a list")
        if obj.get("endpoints") is not None and not isinstance(obj.get("endpoints"), list):
            raise BadObject("endpoints is not a list")
        # everything that can fail happens before the first mutation
        pruned = prune_endpointslice(obj)
        rec = parse_slice_record(pruned)
        model_entry = parse_slice_entry(pruned)
        before = self._slice_endpoints(key)
        self._dirty.update(self._slice_index.upsert(key, svc_name, rec, model_entry))
        if self._pod_node is not None:
            self._index_ep_pods(key, _endpoint_pods(obj, rec))
        self._note_gone(before)

    def _remove_slice(self, key: tuple[str, str]) -> None:
        before = self._slice_endpoints(key)
        if self._pod_node is not None:
            self._index_ep_pods(key, None)
        skey = self._slice_index.remove(key)
        if skey is not None:
            self._dirty.add(skey)
        self._note_gone(before)

    def _index_ep_pods(self, key: tuple[str, str],
                       pods: tuple[tuple[int, str | None, str | None, str | None], ...] | None) -> None:
        """``--pod-scope node``: slice ``key`` now lists ``pods`` (``(address key, pod
        namespace, pod name, nodeName)`` each; None: the slice is gone). Its previous entries
        leave the endpoint-pod index (an address left with none keeps them for the grace),
        the new ones enter it, and the resolve memo of every address touched is dropped.
        Nothing is done when they are the same (most slice updates change conditions only)."""
        by_slice = self._ep_pods_by_slice
        old = by_slice.get(key, ())
        new = pods or ()
        if old == new:
            return
        index, memo = self._ep_pods, self._memo
        kept = {e[0] for e in new}
        for k, *_ in old:
            entries = index.get(k)
            if not entries:
                continue
            memo.pop(k, None)
            left = tuple(e for e in entries if e[0] != key)
            if left:
                index[k] = left
            else:
                del index[k]
                if k not in kept:
                    self._gone_ep_pods[k] = entries
        for k, ns, name, node in new:
            memo.pop(k, None)
            self._gone_ep_pods.pop(k, None)
            index[k] = (*index.get(k, ()), (key, ns, name, node))
        if new:
            by_slice[key] = new
        else:
            by_slice.pop(key, None)

    def _slice_endpoints(self, key: tuple[str, str]) -> dict[int, tuple[EpEntry, ...]]:
        """The endpoint-index entries of the keys slice ``key`` lists now (before a change)."""
        rec = self._slice_index.slices.get(key)
        if rec is None:
            return {}
        index = self._slice_index.endpoints
        out: dict[int, tuple[EpEntry, ...]] = {}
        for ip in slice_addresses(rec):
            for port, proto, _name in rec.ports:
                k = endpoint_key(ip, port, proto)
                entries = index.get(k)
                if entries:
                    out[k] = entries
        return out

    def _note_gone(self, before: Mapping[int, tuple[EpEntry, ...]]) -> None:
        """Remember the endpoints of ``before`` that no slice lists any more (the grace of
        :meth:`endpoint_services`); forget gone endpoints listed again."""
        index = self._slice_index.endpoints
        for k, entries in before.items():
            if k in index:
                self._gone_eps.pop(k, None)
            else:
                self._gone_eps[k] = entries

    # ------------------------------------------------------------------ readers

    def resolve(self, ip: IPAddress, at: float | None = None) -> Peer:
        """Resolve an address to a :class:`Peer` (order in the module docstring).

        Args:
            ip: the address (IPv4 or IPv6).
            at: when the bytes were counted (seconds since the epoch, cache clock); with
                IP reuse the pod that held the IP at ``at`` wins. None means now.

        Returns:
            a Peer; never raises for any address.
        """
        k = tagged_address_key(ip)
        with self._lock:
            hit = self._memo.get(k)
            if hit is not None:
                return hit
            return self._resolve(ip, k, at, True)

    def _resolve(self, ip: IPAddress, k: int, at: float | None, remote_ok: bool) -> Peer:
        """:meth:`resolve` under the lock, past the memo; ``remote_ok`` False: the address
        is this node's (its bytes crossed a local veth), so ``--pod-scope node``'s remote-pod
        rules do not apply and nothing is memoized."""
        pods = self._pod_table
        past = pods.deleted.get(k)
        owner = pods.owner_at(k, at, past)
        remote = None
        if owner is not None:
            peer = self._pod_peer(owner)
        else:
            node_name = (self._node_by_ip.get(k) or pods.hostnet_by_ip.get(k)
                         or self._gateway_by_ip.get(k))
            if node_name is not None:
                peer = self._node_peer(node_name)
            elif (remote_ok and self._pod_node is not None
                  and (remote := self._remote_pod(ip, k)) is not None):
                peer = remote
            else:
                zc = self._zone_cidrs.lookup(ip)
                if zc is not None:
                    peer = (Peer(PeerKind.LOAD_BALANCER, zone=zc.zone, region=zc.region,
                                 lb_type=zc.lb_type)
                            if zc.kind == KIND_LOAD_BALANCER else
                            Peer(PeerKind.CIDR, zone=zc.zone, region=zc.region))
                elif self._pod_cidrs.lookup(ip) is not None:
                    peer = Peer(PeerKind.UNKNOWN, reason="no_pod_for_ip")
                else:
                    peer = Peer(PeerKind.EXTERNAL)
        if remote_ok and not past and (remote is None or k not in self._gone_ep_pods):
            # the answer does not depend on ``at`` (nor on an endpoint's grace): remember it
            if len(self._memo) >= self._memo_max:
                _drop_older_half(self._memo)
            self._memo[k] = peer
        return peer

    def _remote_pod(self, ip: IPAddress, k: int) -> Peer | None:
        """``--pod-scope node``: the pod of another node an address belongs to, as far as
        EndpointSlices and Nodes tell (docs/metadata.md, "Pod scope"), or None.

        1. An endpoint address of an EndpointSlice (or one dropped within the grace): a POD
           named by the endpoint's ``targetRef`` (when it is a Pod), on its ``nodeName``
           (else on the node whose podCIDR holds the address).
        2. Inside exactly one Node's ``spec.podCIDRs``: a POD on that node, nameless.
        3. Inside a pod range no single node declares (``--pod-cidrs``) and inside a
           ``--zone-cidrs`` range: a POD in that range's zone, node unknown.

        An address of this node (by its endpoint's ``nodeName`` or this node's podCIDR) is
        never a remote pod: the watch reports every pod here, and one it has not reported
        yet is unresolved (UNKNOWN ``no_pod_for_ip``, held), as in the cluster scope.

        The zone and region are the node's (as for a watched pod), so every series that
        names no pod is what ``--pod-scope cluster`` exports for a live pod. Without a
        node of its own, a peer with neither is None here (and the address resolves on
        as in the cluster scope: UNKNOWN ``no_pod_for_ip`` inside a pod range).
        """
        hit = self._ep_pods.get(k) or self._gone_ep_pods.get(k)
        owner = self._pod_cidrs.lookup(ip)
        here = self._pod_node
        if hit:
            _key, ns, name, node = next((e for e in hit if e[3]), hit[0])
            node = node or owner or None
            if node is not None:
                # this node's pods are watched: one the watch has not reported (yet) is
                # an unresolved address here, held as in the cluster scope
                return None if node == here else self._remote_peer(node, ns if name else None, name)
        if owner:
            return None if owner == here else self._remote_peer(owner, None, None)
        if owner is not None:  # a pod range of no single node
            zc = self._zone_cidrs.lookup(ip)
            if zc is not None:
                return Peer(PeerKind.POD, zone=zc.zone, region=zc.region)
        return None

    def resolve_host_port(self, ip: IPAddress, port: int, protocol: int) -> Peer | None:
        """The pod serving ``ip:port/protocol``, when ``ip`` is a node's address (or a
        host-network pod's) and exactly one live pod on that node serves the port there: a
        host-network pod declaring it (``containerPort``/``hostPort``), or another pod's
        ``hostPort``, which the CNI's portmap plugin DNATs to that pod (its peer is then a
        POD: docs/attribution.md, "Host-network servers by port");
        :func:`agent.k8s.parse.pod_host_ports`. Else None (the address is then the node, as
        :meth:`resolve` says). Never raises.

        Declared ports are what the pod spec says, not what is listening: a pod that binds
        a port it does not declare stays ``node/NAME``, and two pods declaring one port
        (a rollout's old and new pod, ``hostPort`` clashes the scheduler normally
        prevents) leave it ambiguous, hence the node.
        """
        with self._lock:
            pod = self._host_port_owner(ip, port, protocol)
            return self._pod_peer(pod) if pod is not None else None

    def _host_port_owner(self, ip: IPAddress, port: int, protocol: int) -> PodRecord | None:
        """The one pod of the node that owns address ``ip`` declaring ``port``/``protocol``
        (``_PodTable.host_port_owner``), or None (no port, no such node, none or several
        pods). Caller holds ``_lock``."""
        if not port:
            return None
        k = tagged_address_key(ip)
        pods = self._pod_table
        node_name = self._node_by_ip.get(k) or pods.hostnet_by_ip.get(k)
        return None if node_name is None else pods.host_port_owner(node_name, port, protocol)

    def host_port_target(self, ip: IPAddress, port: int, protocol: int) -> tuple[IPAddress, int] | None:
        """Where the CNI's portmap plugin DNATs ``ip:port/protocol``: when
        :meth:`resolve_host_port` names a pod that is not host-network and declares ``port``
        as a ``hostPort``, its address of ``ip``'s family and the ``containerPort``
        (:func:`agent.k8s.parse.pod_host_port_targets`); else None. Never raises.

        Attribution asks whether that target is a Service endpoint: its node then counts the
        bytes as the Service's (the DNAT keeps the client's address), so the client's copy
        is skipped (docs/attribution.md, "Host-network servers by port").
        """
        with self._lock:
            pod = self._host_port_owner(ip, port, protocol)
            if pod is None or pod.host_network:
                return None
            target = next((t for h, pr, t in pod.host_port_targets if (h, pr) == (port, protocol)), None)
            addr = next((a for a in pod.ips if a.version == ip.version), None)
            return None if target is None or addr is None else (addr, target)

    def resolve_veth(self, ip: IPAddress, ifindex: int, at: float, final: bool = True
                     ) -> tuple[Peer, bool]:
        """Resolve a local address whose bytes the host veth ``ifindex`` carried.

        Args:
            ip: the local address (a pod of this node).
            ifindex: the veth's interface index (:attr:`agent.records.FlowDelta.ifindex`).
            at: when the bytes were drained (seconds since the epoch, cache clock).
            final: no later retry: bind the likeliest pod rather than report unsettled.

        Returns:
            ``(peer, settled)``: the pod whose veth it is (``PodTable.veth_owner``), or
            :meth:`resolve` when no pod held the address within the grace period;
            ``settled`` False when the veth's pod is not known yet (the peer is then the
            holder at ``at``, and nothing was bound). Never raises.
        """
        k = tagged_address_key(ip)
        with self._lock:
            pod, settled = self._pod_table.veth_owner(k, ifindex, at, final)
            if pod is not None:
                return self._pod_peer(pod), settled
            if self._pod_node is None:
                return self.resolve(ip, at), True
            return self._resolve(ip, k, at, False), True

    def _pod_peer(self, pod: PodRecord) -> Peer:
        zone = region = None
        reason = None
        if pod.node is None:
            reason = "pod_without_node"
        else:
            node = self._nodes.get(pod.node)
            if node is None:
                reason = "node_not_in_cache"
            else:
                zone, region = node.zone, node.region
                if zone is None:
                    reason = "node_without_zone"
        return Peer(PeerKind.POD, zone=zone, region=region, node=pod.node,
                    namespace=pod.namespace, name=pod.name, workload=pod.workload,
                    workload_kind=pod.workload_kind, host_network=pod.host_network,
                    reason=reason)

    def _remote_peer(self, node: str, namespace: str | None, name: str | None) -> Peer:
        """A pod of another node known by its address only (``--pod-scope node``): its
        node's zone and region, as :meth:`_pod_peer` gives a watched pod; no workload."""
        rec = self._nodes.get(node)
        zone = rec.zone if rec is not None else None
        reason = None if zone is not None else (
            "node_not_in_cache" if rec is None else "node_without_zone")
        return Peer(PeerKind.POD, zone=zone, region=rec.region if rec is not None else None,
                    node=node, namespace=namespace, name=name, reason=reason)

    def _node_peer(self, name: str) -> Peer:
        node = self._nodes.get(name)
        if node is None:
            return Peer(PeerKind.NODE, node=name, reason="node_not_in_cache")
        return Peer(PeerKind.NODE, zone=node.zone, region=node.region, node=name,
                    reason=None if node.zone is not None else "node_without_zone")

    def pod_at(self, ip: IPAddress, at: float | None = None) -> PodRecord | None:
        """Return the (non-host-network) pod holding ``ip`` at ``at`` (see :meth:`resolve`)."""
        with self._lock:
            k = tagged_address_key(ip)
            return self._pod_table.owner_at(k, at, self._pod_table.deleted.get(k))

    def node_of(self, ip: IPAddress, at: float | None = None) -> str | None:
        """Return the node name an address lives on (pod's node, or the node itself)."""
        peer = self.resolve(ip, at)
        return peer.node if peer.kind in (PeerKind.POD, PeerKind.NODE) else None

    def zone_of(self, ip: IPAddress, at: float | None = None) -> str | None:
        """Return the zone of an address (pod's node, node, or zone CIDR), or None."""
        return self.resolve(ip, at).zone

    def node(self, name: str) -> NodeRecord | None:
        """Return the cached Node record, or None."""
        with self._lock:
            return self._nodes.get(name)

    def node_names(self) -> frozenset[str]:
        """Return the names of the cached Nodes (memoized per Node generation)."""
        with self._lock:
            gen = self._generation["nodes"]
            if self._node_names[0] != gen:
                self._node_names = (gen, frozenset(self._nodes))
            return self._node_names[1]

    def workload_nodes(self, namespace: str, pod: str) -> frozenset[str] | None:
        """The nodes running a pod of the workload pod ``namespace/pod`` belongs to (its
        DaemonSet, for an agent): pods of that namespace with the same workload and kind,
        not terminal, scheduled and holding an address (``status.podIPs``: their sandbox
        runs; a pod that never started, on a node that cannot run it, has none). None when
        the pod is not cached, and with ``--pod-scope node`` (this cache holds one node's
        pods: the workload's other nodes are unknown). Memoized per pod generation; scans
        one namespace.
        """
        if self._pod_node is not None:
            return None
        with self._lock:
            gen = self._generation["pods"]
            hit = self._workload_nodes.get((namespace, pod))
            if hit is not None and hit[0] == gen:
                return hit[1]
            me = self._pod_table.get(namespace, pod)
            if me is None:
                return None
            nodes = frozenset(
                r.node for r in self._pod_table.by_name.get(namespace, {}).values()
                if r.workload == me.workload and r.workload_kind == me.workload_kind
                and r.node is not None and r.ips and not r.terminal)
            self._workload_nodes = {(namespace, pod): (gen, nodes)}
            return nodes

    def node_zone(self, name: str) -> str | None:
        """Return the zone label of a node, or None (unknown node or no label)."""
        with self._lock:
            rec = self._nodes.get(name)
            return rec.zone if rec is not None else None

    def service(self, namespace: str, name: str) -> ServiceRecord | None:
        """Return the cached Service record, or None."""
        with self._lock:
            return self._services.get((namespace, name))

    def live_workloads(self, workloads: Iterable[tuple[str, str, str]]
                       ) -> set[tuple[str, str, str]]:
        """The workloads of ``workloads`` (``(namespace, workload, workload_kind)``, as in
        :class:`PodRecord`) that at least one cached pod belongs to (terminal pods count).

        A kind-``Pod`` workload is one lookup; the others scan the pods of their
        namespace, once per namespace per call.
        """
        with self._lock:
            return self._pod_table.live_workloads(set(workloads))

    def endpoint_services(self, ip: IPAddress, port: int, protocol: int) -> tuple[ServicePort, ...]:
        """Return the Service ports an endpoint ``ip:port/protocol`` serves.

        ``port`` is the endpoint (target) port as in EndpointSlice ``ports[].port``. Each
        slice port maps back to the Service port with the same name (EndpointSlice
        controller: ``pkg/controller/endpointslice`` ``getEndpointPorts`` copies the
        Service port's name), via the slice's ``kubernetes.io/service-name`` label. If the
        Service is not cached (yet), the slice port is reported with ``port`` 0.

        An endpoint that no EndpointSlice lists any more keeps its Service ports for
        ``grace_seconds`` after its last slice dropped it, as a deleted pod's address
        keeps its pod: the agent drains and attributes after the watch delivered the
        change, so bytes the kernel counted while the endpoint was listed (the pod's last
        exchanges, served while kube-proxy stops sending to it) are attributed after it
        went (docs/attribution.md, "Endpoints just removed").

        Returns:
            ServicePort records, sorted, without duplicates; empty when not an endpoint
            (nor one within the grace).
        """
        ek = endpoint_key(ip, port, protocol)
        with self._lock:
            hit = self._ep_memo.get(ek)
            if hit is not None:
                return hit
            entries = self._slice_index.endpoints.get(ek, ())
            if not entries:
                gone = self._gone_eps.get(ek)
                if gone:  # not memoized: the grace runs out by time
                    return self._service_ports(gone, port, protocol)
            result = self._service_ports(entries, port, protocol)
            if len(self._ep_memo) >= self._memo_max:
                _drop_older_half(self._ep_memo)
            self._ep_memo[ek] = result
            return result

    def endpoint_gone(self, ip: IPAddress, port: int, protocol: int) -> bool:
        """True when no EndpointSlice lists the endpoint now but one did within the grace
        (:meth:`endpoint_services` still answers for it)."""
        ek = endpoint_key(ip, port, protocol)
        with self._lock:
            return ek not in self._slice_index.endpoints and bool(self._gone_eps.get(ek))

    def _service_ports(self, entries: Iterable[EpEntry], port: int, protocol: int
                       ) -> tuple[ServicePort, ...]:
        """The Service ports of endpoint-index ``entries`` (sorted, without duplicates)."""
        out: set[ServicePort] = set()
        for _slice, ns, svc, port_name in entries:
            rec = self._services.get((ns, svc))
            svc_port = 0
            if rec is not None:
                for sp in rec.ports:
                    if sp.name == port_name and sp.protocol == protocol:
                        svc_port = sp.port
                        break
            out.add(ServicePort(ns, svc, svc_port, port_name, port, protocol))
        return tuple(sorted(out, key=lambda s: (s.namespace, s.service, s.port, s.port_name)))

    def service_address(self, ip: IPAddress, port: int, protocol: int) -> ServicePort | None:
        """Return the Service port behind a ClusterIP ``ip:port/protocol`` (client-side copy).

        ``target_port`` is the numeric targetPort, or 0 when the Service names a container
        port (the number differs per endpoint). None when not a ClusterIP:port.
        """
        with self._lock:
            key = self._cluster_ips.get(tagged_address_key(ip))
            if key is None:
                return None
            rec = self._services.get(key)
            if rec is None:
                return None
            for sp in rec.ports:
                if sp.port == port and sp.protocol == protocol:
                    return ServicePort(rec.namespace, rec.name, sp.port, sp.name,
                                       sp.target_port, protocol)
            return None

    def entry_points(self, node_name: str) -> frozenset[tuple[IPAddress, int, int]]:
        """The entry addresses of node ``node_name`` whose first hop its uplinks count
        (docs/datapath.md, "The first hop of a node port"): for every Service with
        ``externalTrafficPolicy: Cluster`` (the API's default), each of the Node's
        addresses (InternalIP, ExternalIP) with each ``nodePort``, and each externalIP and
        LoadBalancer ingress IP with each Service port. kube-proxy DNATs (and masquerades)
        what arrives there to any endpoint (``pkg/proxy`` ``KUBE-NODEPORTS``/``KUBE-EXT-*``,
        ``externalPolicyLocal`` false), so the receiving node is the only one that sees the
        hop. Services with ``externalTrafficPolicy: Local`` are left out: their endpoint
        sees the client itself, one hop. Memoized per Service and Node generation.

        Returns:
            ``{(address, port, IP protocol number)}``, port in host byte order; empty for a
            node the cache does not know (its addresses are unknown).
        """
        with self._lock:
            gen = (self._generation["services"], self._generation["nodes"])
            hit = self._entry_cache.get(node_name)
            if hit is not None and hit[0] == gen:
                return hit[1]
            node = self._nodes.get(node_name)
            out: set[tuple[IPAddress, int, int]] = set()
            for svc in self._services.values():
                if svc.external_local:
                    continue
                for p in svc.ports:
                    if p.node_port and node is not None:
                        out.update((a, p.node_port, p.protocol) for a in node.addresses)
                    out.update((a, p.port, p.protocol) for a in svc.external_ips + svc.lb_ips)
            result = frozenset(out)
            self._entry_cache[node_name] = (gen, result)
            return result

    def door_index(self) -> DoorIndex:
        """The NodePort / externalIP / LoadBalancer IP index of the cached Services
        (:func:`agent.k8s.services.build_door_index`), rebuilt after Service changes."""
        with self._lock:
            gen = self._generation["services"]
            if self._doors is None or self._doors[0] != gen:
                self._doors = (gen, build_door_index(self._services.values()))
            return self._doors[1]

    def is_cluster_ip(self, ip: IPAddress) -> bool:
        """True when ``ip`` is some Service's ClusterIP (any port)."""
        with self._lock:
            return tagged_address_key(ip) in self._cluster_ips

    def service_ports(self) -> frozenset[int]:
        """Return every port some Service in the cluster uses, any protocol: each
        ``spec.ports[].port`` and numeric ``targetPort`` of every Service, and each port
        of every EndpointSlice (a named ``targetPort`` resolved per endpoint). A port that
        left the set stays in it for ``grace_seconds`` after the first call that saw it
        gone (as a removed endpoint keeps its Service: the last exchanges of a deleted
        Service still carry its port).

        For the datapath's ``ZM_PORT_SERVICE`` bits (``Datapath.set_service_ports``):
        where a non-Service key keeps a port that may be a server's (docs/datapath.md,
        "Late endpoints"). Memoized per Service and EndpointSlice generation.

        Returns:
            Port numbers, host order.
        """
        with self._lock:
            gen = (self._generation["services"], self._generation["endpointslices"])
            now = self._clock()
            old_gen, old = self._svc_ports
            if old_gen != gen:
                ports: set[int] = set()
                for rec in self._services.values():
                    for sp in rec.ports:
                        ports.add(sp.port)
                        if sp.target_port:
                            ports.add(sp.target_port)
                for sl in self._slice_index.slices.values():
                    for port, _proto, _name in sl.ports:
                        ports.add(port)
                ports.discard(0)
                current = frozenset(ports)
                for port in old - current:
                    self._svc_ports_gone[port] = now
                for port in current:
                    self._svc_ports_gone.pop(port, None)
                self._svc_ports = (gen, current)
            grace = self.settings.grace_seconds
            for port in [p for p, t in self._svc_ports_gone.items() if now - t > grace]:
                del self._svc_ports_gone[port]
            current = self._svc_ports[1]
            return current.union(self._svc_ports_gone) if self._svc_ports_gone else current

    def local_endpoints(self, node_name: str, host_network: bool = False
                        ) -> frozenset[tuple[IPAddress, int, int]]:
        """Return this node's Service endpoints for the datapath's endpoint map.

        An endpoint counts when its ``nodeName`` is ``node_name``, or it has no
        ``nodeName`` (a hand-written or mirrored slice) and a live pod on ``node_name``
        holds its address, and it is ready or serving (a nil condition counts as true, as
        the EndpointSlice API defines).
        FQDN addresses, slices without a service-name label, and host-network endpoints
        (a node address or a host-network pod's IP: they have no veth, so docs/attribution.md counts
        their traffic on the client side) are skipped, unless ``host_network``: the cgroup
        hook sees their sockets, so they are counted at this node as server
        (docs/attribution.md, "The socket view"). Memoized per EndpointSlice generation
        (and Node and host-network pod changes).

        Returns:
            ``{(address, target port, IP protocol number)}``, port in host byte order.
        """
        with self._lock:
            gen = (self._generation["endpointslices"], self._generation["nodes"], self._pod_table.hostnet_gen)
            hit = self._local_cache.get((node_name, host_network))
            if hit is None or hit[0] != gen:
                out: set[tuple[IPAddress, int, int]] = set()
                nodeless: list[tuple[int, IPAddress, tuple[tuple[int, int, str], ...]]] = []
                for key, sl in self._slice_index.slices.items():
                    if key not in self._slice_index.service_of:
                        continue
                    ports = sl.ports
                    if not ports:
                        continue
                    for ip in slice_addresses(sl, node_name):
                        k = tagged_address_key(ip)
                        if not host_network and (k in self._node_by_ip
                                                 or k in self._pod_table.hostnet_by_ip):
                            continue  # host-network endpoint: no veth, counted client-side
                        for port, proto, _name in ports:
                            out.add((ip, port, proto))
                    for ip in slice_addresses(sl, NO_NODE_NAME):
                        nodeless.append((tagged_address_key(ip), ip, ports))
                hit = self._local_cache[(node_name, host_network)] = (gen, frozenset(out),
                                                                      tuple(nodeless))
            _, result, nodeless_eps = hit
            if not nodeless_eps:
                return result
            # endpoints without nodeName (hand-written or mirrored slices): local when a
            # live pod on this node holds the address; looked up per call, pods change
            extra = {(ip, port, proto) for k, ip, ports in nodeless_eps
                     if (pod := self._pod_table.live_by_ip.get(k)) is not None and pod.node == node_name
                     and (host_network or not pod.host_network) for port, proto, _name in ports}
            return result | extra if extra else result

    def pod_scope_problems(self) -> list[str]:
        """``--pod-scope node``: why other nodes' pod addresses may resolve wrongly here
        (docs/metadata.md, "Pod scope"); empty in the cluster scope or when none is seen.

        Node scope tells a remote pod by its address: inside the Node ``spec.podCIDRs``
        (or ``--pod-cidrs``) that holds it. This checks what one agent can see, its own
        pods: none of them may lie outside every pod range (another node's pod there would
        read as external, both directions counted here and its egress at its node) or inside
        a range some other node declares (its pods would read as that node's: the CNI does
        not allocate from podCIDRs, e.g. Calico IPAM).

        A local pod serving a ``hostPort`` (not host-network) is reported too: another
        node's agent in the node scope does not know it, reads ``node:hostPort`` as the
        node, and counts the replies that come back through it as well as this node counts
        the pod's egress (docs/metadata.md, "Pod scope").

        Returns:
            One line per problem, e.g. ``"pod shop/web-1 10.0.9.4: inside node n2's
            podCIDRs, not this node's"`` or ``"pod jobs/cache-x serves hostPort 16379/6:
            ..."``; ``"no pod range: ..."`` when no Node declares podCIDRs and no extra pod
            range is set.
        """
        here = self._pod_node
        if here is None:
            return []
        with self._lock:
            if not self._pod_cidr_nodes:
                return ["no pod range: no Node declares spec.podCIDRs and no --pod-cidrs is "
                        "given, so other nodes' pods cannot be told from external addresses"]
            out = []
            for names in self._pod_table.by_name.values():
                for rec in names.values():
                    if rec.host_network or rec.terminal:
                        continue
                    for port, proto in rec.host_ports:
                        out.append(f"pod {rec.namespace}/{rec.name} serves hostPort {port}/{proto}: "
                                   "other nodes' agents count its replies twice in the node scope")
                    for ip in rec.ips:
                        owner = self._pod_cidrs.lookup(ip)
                        if owner is None:
                            out.append(f"pod {rec.namespace}/{rec.name} {ip}: outside every pod range: "
                                       "other nodes' pods may read as external")
                        elif owner and owner != here:
                            out.append(f"pod {rec.namespace}/{rec.name} {ip}: inside node {owner}'s "
                                       "podCIDRs, not this node's: other nodes' pods may resolve to "
                                       "the wrong node and zone")
            return out

    def model_inputs(self) -> tuple[list[NodeEntry], list[ServiceEntry], list[SliceEntry]]:
        """Return ``(nodes, services, endpointslices)`` as the hint model's parsed entries
        (:func:`agent.hints.evaluate_parsed` input), in arrival order.

        Entries are immutable records (or the InputError their object raised), parsed
        once when the object arrived.
        """
        with self._lock:
            return (list(self._node_entries.values()), list(self._service_entries.values()),
                    list(self._slice_index.entries.values()))

    def node_entry(self, name: str) -> NodeEntry | None:
        """Return one Node's hint-model entry (see :meth:`model_inputs`), or None."""
        with self._lock:
            return self._node_entries.get(name)

    def service_inputs(self, namespace: str, name: str) -> tuple[ServiceEntry | None, list[SliceEntry]]:
        """Return ``(service, its endpointslices)`` entries (slices sorted by
        ``(namespace, name)``), for re-evaluating one dirty Service; None when the Service
        is not cached."""
        with self._lock:
            key = (namespace, name)
            index = self._slice_index
            slices = [index.entries[k] for k in sorted(index.by_service.get(key, ()))]
            return self._service_entries.get(key), slices

    def take_dirty(self) -> DirtySet:
        """Return and clear the Services changed since the previous call."""
        with self._lock:
            out = DirtySet(frozenset(self._dirty), self._dirty_all)
            self._dirty = set()
            self._dirty_all = False
            return out

    def released(self) -> int:
        """Return a counter that increases whenever a pod gives up an address (deleted,
        terminal, address changed, or another pod took it): the agent drains soon after,
        so the old owner's last bytes are attributed before the address can be reused."""
        with self._lock:
            return self._pod_table.released

    def generation(self, resource: str) -> int:
        """Return a counter that increases on every change to ``resource``."""
        with self._lock:
            return self._generation[resource]

    def synced(self) -> dict[str, bool]:
        """Return ``{resource: in sync}`` for the four resources."""
        with self._lock:
            return dict(self._synced)

    def bad_objects(self) -> dict[str, int]:
        """Return ``{resource: objects skipped as malformed}``."""
        with self._lock:
            return dict(self._bad)

    def counts(self) -> dict[str, int]:
        """Return object counts: pods, nodes, services, endpointslices, deleted_ips."""
        with self._lock:
            return {"pods": self._pod_table.count, "nodes": len(self._nodes),
                    "services": len(self._services), "endpointslices": len(self._slice_index.slices),
                    "deleted_ips": len(self._pod_table.deleted)}


def _endpoint_pods(obj: Mapping[str, Any], rec: SliceRecord
                   ) -> tuple[tuple[int, str | None, str | None, str | None], ...]:
    """``(address key, pod namespace, pod name, nodeName)`` of every IP address of an
    EndpointSlice's endpoints: the addresses and ``nodeName`` as ``rec`` (its
    :func:`agent.k8s.parse.parse_slice_record`, endpoint for endpoint) parsed them, the pod from
    the raw object's ``targetRef`` of kind Pod (None, None without one). Never raises."""
    out: list[tuple[int, str | None, str | None, str | None]] = []
    if not rec.endpoints:
        return ()
    raw = [ep for ep in obj.get("endpoints") or () if isinstance(ep, dict)]
    default_ns = object_key(obj)[0]
    for ep, (node, _usable, ips) in zip(raw, rec.endpoints, strict=False):
        ref = ep.get("targetRef")
        ns = name = None
        if isinstance(ref, Mapping) and ref.get("kind", "Pod") == "Pod" and isinstance(ref.get("name"), str):
            name = ref["name"]
            rns = ref.get("namespace")
            ns = sys.intern(rns) if isinstance(rns, str) and rns else default_ns
        nn = node if isinstance(node, str) and node and node != NO_NODE_NAME else None
        for ip in ips:
            out.append((tagged_address_key(ip), ns, name, nn))
    return tuple(out)
