"""Where the lab's EndpointSlice hints and kube-proxy selections come from.

The lab behaves like a cluster of one Kubernetes release (:data:`KUBERNETES_VERSION`): its
EndpointSlices carry the hints that release's EndpointSlice controller writes, and each node's
kube-proxy emulation forwards to the endpoints that release's kube-proxy selects. Two sources
answer those two questions:

* :class:`OracleSource`: the upstream code itself, through the hint oracle
  (``tools/oracle``, request format in ``tools/oracle/README.md``): the controller part is
  ``k8s.io/endpointslice`` ``Reconciler.Reconcile`` with the topology cache, the kube-proxy
  part ``k8s.io/kubernetes/pkg/proxy`` ``EndpointSliceCache`` + ``CategorizeEndpoints``.
  Used whenever the oracle binary of :data:`KUBERNETES_VERSION` is built.
* :class:`ModelSource`: zonemeter's own model, ``agent.hints.controller_hints`` and
  ``agent.hints.evaluate_cluster``. Used when the oracle is not built.

:func:`hint_source` picks one (``auto``: the oracle when built, else the model) and its
:attr:`HintSource.line` says which, for the demo's output. With the oracle, the model is still
evaluated beside it, because the agents run the model: every place where it would answer
differently (hints per endpoint, controller events, a node's endpoint list) is a model bug and
is kept in :attr:`HintSource.disagreements` (the oracle's answer is what the lab uses). Where
upstream's answer depends on Go map iteration order (which zone receives an endpoint that
``topologycache`` donates), only the order-independent part is compared, as in
``tests/unit/hints/test_oracle_diff.py``: that the endpoint is donated, and the number of hints
per zone; and the controller's events as a multiset (the address families are reconciled in
map order).
"""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from agent import hints as hint_model
from agent.errors import InputError, RuntimeFailure
from tools.oracle import client as oracle_client

#: Kubernetes version the lab's controller and kube-proxy run at (the model's newest)
KUBERNETES_VERSION = hint_model.DEFAULT_VERSION

#: the choices of :func:`hint_source` (``zonemeter demo --hints``)
CHOICES = ("auto", "oracle", "model")

MANAGED_BY = "endpointslice.kubernetes.io/managed-by"
CONTROLLER = "endpointslice-controller.k8s.io"


def objects(snapshot: Mapping[str, Any]) -> tuple[list[dict[str, Any]], ...]:
    """Split a kubectl ``List`` into (Nodes, Services, EndpointSlices, Pods)."""
    items = snapshot["items"]
    return tuple([o for o in items if o.get("kind") == k]
                 for k in ("Node", "Service", "EndpointSlice", "Pod"))


def _key(obj: Mapping[str, Any]) -> str:
    return f"{obj['metadata'].get('namespace', 'default')}/{obj['metadata']['name']}"


def _slices_of(svc: Mapping[str, Any], slices: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    meta = svc["metadata"]
    return [s for s in slices if s["metadata"].get("namespace", "default") == meta.get("namespace", "default")
            and (s["metadata"].get("labels") or {}).get("kubernetes.io/service-name") == meta["name"]]


def _hint_names(h: Mapping[str, Any] | None, key: str) -> tuple[str, ...]:
    return tuple(sorted(x["name"] for x in (h or {}).get(key) or []))


def _endpoint_hints(slices: Sequence[Mapping[str, Any]]
                    ) -> dict[tuple[str, str], tuple[tuple[str, ...], tuple[str, ...]]]:
    """(address type, pod) -> (forZones, forNodes) of the controller's own slices."""
    out = {}
    for s in slices:
        if (s["metadata"].get("labels") or {}).get(MANAGED_BY) != CONTROLLER:
            continue
        for e in s.get("endpoints") or []:
            pod = (e.get("targetRef") or {}).get("name") or ",".join(e.get("addresses") or [])
            h = e.get("hints")
            out[(s.get("addressType", ""), pod)] = (_hint_names(h, "forZones"), _hint_names(h, "forNodes"))
    return out


def _endpoint_zones(slices: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], str | None]:
    out = {}
    for s in slices:
        for e in s.get("endpoints") or []:
            pod = (e.get("targetRef") or {}).get("name") or ",".join(e.get("addresses") or [])
            out[(s.get("addressType", ""), pod)] = e.get("zone")
    return out


def model_addresses(diags: Sequence[hint_model.ServiceDiagnosis]) -> dict[str, dict[str, dict[str, frozenset[str]]]]:
    """The model's kube-proxy answer: ``namespace/name`` -> address type -> node -> addresses
    internal traffic goes to (empty for DROP/REJECT), from ``ProxyDecision``."""
    out: dict[str, dict[str, dict[str, frozenset[str]]]] = {}
    for d in diags:
        out.setdefault(f"{d.namespace}/{d.name}", {})[d.address_type] = {
            n: (frozenset() if dec.internal_traffic in ("DROP", "REJECT") else frozenset(dec.internal_addresses))
            for n, dec in d.proxy.items()}
    return out


class HintSource:
    """Base of the two sources; see the module docstring.

    Attributes:
        kind: ``"oracle"`` or ``"model"``.
        version: Kubernetes minor, e.g. ``"1.37"``.
        line: one line for the user saying which source answers (and, for the model, why).
        disagreements: model bugs found beside the oracle, one line each, in the order found
            (always empty for :class:`ModelSource`).
    """

    kind = ""

    def __init__(self, version: str, line: str) -> None:
        self.version = version
        self.line = line
        self.disagreements: list[str] = []

    def controller(self, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        """Return ``snapshot`` (a kubectl ``List`` from :func:`tools.lab.snapshot.build`) with
        every controller-managed EndpointSlice's ``endpoints[].hints`` replaced by what the
        EndpointSlice controller writes on its next sync (other objects unchanged, same order).

        Raises:
            RuntimeFailure: the source failed (the oracle died or refused the request).
        """
        raise NotImplementedError

    def proxy(self, snapshot: Mapping[str, Any],
              diags: Sequence[hint_model.ServiceDiagnosis]) -> dict[str, dict[str, dict[str, frozenset[str]]]]:
        """Return what each node's kube-proxy does with each Service's ClusterIP traffic on
        ``snapshot`` (hints as given): ``namespace/name`` -> address type -> node -> endpoint
        addresses (empty for DROP/REJECT). ``diags`` is the model's diagnosis of the same
        snapshot (``agent.hints.evaluate_cluster``).

        Raises:
            RuntimeFailure: as :meth:`controller`.
        """
        raise NotImplementedError

    def close(self) -> None:
        """Stop any helper process (idempotent)."""

    def _disagree(self, text: str) -> None:
        if text not in self.disagreements:
            self.disagreements.append(text)


class ModelSource(HintSource):
    """zonemeter's model: ``agent.hints.controller_hints`` and ``evaluate_cluster``."""

    kind = "model"

    def controller(self, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        """See :meth:`HintSource.controller` (``agent.hints.controller_hints`` per Service)."""
        nodes, services, slices, _ = objects(snapshot)
        hinted: dict[str, dict[str, Any]] = {}
        for svc in services:
            new, _events = hint_model.controller_hints(svc, _slices_of(svc, slices), nodes, version=self.version)
            for s in new:
                hinted[s["metadata"]["uid"]] = s
        out = dict(snapshot)
        out["items"] = [hinted.get(o["metadata"].get("uid"), o) if o.get("kind") == "EndpointSlice" else o
                        for o in snapshot["items"]]
        return out

    def proxy(self, snapshot: Mapping[str, Any],
              diags: Sequence[hint_model.ServiceDiagnosis]) -> dict[str, dict[str, dict[str, frozenset[str]]]]:
        """See :meth:`HintSource.proxy` (the model's ``ProxyDecision.internal_addresses``)."""
        return model_addresses(diags)


def _split_endpoint(text: str) -> str:
    """``"10.0.0.1:8080"`` / ``"[fd00::1]:8080"`` -> the address."""
    host = text.rsplit(":", 1)[0]
    return str(ipaddress.ip_address(host.strip("[]")))


class OracleSource(HintSource):
    """The upstream code through ``tools.oracle.client.Oracle`` (one process, started on first
    use, stopped by :meth:`close`); the model runs beside it for :attr:`disagreements`."""

    kind = "oracle"

    def __init__(self, version: str, line: str) -> None:
        super().__init__(version, line)
        self._oracle: oracle_client.Oracle | None = None

    def _ask(self, request: dict[str, Any], what: str) -> dict[str, Any]:
        try:
            if self._oracle is None:
                self._oracle = oracle_client.Oracle(self.version, timeout=60)
            return self._oracle.ask(request)
        except oracle_client.OracleError as err:
            self.close()
            raise RuntimeFailure(f"{what}: {err}") from None

    def close(self) -> None:
        """Stop the oracle process (idempotent)."""
        o, self._oracle = self._oracle, None
        if o is not None:
            o.close()

    def controller(self, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        """See :meth:`HintSource.controller`: one ``Reconcile`` per Service on the lab's Pods
        and slices (``owner_refs: as-given``: the lab's slices are owned by their Service), the
        hints mapped back onto the lab's slices by (address type, Pod)."""
        nodes, services, slices, pods = objects(snapshot)
        hinted: dict[str, dict[str, Any]] = {}
        for svc in services:
            key = _key(svc)
            mine = _slices_of(svc, slices)
            ans = self._ask({"nodes": nodes, "service": svc, "pods": pods, "endpoint_slices": mine,
                             "owner_refs": "as-given"}, f"upstream EndpointSlice controller, Service {key}")
            ctl = ans.get("controller") or {}
            if ctl.get("error") or ctl.get("skipped"):
                raise RuntimeFailure(f"upstream EndpointSlice controller, Service {key}: "
                                     f"{ctl.get('error') or ctl.get('skipped')}")
            types = {s["metadata"]["name"]: s.get("addressType", "") for s in ctl.get("slices") or []}
            theirs = {(types.get(e["slice"], ""), e.get("pod") or ",".join(e.get("addresses") or [])): e.get("hints")
                      for e in ctl.get("endpoints") or []}
            new = []
            for s in mine:
                s = {**s, "endpoints": [dict(e) for e in s.get("endpoints") or []]}
                if (s["metadata"].get("labels") or {}).get(MANAGED_BY) == CONTROLLER:
                    for e in s["endpoints"]:
                        pk = (s.get("addressType", ""), (e.get("targetRef") or {}).get("name", ""))
                        if pk not in theirs:
                            raise RuntimeFailure(f"upstream EndpointSlice controller, Service {key}: "
                                                 f"it writes no {pk[0]} endpoint for Pod {pk[1]}")
                        if theirs[pk]:
                            e["hints"] = theirs[pk]
                        else:
                            e.pop("hints", None)
                hinted[s["metadata"]["uid"]] = s
                new.append(s)
            self._compare_controller(svc, mine, nodes, new, ctl.get("events") or [])
        out = dict(snapshot)
        out["items"] = [hinted.get(o["metadata"].get("uid"), o) if o.get("kind") == "EndpointSlice" else o
                        for o in snapshot["items"]]
        return out

    def _compare_controller(self, svc: dict[str, Any], before: list[dict[str, Any]], nodes: list[dict[str, Any]],
                            upstream: list[dict[str, Any]], events: list[dict[str, Any]]) -> None:
        key = _key(svc)
        try:
            model, model_events = hint_model.controller_hints(svc, before, nodes, version=self.version)
        except InputError as err:
            self._disagree(f"Service {key}: the model refuses what upstream accepts ({err})")
            return
        # upstream reconciles the address families in Go map order, so events are compared
        # as a multiset
        got = [e.to_json() for e in model_events]
        if sorted(map(str, got)) != sorted(map(str, events)):
            self._disagree(f"Service {key}: controller events: model {got}, upstream {events}")
        mine, theirs = _endpoint_hints(model), _endpoint_hints(upstream)
        zone = _endpoint_zones(upstream)

        def donated(h: tuple[tuple[str, ...], tuple[str, ...]], pk: tuple[str, str]) -> bool:
            return bool(h[0]) and h[0] != (zone.get(pk),)

        for pk in sorted(set(mine) | set(theirs)):
            m, t = mine.get(pk, ((), ())), theirs.get(pk, ((), ()))
            same = (donated(m, pk) and donated(t, pk)) if (donated(m, pk) or donated(t, pk)) else m == t
            if not same:
                self._disagree(f"Service {key}: {pk[0]} hints of Pod {pk[1]}: model forZones {list(m[0])} "
                               f"forNodes {list(m[1])}, upstream forZones {list(t[0])} forNodes {list(t[1])}")
        for at in sorted({pk[0] for pk in theirs}):
            cm = Counter(z for pk, h in mine.items() if pk[0] == at for z in h[0])
            ct = Counter(z for pk, h in theirs.items() if pk[0] == at for z in h[0])
            if cm != ct:
                self._disagree(f"Service {key}: {at} hints per zone: model {dict(sorted(cm.items()))}, "
                               f"upstream {dict(sorted(ct.items()))}")

    def proxy(self, snapshot: Mapping[str, Any],
              diags: Sequence[hint_model.ServiceDiagnosis]) -> dict[str, dict[str, dict[str, frozenset[str]]]]:
        """See :meth:`HintSource.proxy`: kube-proxy only (``controller: false``) on the
        snapshot's slices for every node, per address family of the Service; internal traffic
        uses the ``local`` list with ``internalTrafficPolicy: Local``, else ``cluster``
        (``pkg/proxy/iptables/proxier.go syncProxyRules``: ``internalTrafficChain``). Every
        Service port must give the same addresses (the lab programs one list per Service).
        A headless Service is not asked: kube-proxy skips it (``ShouldSkipService``), and so
        do the lab and the agents' model."""
        nodes, services, slices, _ = objects(snapshot)
        model = model_addresses(diags)
        out: dict[str, dict[str, dict[str, frozenset[str]]]] = {}
        for svc in services:
            key = _key(svc)
            spec = svc.get("spec") or {}
            if spec.get("clusterIP") == "None":
                continue
            local = spec.get("internalTrafficPolicy") == "Local"
            for at in spec.get("ipFamilies") or ["IPv4"]:
                what = f"upstream kube-proxy, Service {key} ({at})"
                ans = self._ask({"address_type": at, "nodes": nodes, "service": svc,
                                 "endpoint_slices": _slices_of(svc, slices), "controller": False,
                                 "proxy_nodes": "all", "proxy_slices": "input"}, what)
                if ans.get("proxy_skipped"):
                    raise RuntimeFailure(f"{what}: {ans['proxy_skipped']}")
                per_node: dict[str, frozenset[str]] = {}
                for node, ports in (ans.get("proxy") or {}).items():
                    lists = {frozenset(_split_endpoint(x) for x in (p["local"] if local else p["cluster"]) or [])
                             for p in ports.values()}
                    if len(lists) > 1:
                        raise RuntimeFailure(f"{what}: node {node} selects different endpoints per Service "
                                             "port; the lab programs one list per Service")
                    per_node[node] = next(iter(lists), frozenset())
                out.setdefault(key, {})[at] = per_node
                mine = model.get(key, {}).get(at)
                if mine is None:
                    self._disagree(f"Service {key} ({at}): the model has no kube-proxy answer")
                    continue
                for node in sorted(set(mine) | set(per_node)):
                    m, t = mine.get(node, frozenset()), per_node.get(node, frozenset())
                    if m != t:
                        self._disagree(f"Service {key} ({at}) node {node}: kube-proxy endpoints: model "
                                       f"{sorted(m)}, upstream {sorted(t)}")
        return out


def hint_source(choice: str = "auto", version: str = KUBERNETES_VERSION) -> HintSource:
    """Return the source the lab takes hints and kube-proxy selections from.

    Args:
        choice: ``"auto"`` (the oracle when its binary for ``version`` is built, else the
            model), ``"oracle"`` or ``"model"``.
        version: Kubernetes minor, e.g. ``"1.37"``.

    Raises:
        InputError: unknown ``choice``.
        RuntimeFailure: ``"oracle"`` while the oracle for ``version`` is not built (the message
            names the build command).
    """
    if choice not in CHOICES:
        raise InputError(f"want one of {', '.join(CHOICES)}, got {choice!r}", source="--hints")
    build = f"bash tools/oracle/build.sh {version}"
    built = oracle_client.binary(version).is_file()
    if choice == "oracle" and not built:
        raise RuntimeFailure(f"upstream oracle {version} not built ({oracle_client.binary(version)} "
                             f"missing); run: {build}")
    prefix = "hints and kube-proxy endpoints: "
    if choice != "model" and built:
        return OracleSource(version, prefix + f"upstream oracle {version} (tools/oracle)")
    why = "--hints model" if choice == "model" else f"oracle not built: {build}"
    return ModelSource(version, prefix + f"zonemeter's model ({why})")


class RealSource(HintSource):
    """The real components of a lab on real Kubernetes (``Lab(kubernetes="real")``): the hints
    are what the real EndpointSlice controller wrote on the apiserver, the selections what each
    node's real kube-proxy programmed (read back from its rules). A node that runs the lab's
    emulation instead (``ignoreHints: true``) has no real kube-proxy to ask: its selection is the
    model's, i.e. what a kube-proxy that honours hints would use there (so bytes its data plane
    sends elsewhere are hint-ignored, as with the other sources). Where the model, evaluated on
    the same objects, answers otherwise (hints per endpoint, a node's endpoints) the difference
    is kept in :attr:`disagreements`; the real answer is what the demo judges by.

    Args:
        lab: the running lab (real mode).
        settle_s: how long to wait for the kube-proxies to match the model before a remaining
            difference is recorded as a disagreement (they program asynchronously).
    """

    kind = "real"

    def __init__(self, lab: Any, settle_s: float = 10.0) -> None:
        cp = lab.control_plane()
        super().__init__(KUBERNETES_VERSION, "hints and kube-proxy endpoints: the real EndpointSlice controller and "
                         f"kube-proxy {cp.binaries.kube_version} ({lab.proxy_mode} mode) on an apiserver in "
                         f"{lab.kube_netns}")
        self.lab = lab
        self.settle_s = settle_s

    def controller(self, snapshot: Mapping[str, Any]) -> dict[str, Any]:
        """See :meth:`HintSource.controller`: ``snapshot`` is ignored; the apiserver's objects once
        the controller lists every lab endpoint (``Lab.real_objects``)."""
        self.lab.wait_for_slices()
        objs: dict[str, Any] = self.lab.real_objects()
        nodes, services, slices, _ = objects(objs)
        for svc in services:
            mine = _slices_of(svc, slices)
            try:
                model, _events = hint_model.controller_hints(svc, mine, nodes, version=self.version)
            except InputError as err:
                self._disagree(f"Service {_key(svc)}: the model refuses what the real controller serves ({err})")
                continue
            ours, real = _endpoint_hints(model), _endpoint_hints(mine)
            for pk in sorted(set(ours) | set(real)):
                m, t = ours.get(pk, ((), ())), real.get(pk, ((), ()))
                if m != t:
                    self._disagree(f"Service {_key(svc)}: {pk[0]} hints of Pod {pk[1]}: model forZones {list(m[0])} "
                                   f"forNodes {list(m[1])}, real controller forZones {list(t[0])} "
                                   f"forNodes {list(t[1])}")
        return objs

    def proxy(self, snapshot: Mapping[str, Any],
              diags: Sequence[hint_model.ServiceDiagnosis]) -> dict[str, dict[str, dict[str, frozenset[str]]]]:
        """See :meth:`HintSource.proxy`: the real kube-proxy's rules for the Service's ports (all
        must agree), the model's answer on emulated nodes."""
        import time

        self.lab.wait_kube_proxies()
        model = model_addresses(diags)
        topo = self.lab.topology
        deadline = time.monotonic() + self.settle_s
        while True:
            out: dict[str, dict[str, dict[str, frozenset[str]]]] = {}
            diffs: list[str] = []
            programmed = {n.name: self.lab.programmed_endpoints(n.name) for n in topo.nodes
                          if self.lab.uses_kube_proxy(n.name)}
            for svc in topo.services:
                for at, cip in (("IPv4", svc.cluster_ip), ("IPv6", svc.cluster_ip6)):
                    if cip is None:
                        continue
                    mine = model.get(svc.key, {}).get(at, {})
                    per_node: dict[str, frozenset[str]] = {}
                    for n in topo.nodes:
                        if n.name not in programmed:
                            per_node[n.name] = mine.get(n.name, frozenset())
                            continue
                        lists = {frozenset(_split_endpoint(e) for e in programmed[n.name].get(
                            (str(cip), sp.protocol, sp.port), [])) for sp in svc.ports}
                        if len(lists) > 1:
                            raise RuntimeFailure(f"real kube-proxy, Service {svc.key} ({at}): node {n.name} selects "
                                                 "different endpoints per Service port; the demo judges one list")
                        per_node[n.name] = next(iter(lists), frozenset())
                        if per_node[n.name] != mine.get(n.name, frozenset()):
                            diffs.append(f"Service {svc.key} ({at}) node {n.name}: kube-proxy endpoints: model "
                                         f"{sorted(mine.get(n.name, frozenset()))}, real kube-proxy "
                                         f"{sorted(per_node[n.name])}")
                    out.setdefault(svc.key, {})[at] = per_node
            if not diffs or time.monotonic() > deadline:
                for d in diffs:
                    self._disagree(d)
                return out
            time.sleep(0.3)
