"""The incremental hint model: per-Service diagnoses, kube-proxy views, and the Services' locality.

:class:`HintModel` keeps one :class:`agent.hints.ServiceDiagnosis` per Service and address
family, re-evaluating only the Services the cache reports dirty
(``ClusterMetadata.take_dirty``), all of them after a Node change, a relist or a snapshot
load. It owns each Service's :class:`agent.records.Locality` and stamps its
``last_change`` at the refresh in which ``(mode, reason, in_effect)`` changed or was first
seen. Dual-stack Services have one diagnosis per family; :func:`merge_locality` and
:func:`merge_views` merge them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType

from agent.errors import InputError
from agent.hints.diagnosis import ServiceDiagnosis, evaluate_parsed
from agent.hints.versions import DEFAULT_VERSION, KubeVersion, covered_version, parse_proxy_flag
from agent.k8s import ClusterMetadata, DirtySet, NodeEntry, ServiceEntry, SliceEntry
from agent.logs import LogOnce
from agent.records import Locality, ProxyView, ServiceRef

log = logging.getLogger(__name__)

ServiceName = tuple[str, str]  # (namespace, name)

#: what decides whether a Service's locality changed: (mode, reason, in_effect items)
_LocalityState = tuple[str, str, frozenset[tuple[str, bool]]]


def merge_locality(diags: Iterable[ServiceDiagnosis], at: float) -> Locality:
    """Merge the per-family diagnoses of one Service into one :class:`agent.records.Locality`.

    A dual-stack Service has locality in a zone only when every family has it (a client
    may use either family); ``reason`` is the first family's that is not ``none``; ``mode``
    is the first family's (both families share the Service's spec); the expected cross-zone
    share of a zone is the largest of the families' (the family a client uses is not known).

    Args:
        diags: the Service's diagnoses, one per address family (may be empty).
        at: Unix time in seconds stamped as ``last_change``.

    Returns:
        the merged Locality; ``in_effect`` is a read-only mapping sorted by zone.
    """
    ds = list(diags)
    mode = ds[0].mode if ds else "none"
    reason = next((d.reason for d in ds if d.reason != "none"), "none")
    zones: dict[str, bool] = {}
    expected: dict[str, float] = {}
    for d in ds:
        for zone, on in d.locality_in_effect.items():
            zones[zone] = zones.get(zone, True) and bool(on)
        for zone, share in d.expected_cross_zone.items():
            if share is not None:
                expected[zone] = max(expected.get(zone, 0.0), share)
    return Locality(mode, reason, MappingProxyType(dict(sorted(zones.items()))), at,
                    MappingProxyType(dict(sorted(expected.items()))))


def _state(loc: Locality) -> _LocalityState:
    return (loc.mode, loc.reason, frozenset(loc.in_effect.items()))


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
    """``HintView`` (agent/attribution/join.py) over the cache's parsed records; owns locality.

    Call :meth:`refresh` once per interval, from the agent loop; the Attributor and the
    exporter then read :meth:`proxy_view`, :meth:`services`, :meth:`localities` (and
    :meth:`locality`, :meth:`diagnoses`) from the same thread.

    Args:
        cache: the metadata cache whose parsed records (:meth:`ClusterMetadata.model_inputs`)
            feed the model.
        version: the control plane's Kubernetes minor version the model reproduces
            (``"1.27"`` .. ``"1.37"``).
        feature_gates: gate overrides for that version (not for kube-proxies of another
            version, which run their version's defaults).
        kube_proxy_version: ``"1.X"`` judges every node's kube-proxy as that version
            (``--kube-proxy-version X.Y``); None (``auto``) reads each Node's
            ``status.nodeInfo`` (:func:`agent.hints.diagnosis.proxy_versions`). A Node's
            version change is a Node change, which re-evaluates every Service.
        version_source: where ``version`` came from (one of
            :data:`agent.hints.versions.VERSION_SOURCES`), for :meth:`model_info`.

    Raises:
        InputError: a bad version or feature gate (``--kubernetes-version``,
            ``--feature-gates``, ``--kube-proxy-version``).
    """

    def __init__(self, cache: ClusterMetadata, version: str = DEFAULT_VERSION,
                 feature_gates: Mapping[str, bool] | None = None, *,
                 kube_proxy_version: str | None = None, version_source: str = "flag") -> None:
        try:
            self.kube_version = KubeVersion.parse(version, feature_gates)
        except InputError as err:
            raise err.with_source("--kubernetes-version/--feature-gates") from None
        self.kube_proxy_version = None if kube_proxy_version is None else parse_proxy_flag(kube_proxy_version)
        self.version_source = version_source
        self.cache = cache
        self.version = version
        self.feature_gates = dict(feature_gates or {})
        self._diags: dict[ServiceName, tuple[ServiceDiagnosis, ...]] = {}
        self._locality: dict[ServiceRef, Locality] = {}
        self._localities_view: Mapping[ServiceRef, Locality] = MappingProxyType(self._locality)
        self._views: dict[tuple[str, str, str], ProxyView | None] = {}
        self._once = LogOnce(log, limit=1000)
        #: objects the model skipped as malformed (cumulative)
        self.bad_objects = 0
        #: Services (re-)evaluated by the last refresh
        self.last_evaluated = 0

    def refresh(self, dirty: DirtySet | None = None, at: float | None = None) -> int:
        """Re-evaluate the Services that changed, and their locality.

        Args:
            dirty: from ``ClusterMetadata.take_dirty()``; None or ``all=True`` re-evaluates
                every Service (zones and allocatable CPU feed every Service's hints).
            at: Unix time in seconds of this refresh (default ``time.time()``): the
                ``last_change`` of every Service whose ``(mode, reason, in_effect)``
                changed, or which is seen for the first time, in this refresh. A Service
                whose locality did not change keeps its :class:`agent.records.Locality`
                object (and ``last_change``).

        Returns:
            number of Services evaluated.
        """
        now = time.time() if at is None else at
        nodes, services, slices = self.cache.model_inputs()
        if dirty is None or dirty.all:
            diags = self._evaluate(nodes, services, slices)
            new: dict[ServiceName, list[ServiceDiagnosis]] = {}
            for d in diags:
                new.setdefault((d.namespace, d.name), []).append(d)
            self._diags = {k: tuple(v) for k, v in new.items()}
            old = self._locality
            self._locality = {}
            for (ns, name), ds in self._diags.items():
                ref = ServiceRef(ns, name)
                self._locality[ref] = self._stamp(old.get(ref), ds, now)
            self._localities_view = MappingProxyType(self._locality)
            self._views = {}
            self.last_evaluated = len(self._diags)
            return self.last_evaluated
        # one evaluate_cluster call for every dirty Service: the node index (O(nodes)) is
        # built once per refresh, not once per Service
        keys = sorted(dirty.services)
        svcs: list[ServiceEntry] = []
        svc_slices: list[SliceEntry] = []
        for ns, name in keys:
            svc, slices_ = self.cache.service_inputs(ns, name)
            if svc is not None:
                svcs.append(svc)
                svc_slices.extend(slices_)
        got: dict[ServiceName, list[ServiceDiagnosis]] = {}
        for d in self._evaluate(nodes, svcs, svc_slices) if svcs else []:
            got.setdefault((d.namespace, d.name), []).append(d)
        # a new dict, so a mapping handed out by localities() keeps its refresh's state
        locality = dict(self._locality)
        for key in keys:
            mine = got.get(key)
            ref = ServiceRef(*key)
            if mine:
                self._diags[key] = tuple(mine)
                locality[ref] = self._stamp(locality.get(ref), mine, now)
            else:  # deleted, ExternalName, or malformed
                self._diags.pop(key, None)
                locality.pop(ref, None)
        self._locality = locality
        self._localities_view = MappingProxyType(locality)
        changed = set(keys)
        self._views = {k: v for k, v in self._views.items() if (k[0], k[1]) not in changed}
        self.last_evaluated = len(keys)
        return len(keys)

    @staticmethod
    def _stamp(prev: Locality | None, diags: Iterable[ServiceDiagnosis], at: float) -> Locality:
        """The Service's new Locality, or ``prev`` itself when nothing in it changed; when
        only the expected cross-zone shares changed, a new Locality keeping ``prev``'s
        ``last_change`` (the shares are not part of the locality state)."""
        loc = merge_locality(diags, at)
        if prev is not None and _state(prev) == _state(loc):
            if dict(prev.expected_cross_zone) == dict(loc.expected_cross_zone):
                return prev
            return Locality(loc.mode, loc.reason, loc.in_effect, prev.last_change, loc.expected_cross_zone)
        return loc

    def _evaluate(self, nodes: Sequence[NodeEntry], services: Sequence[ServiceEntry],
                  slices: Sequence[SliceEntry]) -> list[ServiceDiagnosis]:
        errors: list[InputError] = []
        notes: list[tuple[str, str]] = []
        out = evaluate_parsed(nodes, services, slices, version=self.version,
                              feature_gates=self.feature_gates, errors=errors,
                              kube_proxy_version=self.kube_proxy_version, notes=notes)
        self.bad_objects += len(errors)
        for err in errors:
            text = str(err)
            self._once(text, logging.WARNING, "hint model skipped an object: %s", text)
        for reported, sentence in notes:
            self._once("kube-proxy-version:" + reported, logging.WARNING, "%s", sentence)
        return out

    def model_info(self, node: str) -> tuple[str, str, str, str]:
        """What the model assumes, for ``zonemeter_hint_model_info``.

        Args:
            node: the node whose kube-proxy version is reported (the agent's own).

        Returns:
            ``(kubernetes_version, kube_proxy_version, source, kube_proxy_source)``:
            versions as ``"1.X"``; ``source`` one of
            :data:`agent.hints.versions.VERSION_SOURCES`; ``kube_proxy_source`` one of
            :data:`agent.hints.versions.PROXY_VERSION_SOURCES` (``default``: the node
            reports no readable version, or is not known yet, so it is judged at the
            control plane's version).
        """
        kv = str(self.kube_version)
        if self.kube_proxy_version is not None:
            return kv, self.kube_proxy_version, self.version_source, "flag"
        entry = self.cache.node_entry(node)
        reported = entry[0].proxy_version if entry is not None and entry[0] is not None else None
        got = None if reported is None else covered_version(reported, f"Node {node}")[0]
        if got is None:
            return kv, kv, self.version_source, "default"
        return kv, got, self.version_source, "node"

    # ------------------------------------------------------------------ readers

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

    def localities(self) -> Mapping[ServiceRef, Locality]:
        """Every diagnosed Service's locality, as of the last :meth:`refresh`.

        Returns:
            a read-only mapping ``ServiceRef -> Locality`` (no particular order); it
            does not change after it is returned (each refresh makes a new one), so
            another thread may read it while the loop refreshes.
        """
        return self._localities_view

    def locality(self, namespace: str, service: str) -> Locality | None:
        """The Service's locality (the same object until its state changes), or None."""
        return self._locality.get(ServiceRef(namespace, service))

    def diagnoses(self, namespace: str, service: str) -> tuple[ServiceDiagnosis, ...]:
        """The model's per-family diagnoses of a Service (empty when unknown)."""
        return self._diags.get((namespace, service), ())
