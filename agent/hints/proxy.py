"""kube-proxy's endpoint selection per node: CategorizeEndpoints, topology mode, DROP/REJECT.

Reproduces ``pkg/proxy/topology.go`` (``CategorizeEndpoints``, ``topologyModeFromHints``
(1.33+), ``canUseTopology`` (<= 1.32)), the endpoint merge of
``pkg/proxy/endpointslicecache.go``, and the DROP/REJECT outcome of
``pkg/proxy/{iptables,nftables}/proxier.go``. Decisions are computed per zone plus per node
that hosts or is hinted by an endpoint, then shared (see :class:`ProxyMap`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Collection, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agent.hints.controller import effective_annotation
from agent.hints.versions import KubeVersion
from agent.k8s.parse import Endpoint, ServiceInfo, Slice
from agent.records import ProxyView


@dataclass(frozen=True, slots=True)
class ProxyDecision:
    """kube-proxy's view of one Service on one node (``CategorizeEndpoints`` + dataplane).

    Attributes:
        topology_mode: ``""``, ``"PreferSameZone"`` or ``"PreferSameNode"``; None when the
            Service never uses Cluster endpoints (before 1.33 "PreferSameZone" stands for
            ``canUseTopology() == true``).
        cluster_endpoints: sorted ``ip:port`` strings, None when the category is unused.
        local_endpoints: sorted ``ip:port`` strings, None when the category is unused.
        all_reachable_endpoints: sorted union of the used lists.
        has_any_endpoints: some endpoint is usable anywhere in the cluster.
        internal_traffic: ``cluster``, ``local``, ``DROP`` or ``REJECT``.
        external_traffic: same, or None when the Service is not externally accessible.
        internal_addresses: endpoint addresses (no port) internal traffic goes to.
    """

    topology_mode: str | None
    cluster_endpoints: tuple[str, ...] | None
    local_endpoints: tuple[str, ...] | None
    all_reachable_endpoints: tuple[str, ...]
    has_any_endpoints: bool
    internal_traffic: str
    external_traffic: str | None
    internal_addresses: frozenset[str]

    def to_json(self) -> dict[str, Any]:
        """The ``proxy[node]`` object of the explain JSON."""
        return {
            "topology_mode": self.topology_mode,
            "cluster_endpoints": None if self.cluster_endpoints is None else list(self.cluster_endpoints),
            "local_endpoints": None if self.local_endpoints is None else list(self.local_endpoints),
            "internal_traffic": self.internal_traffic,
            "external_traffic": self.external_traffic,
        }

    def view(self) -> ProxyView:
        """The shared :class:`agent.records.ProxyView` (selected = internal addresses)."""
        return ProxyView(self.topology_mode or "", self.internal_addresses, self.internal_traffic)


class ProxyMap(Mapping[str, ProxyDecision]):
    """Read-only ``node name -> ProxyDecision`` for every node of the input.

    Decisions are computed per zone for nodes that neither host nor are hinted by an
    endpoint (they all behave the same), and per node otherwise, so the map costs
    O(endpoints) per Service instead of O(nodes).

    Args:
        node_zone: node -> zone label ("" when absent), every node of the input.
        special: nodes decided one by one by ``compute``.
        compute: ``(node or None, zone) -> decision`` of the common kube-proxy version.
        groups: nodes whose kube-proxy runs another version: ``(node -> group key,
            group key -> (that version's special nodes, its compute))``; their decisions
            are shared per (group, zone) the same way. None: every node is in the common
            group.
    """

    __slots__ = ("_node_zone", "_by_zone", "_special", "_compute", "_group", "_computes")

    def __init__(self, node_zone: Mapping[str, str], special: Collection[str],
                 compute: Callable[[str | None, str], ProxyDecision],
                 groups: tuple[Mapping[str, Hashable], Mapping[Hashable, tuple[
                     Collection[str], Callable[[str | None, str], ProxyDecision]]]] | None = None
                 ) -> None:
        self._node_zone = node_zone
        self._by_zone: dict[Hashable, ProxyDecision] = {}
        self._compute = compute
        self._group: Mapping[str, Hashable] = groups[0] if groups is not None else {}
        self._computes = {g: fn for g, (_, fn) in groups[1].items()} if groups is not None else {}
        group = self._group
        self._special: dict[str, ProxyDecision | None] = {
            n: None for n in special if n in node_zone and n not in group}
        if groups is not None:
            for g, (sp, _) in groups[1].items():
                for n in sp:
                    if n in node_zone and group.get(n) == g:
                        self._special[n] = None

    def __getitem__(self, node: str) -> ProxyDecision:
        zone = self._node_zone[node]  # KeyError for unknown nodes, as a dict would
        g = self._group.get(node) if self._group else None
        if node in self._special:
            got = self._special[node]
            if got is None:
                fn = self._compute if g is None else self._computes[g]
                got = self._special[node] = fn(node, zone)
            return got
        key: Hashable = zone if g is None else (g, zone)
        got = self._by_zone.get(key)
        if got is None:
            fn = self._compute if g is None else self._computes[g]
            got = self._by_zone[key] = fn(None, zone)
        return got

    def __iter__(self) -> Iterator[str]:
        return iter(self._node_zone)

    def __len__(self) -> int:
        return len(self._node_zone)

    @property
    def specials(self) -> Collection[str]:
        """The nodes decided one by one (in the input, whatever their group)."""
        return self._special.keys()

    def group_of(self, node: str) -> Hashable | None:
        """The node's group key, None for the common kube-proxy version."""
        return self._group.get(node)


def _proxy_annotation_on(annotations: Mapping[str, str]) -> bool:
    """kube-proxy ``hintsAnnotation`` (<= 1.32): non-empty and not "disabled"/"Disabled"."""
    v = effective_annotation(annotations)[1] or ""
    return v not in ("", "disabled", "Disabled")


def _proxy_hints_allowed(svc: ServiceInfo, kv: KubeVersion) -> bool:
    """<= 1.32 ``canUseTopology`` preconditions that do not depend on endpoints or node."""
    if kv.minor >= 33:
        return True
    if kv.minor >= 30:
        std = kv.gate("ServiceTrafficDistribution")
        if not kv.gate("TopologyAwareHints") and not std:
            return False
        return std or _proxy_annotation_on(svc.annotations)
    return kv.gate("TopologyAwareHints") and _proxy_annotation_on(svc.annotations)


def normalise_ip(address: str) -> str:
    """The address as kube-proxy prints it in an endpoint's ``ip:port`` key.

    ``pkg/proxy/endpoint.go newBaseEndpointInfo`` keys an endpoint by
    ``net.JoinHostPort(netutils.ParseIPSloppy(addresses[0]).String(), port)``: IPv4 octets
    with leading zeros are read as decimal (``010.0.0.1`` is ``10.0.0.1``), IPv6 is printed in
    its canonical form (``fd00::01`` is ``fd00::1``), an IPv4-mapped IPv6 address prints as
    IPv4. An address that does not parse is kept as written.

    Args:
        address: ``endpoints[].addresses[0]`` as written in the slice.
    Returns:
        The canonical text, without brackets.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        parts = address.split(".")
        if len(parts) == 4 and all(p.isdigit() and 0 < len(p) <= 3 for p in parts) \
                and all(int(p) <= 255 for p in parts):
            return ".".join(str(int(p)) for p in parts)  # ParseIPSloppy: leading zeros are decimal
        return address
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    return ip.compressed


def slice_port(svc: ServiceInfo, s: Slice) -> tuple[bool, int | None]:
    """Whether slice ``s`` serves the Service's first port, and the endpoint port number.

    ``pkg/proxy/endpointslicecache.go updatePending`` keys each slice port by its name; a
    slice without ports serves no named port.
    """
    if svc.first_port_name is not None:
        for pname, pnum in s.ports:
            if pname == svc.first_port_name:
                return True, pnum
        if s.ports:
            return False, None
    return True, None


def first_port(svc: ServiceInfo, slices: Sequence[Slice]) -> int | None:
    """The endpoint port of the first slice that serves the Service's first port."""
    for s in slices:
        serves, port = slice_port(svc, s)
        if serves:
            return port
    return None


def _copies(svc: ServiceInfo, slices: Sequence[Slice]) -> Iterator[tuple[str, Endpoint]]:
    for s in slices:
        serves, port = slice_port(svc, s)
        if not serves:
            continue
        suffix = "" if port is None else f":{port}"
        for e in s.endpoints:
            a = normalise_ip(e.address)
            yield (f"[{a}]" if ":" in a else a) + suffix, e


def merge_endpoints(svc: ServiceInfo, slices: Sequence[Slice], kv: KubeVersion,
                    local_node: str | None = None) -> list[tuple[str, Endpoint]]:
    """The endpoints kube-proxy keeps for the Service's first port, one per ``ip:port``.

    ``pkg/proxy/endpointslicecache.go (*EndpointSliceCache).addEndpoints`` visits slices and
    keeps, for each key, the first copy unless a later one replaces it:

    * 1.36+ (kubernetes PR #135593): ``!exists || !terminating``: any copy that is not
      terminating replaces; a terminating copy only fills an empty key;
    * 1.31-1.35: ``!exists || isLocal``: a copy whose ``nodeName`` is this kube-proxy's node
      (``local_node``) replaces, so the kept copy can differ per node. Versions before 1.31
      are read the same way (the rule is older than the model's range).

    Upstream visits slices in Go map order (``endpointSliceDataByName``), so which of two
    replacing copies in different slices wins is random there; the model visits slices in
    input order. The result is order-independent when at most one copy can replace (one
    non-terminating copy at 1.36+; one copy on ``local_node``, or none and all copies alike,
    at 1.35 and before): the ghost-pod case (a Terminating pod's address reused by a running
    pod) is of this kind. Within one slice upstream's order is the slice order, as here.

    Args:
        svc, slices, kv: the Service, its slices of one family in input order, the version.
        local_node: the kube-proxy node (only read before 1.36).
    Returns:
        ``(ip:port, endpoint)`` in order of first appearance of each key.
    """
    kept: dict[str, Endpoint] = {}
    new_rule = kv.minor >= 36
    for key, e in _copies(svc, slices):
        if key not in kept or (e.terminating is not True if new_rule
                               else (local_node is not None and e.node == local_node)):
            kept[key] = e
    return list(kept.items())


def local_override_nodes(svc: ServiceInfo, slices: Sequence[Slice], kv: KubeVersion) -> frozenset[str]:
    """Nodes whose kube-proxy keeps another copy of a duplicated ``ip:port`` than the first.

    Only before 1.36 (``!exists || isLocal`` in ``addEndpoints``): the nodes named by a
    non-first copy. Empty at 1.36+ and without duplicates.
    """
    if kv.minor >= 36:
        return frozenset()
    seen: set[str] = set()
    nodes: set[str] = set()
    for key, e in _copies(svc, slices):
        if key in seen:
            if e.node is not None:
                nodes.add(e.node)
        else:
            seen.add(key)
    return frozenset(nodes)


class ProxyIndex:
    """One Service's endpoints as kube-proxy merges them, indexed once for per-node decisions.

    Endpoints of every slice labelled for the Service (any manager) are merged for the
    Service's first port (:func:`merge_endpoints`, ``pkg/proxy/endpointslicecache.go``):
    ready = Ready unset or true, serving = Serving unset or true, terminating = Terminating
    true; node hints are read only with the PreferSameTrafficDistribution gate, zone hints
    before 1.33 only with the TopologyAwareHints gate. Each decision
    then costs O(result size).

    Args:
        svc, slices, kv: the Service, its slices of one address family, the version.
        local_node: the kube-proxy node the merge is for, when it matters (<= 1.35 with a
            duplicated ``ip:port``); None builds the view every other node shares and
            delegates the nodes in ``dup_nodes`` to their own index.

    Attributes:
        keys: ``ip:port`` per endpoint (IPv6 in brackets), parallel to ``eps``.
        port: the endpoint port of the Service's first port, or None.
        special_nodes: nodes whose decision can differ from other nodes of their zone
            (hosting an endpoint with a Local policy in use, or hinted by node hints in use).
    """

    __slots__ = ("svc", "kv", "eps", "keys", "port", "ready", "fallback", "all_zone", "all_node",
                 "by_zone", "by_node", "local_ready", "local_st", "allowed", "uses_cluster",
                 "uses_local", "ext_local", "any_usable", "special_nodes", "local_node", "dup_nodes",
                 "_subs", "_slices", "_sorted", "_addrs")

    def __init__(self, svc: ServiceInfo, slices: Sequence[Slice], kv: KubeVersion,
                 local_node: str | None = None) -> None:
        self.svc, self.kv = svc, kv
        read_nodes = kv.gate("PreferSameTrafficDistribution")
        self.uses_cluster = not svc.internal_local or svc.externally_accessible
        self.ext_local = svc.external_local and svc.externally_accessible
        self.uses_local = uses_local = svc.internal_local or self.ext_local
        self.allowed = _proxy_hints_allowed(svc, kv)
        eps: list[Endpoint] = []
        keys: list[str] = []
        ready: list[int] = []
        fallback: list[int] = []
        by_zone: dict[str, list[int]] = {}
        by_node: dict[str, list[int]] = {}
        local_ready: dict[str, list[int]] = {}
        local_st: dict[str, list[int]] = {}
        all_zone = True
        all_node = read_nodes
        self.port = first_port(svc, slices)
        self.local_node = local_node
        # <= 1.35 a later copy of an ip:port on this kube-proxy's node replaces the first
        # copy, so nodes hosting such a copy see their own merge (built lazily).
        self.dup_nodes = frozenset() if local_node is not None else local_override_nodes(svc, slices, kv)
        self._subs: dict[str, ProxyIndex] = {}
        self._slices = slices if self.dup_nodes else ()
        # <= 1.32 addEndpoints reads zone hints only with the TopologyAwareHints gate (with
        # ServiceTrafficDistribution alone, canUseTopology then finds no hints)
        read_zones = kv.minor >= 33 or kv.gate("TopologyAwareHints")
        for i, (key, e) in enumerate(merge_endpoints(svc, slices, kv, local_node)):
            eps.append(e)
            keys.append(key)
            h = e.hints
            st = e.serving is not False and e.terminating is True
            if e.ready is not False:
                ready.append(i)
                if h is None or not h.for_zones or not read_zones:
                    all_zone = False
                elif all_zone:
                    for z in h.for_zones:
                        if z in by_zone:
                            by_zone[z].append(i)
                        else:
                            by_zone[z] = [i]
                if all_node:
                    if h is None or not h.for_nodes:
                        all_node = False
                    else:
                        for n in h.for_nodes:
                            by_node.setdefault(n, []).append(i)
                if uses_local and e.node is not None:
                    local_ready.setdefault(e.node, []).append(i)
            elif uses_local and st and e.node is not None:
                local_st.setdefault(e.node, []).append(i)
            if st:
                fallback.append(i)
        self.eps, self.keys = eps, keys
        if not all_zone:
            by_zone = {}  # zone hints are ignored as a whole
        if not all_node:
            by_node = {}
        self.ready, self.fallback = ready, fallback
        self.all_zone, self.all_node = all_zone and bool(ready), all_node and bool(ready)
        self.by_zone, self.by_node = by_zone, by_node
        self.local_ready, self.local_st = local_ready, local_st
        self.any_usable = bool(ready) or bool(fallback)
        special: set[str] = set(self.dup_nodes)
        if self.uses_local:
            special.update(local_ready, local_st)
        if self.all_node and self.uses_cluster:
            special.update(by_node)
        self.special_nodes = special
        self._sorted: dict[Any, tuple[str, ...]] = {}
        self._addrs: dict[Any, frozenset[str]] = {}

    def _keys(self, tag: Any, idx: list[int]) -> tuple[str, ...]:
        got = self._sorted.get(tag)
        if got is None:
            got = self._sorted[tag] = tuple(sorted(self.keys[i] for i in idx))
        return got

    def topology_mode(self, node: str | None, zone: str) -> str:
        """kube-proxy topology mode on a node (``pkg/proxy/topology.go``).

        1.33+: ``topologyModeFromHints`` (node hints, then zone hints); <= 1.32:
        ``canUseTopology`` as ``"PreferSameZone"``/``""``. ``node`` None stands for a node
        that hosts no endpoint and is named by no node hint.
        """
        if not self.ready:
            return ""
        if self.kv.minor >= 33:
            if self.all_node and node is not None and node in self.by_node:
                return "PreferSameNode"
            if self.all_zone and zone in self.by_zone:
                return "PreferSameZone"
            return ""
        if not self.allowed or not zone or not self.all_zone:
            return ""
        return "PreferSameZone" if zone in self.by_zone else ""

    def decide(self, node: str | None, zone: str) -> ProxyDecision:
        """``CategorizeEndpoints`` plus the DROP/REJECT outcome of ``pkg/proxy/{iptables,nftables}/proxier.go``.

        Args:
            node: the node name, or None for "a node of ``zone`` without endpoints or hints".
            zone: the node's ``topology.kubernetes.io/zone`` label ("" when absent).
        """
        if node is not None and node in self.dup_nodes:
            sub = self._subs.get(node)
            if sub is None:
                sub = self._subs[node] = ProxyIndex(self.svc, self._slices, self.kv, node)
            return sub.decide(node, zone)
        svc = self.svc
        mode: str | None = None
        ctag: Any = None
        ckeys: tuple[str, ...] | None = None
        lkeys: tuple[str, ...] | None = None
        cidx: list[int] = []
        lidx: list[int] = []
        has_any = False
        if self.eps:
            if self.uses_cluster:
                mode = self.topology_mode(node, zone)
                tag: Any
                if mode == "PreferSameNode":
                    cidx, tag = self.by_node[node], ("n", node)  # type: ignore[index]
                elif mode == "PreferSameZone":
                    cidx, tag = self.by_zone[zone], ("z", zone)
                else:
                    cidx, tag = self.ready, "all"
                if not cidx:
                    cidx, tag = self.fallback, "fallback"
                ctag = tag
                ckeys = self._keys(tag, cidx)
                has_any = bool(cidx)
            if self.uses_local:
                has_any = has_any or self.any_usable
                if node is not None and node in self.local_ready:
                    lidx = self.local_ready[node]
                elif node is not None and node in self.local_st:
                    lidx = self.local_st[node]
                lkeys = self._keys(("l", node), lidx) if lidx else ()
        reach = tuple(sorted(set(ckeys or ()) | set(lkeys or ()))) if lkeys else (ckeys or ())
        if not has_any:
            internal, external = "REJECT", ("REJECT" if svc.externally_accessible else None)
        else:
            internal = ("local" if lidx else "DROP") if svc.internal_local else "cluster"
            external = None
            if svc.externally_accessible:
                external = ("local" if lidx else "DROP") if self.ext_local else "cluster"
        if internal == "cluster":
            atag, chosen = ("c", ctag), cidx
        elif internal == "local":
            atag, chosen = ("l", node), lidx
        else:
            atag, chosen = None, []
        addrs = self._addrs.get(atag)
        if addrs is None:
            addrs = self._addrs[atag] = frozenset(self.eps[i].address for i in chosen)
        return ProxyDecision(mode, ckeys, lkeys, reach, has_any, internal, external, addrs)


def proxy_gates_off(kv: KubeVersion) -> bool:
    return not kv.gate("TopologyAwareHints") and not kv.gate("ServiceTrafficDistribution")


def proxy_blocked(svc: ServiceInfo, kv: KubeVersion) -> bool:
    """kube-proxy <= 1.32 ignores hints for reasons other than the hints themselves."""
    if kv.minor >= 30:
        if proxy_gates_off(kv):
            return True
        return not kv.gate("ServiceTrafficDistribution") and not _proxy_annotation_on(svc.annotations)
    return not kv.gate("TopologyAwareHints") or not _proxy_annotation_on(svc.annotations)
