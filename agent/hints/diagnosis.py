"""Diagnosis: why a Service does or does not keep ClusterIP traffic in its zone, for a whole cluster.

:func:`evaluate_cluster` parses Nodes, Services and EndpointSlices (API JSON shape), runs the
controller (:mod:`agent.hints.controller`) and kube-proxy (:mod:`agent.hints.proxy`) per
Service and address family, and names one reason and any warnings (vocabulary in
docs/hints.md).

Cost: node aggregation and the zone index are computed once per cluster; per Service the
work is O(endpoints).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.errors import InputError
from agent.hints.controller import (
    AddressHints,
    ClusterIndex,
    ControllerResult,
    address_families,
    close_values,
    effective_annotation,
    hints_enabled,
    index_node_infos,
    minimum_accepted_endpoints,
    norm_hints,
    reconcile,
    valid_traffic_distribution,
)
from agent.hints.proxy import ProxyDecision, ProxyIndex, ProxyMap, proxy_blocked, proxy_gates_off
from agent.hints.versions import DEFAULT_VERSION, KubeVersion, covered_version
from agent.hints.vocabulary import (
    ANNOTATION_DEPRECATED,
    ANNOTATION_TOPOLOGY_MODE,
    EXPECTED_CROSS_ZONE_WARN,
    REASON_SENTENCES,
    UNKNOWN_ZONE,
)
from agent.k8s.parse import (
    LABEL_SERVICE_NAME,
    LABEL_ZONE,
    Endpoint,
    Hints,
    NodeEntry,
    NodeInfo,
    ServiceEntry,
    ServiceInfo,
    Slice,
    SliceEntry,
    hints_json,
    parse_node_entry,
    parse_service_entry,
    parse_slice_entry,
)
from agent.records import ProxyView


@dataclass(frozen=True, slots=True)
class DiagnosisWarning:
    """A diagnosis warning: a stable ``code`` (see WARNING_CODES) and a one-line message."""

    code: str
    message: str

    def to_json(self) -> dict[str, str]:
        """``{"code", "message"}``."""
        return {"code": self.code, "message": self.message}


class EndpointZones(Mapping[str, str]):
    """Read-only ``ip:port -> zone`` of a Service's endpoints as kube-proxy keeps them, built
    on first access (the agent keeps every diagnosis; only explain reads this).

    The zone is the endpoint's ``zone``, else its node's zone label, else ``""``.
    """

    __slots__ = ("_keys", "_eps", "_node_zone", "_map")

    def __init__(self, keys: Sequence[str], eps: Sequence[Endpoint], node_zone: Mapping[str, str]) -> None:
        self._keys, self._eps, self._node_zone = keys, eps, node_zone
        self._map: dict[str, str] | None = None

    def build(self) -> dict[str, str]:
        """A new ``ip:port -> zone`` dict (not cached)."""
        nz = self._node_zone
        return {k: e.zone or (nz.get(e.node, "") if e.node else "")
                for k, e in zip(self._keys, self._eps, strict=False)}

    def _get(self) -> dict[str, str]:
        if self._map is None:
            self._map = self.build()
        return self._map

    def __getitem__(self, key: str) -> str:
        return self._get()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._get())

    def __len__(self) -> int:
        return len(self._get())


@dataclass(frozen=True, slots=True)
class ClientGroup:
    """Nodes of one client zone whose kube-proxy makes the same decision for a Service.

    Attributes:
        zone: the client zone (``"unknown"`` for nodes without a zone label).
        nodes: how many nodes of the zone share the decision.
        sample: up to 5 of their names.
        kube_proxy: ``"1.X"`` when these nodes run another kube-proxy version than the
            common one, else None.
        topology_mode: as :attr:`ProxyDecision.topology_mode`.
        internal_traffic: ``cluster``, ``local``, ``DROP`` or ``REJECT``.
        endpoints: ``ip:port`` of the endpoints ClusterIP traffic from these nodes goes to
            (empty for DROP/REJECT); their zones are in
            :attr:`ServiceDiagnosis.endpoint_zones`.
        cross_zone_share: share (0..1) of these nodes' calls that leave their zone, with
            equal weight per selected endpoint (kube-proxy picks one at random: iptables
            ``statistic --mode random``, nftables ``numgen random``); an endpoint of unknown
            zone counts as crossing. 0 for ``local`` (the endpoint is on the node); None
            for DROP/REJECT (no call is delivered) and for the ``unknown`` client zone.
    """

    zone: str
    nodes: int
    sample: tuple[str, ...]
    kube_proxy: str | None
    topology_mode: str | None
    internal_traffic: str
    endpoints: tuple[str, ...]
    cross_zone_share: float | None

    def to_json(self) -> dict[str, Any]:
        """One element of ``client_zones[zone]`` in the explain JSON."""
        return {"nodes": self.nodes, "sample": list(self.sample), "kube_proxy_version": self.kube_proxy,
                "topology_mode": self.topology_mode, "internal_traffic": self.internal_traffic,
                "endpoints": list(self.endpoints),
                "cross_zone_share": self.cross_zone_share}


@dataclass(slots=True)
class ServiceDiagnosis:
    """Why one Service (one address family) does or does not keep traffic in its zone.

    Attributes:
        namespace, name: the Service.
        address_type: ``IPv4`` or ``IPv6``.
        mechanism: see :class:`ControllerResult`.
        mode: short label for metrics: ``internalTrafficPolicy-Local`` (iTP Local wins for
            ClusterIP traffic), ``topology-mode`` (effective annotation is Auto/auto),
            the ``spec.trafficDistribution`` value (``PreferClose``, ``PreferSameZone``,
            ``PreferSameNode``; also when not accepted), else ``none``. It says what was
            requested; ``reason`` says whether it works.
        reason: one of :data:`REASONS` (``none`` = locality in effect in every client zone).
        locality_in_effect: client zone -> True when kube-proxy on every node of that zone
            filters ClusterIP traffic by topology. Zones of Ready nodes only; Ready nodes
            without a zone label count under ``"unknown"``.
        warnings: list of :class:`DiagnosisWarning`.
        controller: what the controller would write next (:class:`ControllerResult`).
        observed_hints: address -> hints the slices carry now (all slices, as kube-proxy merges).
        proxy: node -> :class:`ProxyDecision` for every node in the input (lazy mapping).
        service_port: the port used in ``ip:port`` strings (endpoint port of the
            Service's first port), or None.
        headless: the Service has no ClusterIP (no kube-proxy decision, no client groups).
        locality_scope: client zone -> ``node`` (every node of the zone keeps ClusterIP
            traffic on the node: internalTrafficPolicy Local, or PreferSameNode with a
            node-hinted endpoint on each node), ``zone`` (every node keeps it in the zone,
            by zone hints or node hints), ``off``; same zones as ``locality_in_effect``
            (``off`` exactly where it is False).
        expected_cross_zone: client zone -> share (0..1) of the zone's ClusterIP calls that
            cross zones under the current hints and kube-proxy decisions: the average of
            :attr:`ClientGroup.cross_zone_share` over the zone's nodes, each node weighing
            the same (nodes that DROP or REJECT are left out); None when no node of the
            zone delivers a call, or for the ``unknown`` zone. Zones of ``locality_in_effect``.
        client_groups: the kube-proxy decisions per client zone (:class:`ClientGroup`),
            zones in sorted order.
        donations: ``(address, endpoint zone, zone it is hinted for)`` of each ready
            endpoint the controller hints for another zone than its own (Auto only).
        endpoint_zones: ``ip:port`` -> zone of every endpoint kube-proxy keeps (the
            endpoint's ``zone``, else its node's zone label, else ``""``).
    """

    namespace: str
    name: str
    address_type: str
    mechanism: str
    mode: str
    reason: str
    locality_in_effect: dict[str, bool]
    warnings: list[DiagnosisWarning]
    controller: ControllerResult
    observed_hints: Mapping[str, Hints | None]
    proxy: Mapping[str, ProxyDecision]
    service_port: int | None = None
    headless: bool = False
    locality_scope: dict[str, str] = field(default_factory=dict)
    expected_cross_zone: dict[str, float | None] = field(default_factory=dict)
    client_groups: list[ClientGroup] = field(default_factory=list)
    donations: tuple[tuple[str, str, str], ...] = ()
    endpoint_zones: Mapping[str, str] = field(default_factory=dict)

    @property
    def reason_sentence(self) -> str:
        """The plain sentence of :attr:`reason` (:data:`agent.hints.REASON_SENTENCES`)."""
        return REASON_SENTENCES.get(self.reason, "")

    def proxy_view(self, node: str) -> ProxyView | None:
        """What kube-proxy on ``node`` does with this Service's ClusterIP traffic.

        Returns:
            ProxyView (``selected`` = endpoint addresses, empty for DROP/REJECT), or None
            when the node is not in the input or the Service is headless.
        """
        if self.headless:
            return None
        d = self.proxy.get(node)
        return None if d is None else d.view()

    def to_json(self, nodes: Sequence[str] | None = None) -> dict[str, Any]:
        """The ``services[]`` element of the explain JSON (``nodes`` limits ``proxy``)."""
        c = self.controller
        keys = list(self.proxy) if nodes is None else [n for n in nodes if n in self.proxy]
        return {
            "namespace": self.namespace,
            "name": self.name,
            "address_type": self.address_type,
            "mechanism": self.mechanism,
            "controller": {
                "hints_enabled": c.hints_enabled,
                "events": [e.to_json() for e in c.events],
                "zone_cpu_ratios": None if c.zone_cpu_ratios is None else dict(c.zone_cpu_ratios),
                "ready_endpoints": c.ready_endpoint_count,
                "minimums": None if c.minimums is None else dict(c.minimums),
                "sum_of_minimums": c.sum_of_minimums,
                "allocations": None if c.allocations is None
                else {z: a.to_json() for z, a in c.allocations.items()},
                "hinted_per_zone": hinted_per_zone(c.hints) if c.hints_enabled else None,
                "donations": [{"address": a, "zone": z, "for_zone": to} for a, z, to in self.donations],
                "hints": {a: hints_json(h) for a, h in c.hints.items()},
            },
            "observed_hints": {a: hints_json(h) for a, h in self.observed_hints.items()},
            "proxy": {n: self.proxy[n].to_json() for n in keys},
            "locality_in_effect": dict(self.locality_in_effect),
            "locality_scope": dict(self.locality_scope),
            "expected_cross_zone": dict(self.expected_cross_zone),
            "client_zones": client_zones_json(self.client_groups),
            "endpoint_zones": dict(self.endpoint_zones),
            "reason": self.reason,
            "reason_sentence": self.reason_sentence,
            "warnings": [w.to_json() for w in self.warnings],
        }


def hinted_per_zone(hints: Mapping[str, Hints | None]) -> dict[str, int]:
    """Zone -> number of endpoints whose zone hints name it (``hints`` as
    :attr:`ControllerResult.hints`), zones sorted."""
    out: dict[str, int] = {}
    for h in hints.values():
        if h is not None:
            for z in h.for_zones:
                out[z] = out.get(z, 0) + 1
    return dict(sorted(out.items()))


def client_zones_json(groups: Sequence[ClientGroup]) -> dict[str, list[dict[str, Any]]]:
    """``client_zones`` of the explain JSON: zone -> its :class:`ClientGroup` objects."""
    out: dict[str, list[dict[str, Any]]] = {}
    for g in groups:
        out.setdefault(g.zone, []).append(g.to_json())
    return out


@dataclass(frozen=True, slots=True)
class ProxyVersions:
    """The kube-proxy version the model judges each node with.

    Attributes:
        base: the version of every node not in ``by_node``: the ``--kube-proxy-version``
            override, else the control plane's (with the user's feature gates).
        by_node: node -> version (that version's gate defaults; the user's
            ``--feature-gates`` apply to the control-plane version only) for the nodes whose
            reported kube-proxy minor differs from ``base``.
        by_zone: client zone -> minor -> names of the ``by_node`` nodes there.
        notes: ``(reported text, sentence)`` for each reported version outside the covered
            range (clamped) or unreadable (judged as ``base``), one per distinct text.
        override: True when ``--kube-proxy-version`` set ``base`` for every node.
        minor_by_node: ``by_node``'s minors (node -> minor), built once per evaluation and
            shared by every Service's :class:`ProxyMap` (one dict per Service would cost
            O(Services x nodes) memory: 1 GiB at 10,000 Services and 5,000 nodes,
            BENCHMARKS.md, "The agent's own cost"); empty: derived from ``by_node``.
    """

    base: KubeVersion
    by_node: Mapping[str, KubeVersion]
    by_zone: Mapping[str, Mapping[int, tuple[str, ...]]]
    notes: tuple[tuple[str, str], ...] = ()
    override: bool = False
    minor_by_node: Mapping[str, int] = field(default_factory=dict)

    def of(self, node: str) -> KubeVersion:
        """The version node ``node``'s kube-proxy is judged with."""
        return self.by_node.get(node, self.base)


def proxy_versions(nodes: Sequence[NodeInfo], kv: KubeVersion,
                   kube_proxy_version: str | None = None) -> ProxyVersions:
    """Each node's kube-proxy version: the override for all, else what the Node reports.

    Args:
        nodes: the cluster's nodes (``NodeInfo.proxy_version`` as reported in
            ``status.nodeInfo``, see :func:`agent.k8s.parse.node_proxy_version`).
        kv: the control plane's version and gates.
        kube_proxy_version: ``"1.X"`` to judge every node's kube-proxy as that version, or
            None (``--kube-proxy-version auto``): each Node's reported version, clamped to
            the covered range; a node that reports none is judged as ``kv``.

    Cost: O(nodes), one dict look-up per node when every node reports the same version.

    Raises:
        InputError: ``kube_proxy_version`` is not a covered version.
    """
    if kube_proxy_version is not None:
        pk = KubeVersion.parse(kube_proxy_version)
        return ProxyVersions(kv if pk.minor == kv.minor else pk, {}, {}, (), True)
    memo: dict[str, int | None] = {}
    notes: list[tuple[str, str]] = []
    versions: dict[int, KubeVersion] = {}
    by_node: dict[str, KubeVersion] = {}
    by_zone: dict[str, dict[int, list[str]]] = {}
    for n in nodes:
        text = n.proxy_version
        if text is None:
            continue
        minor = memo.get(text, -1)
        if minor == -1:
            got, note = covered_version(text, f"Node {n.name}'s kube-proxy (status.nodeInfo)")
            minor = memo[text] = None if got is None else int(got.split(".")[1])
            if note is not None:
                notes.append((text, note + ("" if got is not None else f"; judging it as {kv}")))
        if minor is None or minor == kv.minor:
            continue
        v = versions.get(minor)
        if v is None:
            v = versions[minor] = KubeVersion.parse(f"1.{minor}")
        by_node[n.name] = v
        by_zone.setdefault(n.zone or UNKNOWN_ZONE, {}).setdefault(minor, []).append(n.name)
    return ProxyVersions(kv, by_node, {z: {m: tuple(ns) for m, ns in g.items()} for z, g in by_zone.items()},
                         tuple(notes), minor_by_node={n: v.minor for n, v in by_node.items()})


#: one group of nodes of a client zone that share a kube-proxy decision: (client zone,
#: kube-proxy minor or None for the common version, decision, number of nodes, up to 5 names)
ZoneGroup = tuple[str, "int | None", ProxyDecision, int, list[str]]


def _zone_groups(idx: ClusterIndex, proxy: Mapping[str, ProxyDecision], special: Collection[str],
                 pv: ProxyVersions | None = None) -> list[ZoneGroup]:
    """Distinct kube-proxy decisions per client zone without visiting every node.

    Returns:
        :data:`ZoneGroup` tuples; nodes that host or are hinted by no endpoint share one
        decision per zone and kube-proxy version.
    """
    out: list[ZoneGroup] = []
    if pv is not None and pv.by_node and isinstance(proxy, ProxyMap):
        return _zone_groups_skewed(idx, proxy, pv)
    special_by_zone: dict[str, list[str]] = {}
    for n in special:
        if n in idx.node_zone:
            special_by_zone.setdefault(idx.client_zone(n), []).append(n)
    for z, nodes in idx.zones.items():
        sp = special_by_zone.get(z, [])
        generic = len(nodes) - len(sp)
        if generic > 0:
            sps = set(sp)
            sample = []
            for n in nodes:
                if n not in sps:
                    sample.append(n)
                    if len(sample) == 5:
                        break
            out.append((z, None, proxy[sample[0]], generic, sample))
        for n in sp:
            out.append((z, None, proxy[n], 1, [n]))
    return out


def _zone_groups_skewed(idx: ClusterIndex, proxy: ProxyMap, pv: ProxyVersions) -> list[ZoneGroup]:
    """:func:`_zone_groups` when some nodes run another kube-proxy version."""
    out: list[ZoneGroup] = []
    special_by_zone: dict[str, list[str]] = {}
    special_count: dict[tuple[str, Any], int] = {}
    for n in proxy.specials:
        z = idx.client_zone(n)
        special_by_zone.setdefault(z, []).append(n)
        g = proxy.group_of(n)
        special_count[(z, g)] = special_count.get((z, g), 0) + 1
    sps = set(proxy.specials)
    for z, nodes in idx.zones.items():
        skewed = pv.by_zone.get(z, {})
        members: list[tuple[int | None, Sequence[str], int]] = [
            (None, nodes, len(nodes) - sum(len(v) for v in skewed.values()))]
        members += [(m, ns, len(ns)) for m, ns in sorted(skewed.items())]
        for g, ns, size in members:
            generic = size - special_count.get((z, g), 0)
            if generic <= 0:
                continue
            sample: list[str] = []
            for n in ns:
                if n not in sps and (g is not None or n not in pv.by_node):
                    sample.append(n)
                    if len(sample) == 5:
                        break
            out.append((z, g, proxy[sample[0]], generic, sample))
        for n in special_by_zone.get(z, []):
            g = proxy.group_of(n)
            out.append((z, g if isinstance(g, int) else None, proxy[n], 1, [n]))
    return out


def _skew_sentences(groups: Sequence[ZoneGroup], pidx: ProxyIndex, pkv: KubeVersion) -> list[str]:
    """One phrase per group of other-version kube-proxies whose decision differs from what
    kube-proxy ``pkv`` would decide on the same node (topology mode or endpoints)."""
    out: list[str] = []
    for z, g, d, count, sample in groups:
        if g is None:
            continue
        b = pidx.decide(sample[0], z)
        if (d.topology_mode, d.internal_traffic, d.internal_addresses) == \
                (b.topology_mode, b.internal_traffic, b.internal_addresses):
            continue
        out.append(f"{count} node(s) of zone {z} at 1.{g} ({_names(sample)}): topology mode "
                   f"{d.topology_mode or 'none'!r} instead of {b.topology_mode or 'none'!r}, "
                   f"{len(d.internal_addresses)} endpoint(s) instead of {len(b.internal_addresses)} "
                   "for internal traffic")
    return out


def _local(d: ProxyDecision) -> bool:
    return d.internal_traffic == "cluster" and d.topology_mode in ("PreferSameZone", "PreferSameNode")


def _scope(d: ProxyDecision) -> str:
    """``node``, ``zone`` or ``off``: how close this decision keeps ClusterIP traffic.

    internalTrafficPolicy Local (``local``, or ``DROP`` where the node has no local
    endpoint: nothing leaves the node) is ``node``, as is PreferSameNode."""
    if d.internal_traffic in ("local", "DROP"):
        return "node"
    if not _local(d):
        return "off"
    return "node" if d.topology_mode == "PreferSameNode" else "zone"


def _selected(d: ProxyDecision) -> tuple[str, ...]:
    """The ``ip:port`` endpoints internal traffic of this decision goes to (empty for
    DROP/REJECT); the decision's own tuple, shared by every group with that selection."""
    if d.internal_traffic == "cluster":
        return d.cluster_endpoints or ()
    if d.internal_traffic == "local":
        return d.local_endpoints or ()
    return ()


def _share(d: ProxyDecision, zone: str, keys: tuple[str, ...],
           counts: Callable[[tuple[str, ...]], tuple[Mapping[str, int], int]]) -> float | None:
    """Cross-zone share of one decision for a client zone (:attr:`ClientGroup.cross_zone_share`)."""
    if d.internal_traffic == "local":
        return 0.0
    if d.internal_traffic != "cluster" or zone == UNKNOWN_ZONE or not keys:
        return None
    by_zone, n = counts(keys)
    return (n - by_zone.get(zone, 0)) / n


def _percent(share: float) -> str:
    """A share as a whole percentage (``0.5`` -> ``50%``); below 1% but not 0 -> ``<1%``."""
    pct = round(share * 100)
    return "<1%" if pct == 0 and share > 0 else f"{pct}%"


def _all_local(groups: Sequence[ZoneGroup], pidx: ProxyIndex, idx: ClusterIndex) -> bool:
    """Whether every client zone would have locality if every node ran the common version."""
    seen = False
    for z, g, d, _, sample in groups:
        if z not in idx.ready_zones:
            continue
        seen = True
        if not _local(d if g is None else pidx.decide(sample[0], z)):
            return False
    return seen


def _names(items: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def diagnose(svc: ServiceInfo, at: str, slices: Sequence[Slice], idx: ClusterIndex,
             kv: KubeVersion, populated: bool, pv: ProxyVersions | None = None) -> ServiceDiagnosis:
    """Controller + kube-proxy + diagnosis for one Service and address family.

    Args:
        svc: the Service.
        at: ``IPv4`` or ``IPv6``.
        slices: every slice labelled for the Service with that address type (any manager).
        idx: cluster index.
        kv: the control plane's version and gates (the EndpointSlice controller).
        populated: topology cache's populated mark for the Service before this family.
        pv: each node's kube-proxy version (:func:`proxy_versions`); None: every
            kube-proxy runs ``kv``. Nodes at another version are decided by a
            :class:`ProxyIndex` of their own version (one per version, shared per zone).
    """
    managed = [s for s in slices if s.managed]
    ctrl = reconcile(svc, managed, at, idx.capacity, kv, populated)
    observed = AddressHints([(s.endpoints, [e.hints for e in s.endpoints]) for s in slices])
    pkv = kv if pv is None else pv.base
    pidx = ProxyIndex(svc, slices, pkv)
    peps, port, special = pidx.eps, pidx.port, pidx.special_nodes
    proxy: Mapping[str, ProxyDecision]
    if svc.headless:
        proxy = {}
    elif pv is not None and pv.by_node:
        others = {m: ProxyIndex(svc, slices, v) for m, v in
                  {v.minor: v for v in pv.by_node.values()}.items()}
        proxy = ProxyMap(idx.node_zone, special, pidx.decide,
                         (pv.minor_by_node or {n: v.minor for n, v in pv.by_node.items()},
                          {m: (o.special_nodes, o.decide) for m, o in others.items()}))
    else:
        proxy = ProxyMap(idx.node_zone, special, pidx.decide)
    warnings: list[DiagnosisWarning] = []
    ann_key, ann_val = effective_annotation(svc.annotations)
    auto = hints_enabled(svc.annotations)
    td = svc.traffic_distribution
    td_ok = valid_traffic_distribution(td, kv)
    cache = kv.gate("TopologyAwareHints")

    # --- locality per client zone (internal traffic)
    locality: dict[str, bool] = {}
    scope: dict[str, str] = {}
    groups = [] if svc.headless else _zone_groups(idx, proxy, special, pv)
    # endpoint ip:port -> its zone (the endpoint's, else its node's label), for the shares;
    # a transient dict (the diagnosis keeps only a lazy view of it, built if read)
    zones_of = EndpointZones(pidx.keys, peps, idx.node_zone)
    ep_zone: dict[str, str] = {}
    client_groups: list[ClientGroup] = []
    weighted: dict[str, list[float]] = {}
    # decisions share their endpoint tuples (ProxyIndex caches them by tag), so the zone
    # counts of a selection are computed once per distinct tuple, not once per node group
    tallies: dict[int, tuple[Mapping[str, int], int]] = {}

    def counts(keys: tuple[str, ...]) -> tuple[Mapping[str, int], int]:
        got = tallies.get(id(keys))
        if got is None:
            if not ep_zone:
                ep_zone.update(zones_of.build())
            c: dict[str, int] = {}
            for k in keys:
                ez = ep_zone.get(k, "")
                c[ez] = c.get(ez, 0) + 1
            got = tallies[id(keys)] = (c, len(keys))
        return got

    for z, g, d, count, sample in groups:
        if z not in idx.ready_zones:
            continue  # no Ready node there, so no client either
        sc = _scope(d)
        locality[z] = locality.get(z, True) and sc != "off"
        prev = scope.get(z)
        scope[z] = sc if prev is None or prev == sc else ("off" if "off" in (prev, sc) else "zone")
        keys = _selected(d)
        share = _share(d, z, keys, counts)
        client_groups.append(ClientGroup(z, count, tuple(sample), None if g is None else f"1.{g}",
                                         d.topology_mode, d.internal_traffic, keys, share))
        acc = weighted.setdefault(z, [0.0, 0.0])
        if share is not None:
            acc[0] += share * count
            acc[1] += count
    client_groups.sort(key=lambda cg: cg.zone)
    expected: dict[str, float | None] = {
        z: (acc[0] / acc[1] if acc[1] else None) for z, acc in sorted(weighted.items())}

    # --- mode label
    if svc.internal_local:
        mode = "internalTrafficPolicy-Local"
    elif auto:
        mode = "topology-mode"
    elif td:
        mode = td
    else:
        mode = "none"

    # --- warnings
    if auto and td:
        msg = (f"{ann_key}: {ann_val} shadows spec.trafficDistribution: {td}; the controller "
               "ignores trafficDistribution")
        if ctrl.refusal_reason:
            msg += " and, as Auto refused, the Service gets no hints at all"
        warnings.append(DiagnosisWarning("auto-shadows-traffic-distribution", msg))
    if ANNOTATION_DEPRECATED in svc.annotations and ANNOTATION_TOPOLOGY_MODE in svc.annotations:
        warnings.append(DiagnosisWarning(
            "deprecated-annotation-shadows-topology-mode",
            f"{ANNOTATION_DEPRECATED}: {svc.annotations[ANNOTATION_DEPRECATED]!r} is read instead of "
            f"{ANNOTATION_TOPOLOGY_MODE}: {svc.annotations[ANNOTATION_TOPOLOGY_MODE]!r}"))
    bad_ann = ann_val not in (None, "", "Auto", "auto", "Disabled", "disabled")
    if bad_ann:
        warnings.append(DiagnosisWarning(
            "annotation-value-not-accepted",
            f"{ann_key}: {ann_val!r} is not accepted by the EndpointSlice controller (only \"Auto\" "
            "or \"auto\")" + ("; kube-proxy <= 1.32 still treats it as enabled" if pkv.minor <= 32 else "")))
    td_refused = td is not None and not auto and not (td_ok and td in close_values(kv))
    if td_refused:
        why = ("the field needs Kubernetes 1.30+" if kv.minor < 30 else
               "the ServiceTrafficDistribution gate is off" if not kv.gate("ServiceTrafficDistribution") else
               "the PreferSameTrafficDistribution gate is off" if td in ("PreferSameZone", "PreferSameNode")
               and kv.minor >= 33 else f"the value is not recognised in {kv}")
        warnings.append(DiagnosisWarning("traffic-distribution-not-accepted",
                                f"spec.trafficDistribution: {td} is not used: {why}; hints are removed"))
    if auto and idx.capacity.ratios is None and idx.capacity.bad_node:
        warnings.append(DiagnosisWarning(
            "node-info-disables-auto",
            f"Node {idx.capacity.bad_node} (ready worker) has {idx.capacity.bad_node_problem}: "
            "topology-mode Auto is refused for every Service in the cluster"))
    if ctrl.refusal_reason in ("insufficient-number-of-endpoints",
                               "min-allocation-exceeds-overload-threshold"):
        m = minimum_accepted_endpoints(idx.capacity.ratios, ctrl.ready_endpoint_count)
        if m is not None:
            warnings.append(DiagnosisWarning(
                "auto-minimum-endpoints",
                f"Auto refuses {ctrl.ready_endpoint_count} ready endpoints; the smallest count at "
                f"or above it that Auto accepts is {m}"))
    hinted = 0
    unhinted: list[tuple[str, Endpoint]] = []
    for s in slices:
        for e in s.endpoints:
            if e.ready is not False:
                if e.hints is not None and e.hints.for_zones:
                    hinted += 1
                else:
                    unhinted.append((s.name, e))
    if hinted and unhinted:
        warnings.append(DiagnosisWarning(
            "ready-endpoints-without-hints",
            f"{len(unhinted)} ready endpoint(s) carry no zone hint, so kube-proxy ignores zone hints "
            f"for the whole Service: " + _names([f"{e.address} (EndpointSlice {n})" for n, e in unhinted])))
    stale: list[str] = []
    if ctrl.rewritten:
        rewritten = set(ctrl.rewritten)
        for s in managed:
            if s.name in rewritten:
                stale.extend(e.address for e, h in zip(s.endpoints, ctrl.slices[s.name], strict=False)
                             if h is not e.hints and norm_hints(h) != norm_hints(e.hints))
    if stale:
        warnings.append(DiagnosisWarning(
            "stale-hints",
            f"{len(stale)} endpoint(s) carry hints that differ from what the controller would write now "
            f"(slices {_names(list(ctrl.rewritten) or ['?'])}): " + _names(stale)))
    if svc.internal_local and peps:
        dropped = [(c, ns_) for _, _, d, c, ns_ in groups if d.internal_traffic == "DROP"]
        if dropped:
            count = sum(c for c, _ in dropped)
            sample = [n for _, ns_ in dropped for n in ns_]
            warnings.append(DiagnosisWarning(
                "internal-traffic-policy-local-drops",
                f"internalTrafficPolicy: Local and {count} node(s) have no local endpoint: "
                f"ClusterIP traffic from them is dropped: " + _names(sample)
                + (f" and {count - min(5, len(sample))} more" if count > 5 else "")))
    if td == "PreferSameNode" and td_ok and not svc.headless and peps:
        hosts = {e.node for e in peps if e.ready is not False and e.node} & set(idx.node_zone)
        count = len(idx.node_zone) - len(hosts)
        if count > 0:
            sample = []
            for n in idx.node_zone:
                if n not in hosts:
                    sample.append(n)
                    if len(sample) == 5:
                        break
            warnings.append(DiagnosisWarning(
                "prefer-same-node-skew",
                f"PreferSameNode: {count} of {len(idx.node_zone)} node(s) have no ready endpoint "
                "(they fall back to same-zone) while each node with one sends all its traffic to it: "
                + ", ".join(sample) + (f" and {count - len(sample)} more" if count > len(sample) else "")))
    if peps:
        n_ready = len(pidx.ready)
        singles = []
        seen: set[str] = set()
        for z, _, d, _, _ in groups:
            if z not in seen and d.topology_mode == "PreferSameZone" and d.cluster_endpoints is not None \
                    and len(d.cluster_endpoints) == 1 and n_ready > 1:
                seen.add(z)
                singles.append(f"{z} -> {d.cluster_endpoints[0]}")
        if singles:
            warnings.append(DiagnosisWarning(
                "single-endpoint-zone",
                "a single endpoint receives all traffic of its zone: " + _names(singles)))
    zoneless = list(idx.zoneless)
    if zoneless and (hinted or auto or td):
        warnings.append(DiagnosisWarning("node-without-zone",
                                f"{len(zoneless)} node(s) have no {LABEL_ZONE} label, so kube-proxy there "
                                "never filters by zone: " + _names(zoneless)))
    if not slices:
        warnings.append(DiagnosisWarning("no-endpointslices",
                                f"no EndpointSlice labelled {LABEL_SERVICE_NAME}={svc.name} ({at})"))

    skew = [] if pv is None or not pv.by_node else _skew_sentences(groups, pidx, pkv)
    if skew:
        warnings.append(DiagnosisWarning(
            "kube-proxy-version-skew",
            "kube-proxy of another version than " + str(pkv) + " selects differently on "
            + "; ".join(skew)))

    crossing = [(z, share) for z, share in expected.items()
                if locality.get(z) and share is not None and share > EXPECTED_CROSS_ZONE_WARN]
    if crossing:
        warnings.append(DiagnosisWarning(
            "expected-cross-zone",
            "locality is in effect, yet the endpoints kube-proxy selects send an expected "
            + _names([f"{_percent(share)} of zone {z}'s calls" for z, share in crossing])
            + f" to other zones (warning above {_percent(EXPECTED_CROSS_ZONE_WARN)}): "
            + ("the controller hints other zones' endpoints to them (Auto shares endpoints "
               "out by zone CPU)" if ctrl.mechanism == "topology-mode-annotation"
               else "few endpoints of the zone are selected beside those of other zones")))

    # --- reason (first match wins; see docs/hints.md)
    any_usable = pidx.any_usable
    requested = auto or td is not None or bad_ann
    foreign_hinted = any(e.hints is not None for s in slices if not s.managed for e in s.endpoints)
    if not peps or not any_usable:
        reason = "no-endpoints"
    elif svc.internal_local:
        reason = "internal-traffic-policy-local"
    elif auto and not cache:
        reason = "feature-gate-disabled"
    elif ctrl.refusal_reason:
        reason = ctrl.refusal_reason
    elif not requested and not foreign_hinted:
        reason = "not-requested"  # the controller strips any hints from its own slices
    elif bad_ann and not (td_ok and td in close_values(kv)):
        reason = "annotation-value-not-accepted"
    elif td_refused:
        reason = ("annotation-value-not-accepted" if (kv.minor in (30, 31, 32)
                  and kv.gate("ServiceTrafficDistribution")) else "feature-gate-disabled")
    elif hinted and pkv.minor <= 32 and proxy_blocked(svc, pkv):
        reason = "feature-gate-disabled" if proxy_gates_off(pkv) else "not-requested"
    elif locality and all(locality.values()):
        reason = "none"
    elif skew and _all_local(groups, pidx, idx):
        reason = "kube-proxy-version-skew"  # kube-proxy at the control plane's version would keep it
    elif unhinted:
        reason = "partial-hints"
    elif not locality:
        reason = "none" if ctrl.hints_enabled else "partial-hints"
    else:
        reason = "no-hints-for-zone"
    return ServiceDiagnosis(
        namespace=svc.namespace, name=svc.name, address_type=at, mechanism=ctrl.mechanism,
        mode=mode, reason=reason, locality_in_effect=locality, warnings=warnings,
        controller=ctrl, observed_hints=observed, proxy=proxy, service_port=port,
        headless=svc.headless, locality_scope=scope, expected_cross_zone=expected,
        client_groups=client_groups, donations=_donations(managed, ctrl, idx), endpoint_zones=zones_of)


def _donations(managed: Sequence[Slice], ctrl: ControllerResult, idx: ClusterIndex
               ) -> tuple[tuple[str, str, str], ...]:
    """:attr:`ServiceDiagnosis.donations`: ready endpoints the controller's Auto hints give
    to another zone (``redistributeHints``, ``topologycache/utils.go``)."""
    if ctrl.mechanism != "topology-mode-annotation":
        return ()  # Auto refused or not requested: no donation
    out: list[tuple[str, str, str]] = []
    for s in managed:
        for e, h in zip(s.endpoints, ctrl.slices.get(s.name, ()), strict=False):
            if e.ready is True and h is not None and h.for_zones:
                own = e.zone or (idx.node_zone.get(e.node, "") if e.node else "")
                out.extend((e.address, own, z) for z in h.for_zones if z != own)
    return tuple(out)


def evaluate_cluster(nodes: list[dict[str, Any]], services: list[dict[str, Any]],
                     endpointslices: list[dict[str, Any]], pods: list[dict[str, Any]] | None = None,
                     *, version: str = DEFAULT_VERSION, feature_gates: Mapping[str, bool] | None = None,
                     hints_populated: Collection[str] | None = None, strict: bool = False,
                     errors: list[InputError] | None = None, kube_proxy_version: str | None = None,
                     notes: list[tuple[str, str]] | None = None) -> list[ServiceDiagnosis]:
    """Diagnose every Service of a cluster (one entry per Service and address family).

    Args:
        nodes, services, endpointslices: API-shaped dicts (``kubectl get -o json`` items).
        pods: accepted for API stability; the model reads endpoint state from the slices
            (the controller's own output), so pods are currently not consulted.
        version: ``"1.27"`` .. ``"1.37"``: the control plane (EndpointSlice controller), and
            the kube-proxy of every node that reports no version of its own.
        feature_gates: gate overrides (name -> bool), validated per version; they apply to
            ``version`` only (kube-proxies of another version run its gate defaults).
        kube_proxy_version: ``"1.X"``: every node's kube-proxy is judged as that version;
            None: each Node's ``status.nodeInfo`` version (:func:`proxy_versions`).
        notes: when given, ``(reported text, sentence)`` is appended for each node version
            outside the covered range (:attr:`ProxyVersions.notes`).
        hints_populated: ``namespace/name`` keys the controller's topology cache marks as
            having Auto hints (controls the Enabled/Disabled events). None: inferred, a
            Service counts as populated when its controller slices carry hints and
            trafficDistribution is not what wrote them.
        strict: raise on the first malformed object instead of skipping it.
        errors: when given (and not strict), skipped objects' errors are appended here.
            Skipping never yields a confident wrong answer: a malformed Node still counts
            in the zone capacity with unknown CPU (so Auto is refused while it is an
            eligible worker), and a Service with a malformed EndpointSlice gets no
            diagnosis.

    Returns:
        ServiceDiagnosis list, Services in input order, IPv4 before IPv6. ExternalName
        Services are skipped.

    Raises:
        InputError: bad version/gates; a malformed object when ``strict``.
    """
    kv = KubeVersion.parse(version, feature_gates)
    # The records built here are acyclic; pausing the cyclic collector avoids repeated full
    # scans of the (large) input dicts while hundreds of thousands of records are created.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _evaluate([parse_node_entry(n) for n in nodes], [parse_service_entry(s) for s in services],
                         [parse_slice_entry(s) for s in endpointslices], kv, hints_populated, strict, errors,
                         kube_proxy_version, notes)
    finally:
        if was_enabled:
            gc.enable()


def evaluate_parsed(nodes: Sequence[NodeEntry], services: Sequence[ServiceEntry],
                    endpointslices: Sequence[SliceEntry], *, version: str = DEFAULT_VERSION,
                    feature_gates: Mapping[str, bool] | None = None,
                    hints_populated: Collection[str] | None = None, strict: bool = False,
                    errors: list[InputError] | None = None, kube_proxy_version: str | None = None,
                    notes: list[tuple[str, str]] | None = None) -> list[ServiceDiagnosis]:
    """:func:`evaluate_cluster` over objects already parsed (the metadata cache's entries).

    Args:
        nodes, services, endpointslices: entries from :func:`agent.k8s.parse.parse_node_entry`,
            :func:`~agent.k8s.parse.parse_service_entry` and
            :func:`~agent.k8s.parse.parse_slice_entry` (a record, or the error parsing
            raised, which is reported here exactly as :func:`evaluate_cluster` reports it).
        version, feature_gates, hints_populated, strict, errors, kube_proxy_version, notes:
            as :func:`evaluate_cluster`.

    Returns:
        as :func:`evaluate_cluster`.

    Raises:
        InputError: bad version/gates; a malformed object when ``strict``.
    """
    kv = KubeVersion.parse(version, feature_gates)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _evaluate(nodes, services, endpointslices, kv, hints_populated, strict, errors,
                         kube_proxy_version, notes)
    finally:
        if was_enabled:
            gc.enable()


def _evaluate(nodes: Sequence[NodeEntry], services: Sequence[ServiceEntry],
              endpointslices: Sequence[SliceEntry], kv: KubeVersion,
              hints_populated: Collection[str] | None, strict: bool,
              errors: list[InputError] | None, kube_proxy_version: str | None = None,
              notes: list[tuple[str, str]] | None = None) -> list[ServiceDiagnosis]:
    def bad(err: InputError) -> None:
        if strict:
            raise err
        if errors is not None:
            errors.append(err)

    infos = []
    for info, node_err in nodes:
        if node_err is not None:
            # a Node parse_node_info refused still counts in the zone capacity, with
            # unknown CPU (agent.k8s.parse.unreadable_node), when it has a name
            bad(node_err)
        if info is not None:
            infos.append(info)
    idx = index_node_infos(tuple(infos))
    pv = proxy_versions(idx.nodes, kv, kube_proxy_version)
    if notes is not None:
        notes.extend(pv.notes)
    pv_or_none = None if not pv.by_node and pv.base is kv else pv
    by_svc: dict[tuple[str, str], list[Slice]] = {}
    # Services with a slice the model cannot read: diagnosing them from their other slices
    # would be a confident answer about endpoints it has not seen, so they get none.
    unreadable_svc: set[tuple[str, str]] = set()
    for ns, sname, sl, slice_err in endpointslices:
        if slice_err is not None or sl is None:
            if slice_err is not None:
                bad(slice_err)
            unreadable_svc.add((ns, sname))
            continue
        if sname:
            by_svc.setdefault((ns, sname), []).append(sl)
    out: list[ServiceDiagnosis] = []
    for svc, svc_err in services:
        if svc_err is not None or svc is None:
            if svc_err is not None:
                bad(svc_err)
            continue
        if svc.type == "ExternalName" or (svc.namespace, svc.name) in unreadable_svc:
            continue
        slices = by_svc.get((svc.namespace, svc.name), [])
        if hints_populated is not None:
            populated = svc.key in hints_populated
        else:
            populated = (not valid_traffic_distribution(svc.traffic_distribution, kv)
                         or hints_enabled(svc.annotations)) and any(
                e.hints is not None for s in slices if s.managed for e in s.endpoints)
        for at in address_families(svc, slices):
            d = diagnose(svc, at, [s for s in slices if s.address_type == at], idx, kv, populated,
                         pv_or_none)
            populated = d.controller.populated_after
            out.append(d)
    return out
