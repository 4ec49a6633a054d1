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
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
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
from agent.hints.versions import DEFAULT_VERSION, KubeVersion
from agent.hints.vocabulary import ANNOTATION_DEPRECATED, ANNOTATION_TOPOLOGY_MODE
from agent.k8s.parse import (
    LABEL_SERVICE_NAME,
    LABEL_ZONE,
    Endpoint,
    Hints,
    NodeEntry,
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
                "allocations": None if c.allocations is None
                else {z: a.to_json() for z, a in c.allocations.items()},
                "hints": {a: hints_json(h) for a, h in c.hints.items()},
            },
            "observed_hints": {a: hints_json(h) for a, h in self.observed_hints.items()},
            "proxy": {n: self.proxy[n].to_json() for n in keys},
            "locality_in_effect": dict(self.locality_in_effect),
            "reason": self.reason,
            "warnings": [w.to_json() for w in self.warnings],
        }


def _zone_groups(idx: ClusterIndex, proxy: Mapping[str, ProxyDecision], special: Collection[str]
                 ) -> list[tuple[str, ProxyDecision, int, list[str]]]:
    """Distinct kube-proxy decisions per client zone without visiting every node.

    Returns:
        (client zone, decision, number of nodes with it, up to 5 of their names) tuples;
        nodes that host or are hinted by no endpoint share one decision per zone.
    """
    out: list[tuple[str, ProxyDecision, int, list[str]]] = []
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
            out.append((z, proxy[sample[0]], generic, sample))
        for n in sp:
            out.append((z, proxy[n], 1, [n]))
    return out


def _names(items: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


def diagnose(svc: ServiceInfo, at: str, slices: Sequence[Slice], idx: ClusterIndex,
             kv: KubeVersion, populated: bool) -> ServiceDiagnosis:
    """Controller + kube-proxy + diagnosis for one Service and address family.

    Args:
        svc: the Service.
        at: ``IPv4`` or ``IPv6``.
        slices: every slice labelled for the Service with that address type (any manager).
        idx: cluster index.
        kv: version and gates.
        populated: topology cache's populated mark for the Service before this family.
    """
    managed = [s for s in slices if s.managed]
    ctrl = reconcile(svc, managed, at, idx.capacity, kv, populated)
    observed = AddressHints([(s.endpoints, [e.hints for e in s.endpoints]) for s in slices])
    pidx = ProxyIndex(svc, slices, kv)
    peps, port, special = pidx.eps, pidx.port, pidx.special_nodes
    proxy: Mapping[str, ProxyDecision] = {} if svc.headless else ProxyMap(idx.node_zone, special, pidx.decide)
    warnings: list[DiagnosisWarning] = []
    ann_key, ann_val = effective_annotation(svc.annotations)
    auto = hints_enabled(svc.annotations)
    td = svc.traffic_distribution
    td_ok = valid_traffic_distribution(td, kv)
    cache = kv.gate("TopologyAwareHints")

    # --- locality per client zone (internal traffic)
    locality: dict[str, bool] = {}
    groups = [] if svc.headless else _zone_groups(idx, proxy, special)
    for z, d, _, _ in groups:
        if z not in idx.ready_zones:
            continue  # no Ready node there, so no client either
        ok_ = d.internal_traffic == "cluster" and d.topology_mode in ("PreferSameZone", "PreferSameNode")
        locality[z] = locality.get(z, True) and ok_

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
            "or \"auto\")" + ("; kube-proxy <= 1.32 still treats it as enabled" if kv.minor <= 32 else "")))
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
        dropped = [(c, ns_) for _, d, c, ns_ in groups if d.internal_traffic == "DROP"]
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
        for z, d, _, _ in groups:
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
    elif hinted and kv.minor <= 32 and proxy_blocked(svc, kv):
        reason = "feature-gate-disabled" if proxy_gates_off(kv) else "not-requested"
    elif locality and all(locality.values()):
        reason = "none"
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
        headless=svc.headless)


def evaluate_cluster(nodes: list[dict[str, Any]], services: list[dict[str, Any]],
                     endpointslices: list[dict[str, Any]], pods: list[dict[str, Any]] | None = None,
                     *, version: str = DEFAULT_VERSION, feature_gates: Mapping[str, bool] | None = None,
                     hints_populated: Collection[str] | None = None, strict: bool = False,
                     errors: list[InputError] | None = None) -> list[ServiceDiagnosis]:
    """Diagnose every Service of a cluster (one entry per Service and address family).

    Args:
        nodes, services, endpointslices: API-shaped dicts (``kubectl get -o json`` items).
        pods: accepted for API stability; the model reads endpoint state from the slices
            (the controller's own output), so pods are currently not consulted.
        version: ``"1.27"`` .. ``"1.37"``.
        feature_gates: gate overrides (name -> bool), validated per version.
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
                         [parse_slice_entry(s) for s in endpointslices], kv, hints_populated, strict, errors)
    finally:
        if was_enabled:
            gc.enable()


def evaluate_parsed(nodes: Sequence[NodeEntry], services: Sequence[ServiceEntry],
                    endpointslices: Sequence[SliceEntry], *, version: str = DEFAULT_VERSION,
                    feature_gates: Mapping[str, bool] | None = None,
                    hints_populated: Collection[str] | None = None, strict: bool = False,
                    errors: list[InputError] | None = None) -> list[ServiceDiagnosis]:
    """:func:`evaluate_cluster` over objects already parsed (the metadata cache's entries).

    Args:
        nodes, services, endpointslices: entries from :func:`agent.k8s.parse.parse_node_entry`,
            :func:`~agent.k8s.parse.parse_service_entry` and
            :func:`~agent.k8s.parse.parse_slice_entry` (a record, or the error parsing
            raised, which is reported here exactly as :func:`evaluate_cluster` reports it).
        version, feature_gates, hints_populated, strict, errors: as :func:`evaluate_cluster`.

    Returns:
        as :func:`evaluate_cluster`.

    Raises:
        InputError: bad version/gates; a malformed object when ``strict``.
    """
    kv = KubeVersion.parse(version, feature_gates)
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _evaluate(nodes, services, endpointslices, kv, hints_populated, strict, errors)
    finally:
        if was_enabled:
            gc.enable()


def _evaluate(nodes: Sequence[NodeEntry], services: Sequence[ServiceEntry],
              endpointslices: Sequence[SliceEntry], kv: KubeVersion,
              hints_populated: Collection[str] | None, strict: bool,
              errors: list[InputError] | None) -> list[ServiceDiagnosis]:
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
            d = diagnose(svc, at, [s for s in slices if s.address_type == at], idx, kv, populated)
            populated = d.controller.populated_after
            out.append(d)
    return out
