"""The shared reference vectors, judged by the upstream code itself (tools/oracle).

Every vector of ``../shared/vectors/hints.json`` (next to the clone, else the copy vendored in
tests/unit/hints/vectors/, :data:`vectors_adapter.VECTORS_PATH`; schema in the vector file's
own documentation, section 0) is turned into an oracle request and run at every Kubernetes minor
its ``versions`` text claims that the oracle covers (1.31+), with the vector's gates:

* ``auto-hints``: ``TopologyCache.SetNodes`` + ``AddHints`` on the vector's slices, in the
  vector's order (the order the vectors fix; the controller itself builds new slices from an
  unordered set). Checked: events, hints per endpoint (``forZones_one_of`` where Go map order
  decides), hint counts per zone, unchanged slices kept.
* ``traffic-distribution``: the reconciler on one existing controller slice holding the
  endpoints (existing hints included) with Pods built back from it. Checked: hints per endpoint
  and events.
* ``proxy-selection``: kube-proxy's trackers + ``CategorizeEndpoints`` for the local node.
  Checked: cluster, local and all-reachable endpoints, has-any. The topology mode and the
  DROP/REJECT outcome are not upstream return values, so they are not compared here.

A vector endpoint whose node is not among the vector's Nodes is placed on a vector Node of its
zone (or on an added Ready node carrying its zone), because the controller takes the zone from
the node and drops endpoints on unknown nodes (``reconcileByAddressType``).

The oracle binaries are built by ``tools/oracle/build.sh MINOR``. Where a minor is not built the
case is skipped naming the build command, except under CI or ``ZONEMETER_ORACLE_REQUIRED=1``
where it fails.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.unit.hints import vectors_adapter as va
from tools.oracle import client as oc

REPO = Path(__file__).resolve().parents[3]


VECTORS = va.VECTORS_PATH
ZONE = "topology.kubernetes.io/zone"
CP = "node-role.kubernetes.io/control-plane"
MASTER = "node-role.kubernetes.io/master"
MANAGED = {"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}
NS, SVC = "vec", "svc"
ORACLE_MINORS = range(31, 38)
#: a "1.N with gate" qualifier that names no gate means the gate this minor needs for it
GATE_FOR_MINOR = {31: "ServiceTrafficDistribution", 32: "ServiceTrafficDistribution",
                  33: "PreferSameTrafficDistribution"}


def _load() -> list[dict[str, Any]]:
    return va.load_vectors()


def minors_for(vector: dict[str, Any]) -> list[tuple[int, dict[str, bool]]]:
    """(minor, gates) for every oracle-covered minor the ``versions`` text claims."""
    main, _, paren = vector["versions"].partition("(")
    base = dict(vector["input"].get("feature_gates") or {})
    out: dict[int, dict[str, bool]] = {}
    for m in re.finditer(r"1\.(\d+)(?:-1\.(\d+))?", main):
        for minor in range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1):
            out[minor] = dict(base)
    for m in re.finditer(r"1\.(\d+)\s+(?:with|needs)\s+([A-Za-z]*)\s*gate", paren):
        minor = int(m.group(1))
        if minor in GATE_FOR_MINOR or m.group(2):
            out[minor] = {**base, (m.group(2) or GATE_FOR_MINOR[minor]): True}
    for m in re.finditer(r"1\.(\d+)\s+with gate on", paren):
        if int(m.group(1)) in GATE_FOR_MINOR:
            out[int(m.group(1))] = {**base, GATE_FOR_MINOR[int(m.group(1))]: True}
    return [(mi, g) for mi, g in sorted(out.items()) if mi in ORACLE_MINORS]


def _node(n: dict[str, Any]) -> dict[str, Any]:
    labels: dict[str, str] = {}
    if n.get("zone") is not None:
        labels[ZONE] = n["zone"]
    if n.get("control_plane"):
        labels[CP] = ""
    if n.get("master_label"):
        labels[MASTER] = ""
    return {"name": n["name"], "labels": labels, "allocatable_cpu": n["allocatable_cpu"],
            "ready": n["ready"]}


def _address(name: str, i: int, family: str) -> str:
    try:
        ip = ipaddress.ip_address(name)
        if (ip.version == 6) == (family == "IPv6"):
            return name
    except ValueError:
        pass
    return f"fd00::{i + 1:x}" if family == "IPv6" else f"10.250.{i // 256}.{i % 256}"


def _hints(h: dict[str, Any] | None) -> dict[str, Any] | None:
    if h is None:
        return None
    out: dict[str, Any] = {}
    if h.get("forZones") is not None:
        out["forZones"] = [{"name": z} for z in h["forZones"]]
    if h.get("forNodes") is not None:
        out["forNodes"] = [{"name": n} for n in h["forNodes"]]
    return out


def _endpoint(e: dict[str, Any], i: int, family: str, node: str | None, zone: str | None) -> dict[str, Any]:
    ep: dict[str, Any] = {"addresses": [_address(e["name"], i, family)],
                          "conditions": {}, "targetRef": {"kind": "Pod", "namespace": NS, "name": e["name"]}}
    if e.get("ready") is not None:
        ep["conditions"] = {"ready": e["ready"], "serving": e["ready"], "terminating": False}
    if node is not None:
        ep["nodeName"] = node
    if zone is not None:
        ep["zone"] = zone
    if e.get("hints") is not None:
        ep["hints"] = _hints(e["hints"])
    return ep


def _slice(name: str, family: str, endpoints: list[dict[str, Any]], port: int = 80) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": NS,
                         "labels": {"kubernetes.io/service-name": SVC, **MANAGED}},
            "addressType": family, "ports": [{"name": "", "port": port, "protocol": "TCP"}],
            "endpoints": endpoints}


def _service(s: dict[str, Any], family: str) -> dict[str, Any]:
    cip = "fd00:96::1" if family == "IPv6" else "10.96.0.1"
    typ = s.get("type", "ClusterIP")
    spec: dict[str, Any] = {"selector": {"app": SVC}, "type": typ, "clusterIP": cip, "clusterIPs": [cip],
                            "ipFamilies": [family],
                            "ports": [{"name": "", "port": 80, "protocol": "TCP", "targetPort": 80}]}
    for k in ("trafficDistribution", "internalTrafficPolicy", "externalTrafficPolicy"):
        if s.get(k) is not None:
            spec[k] = s[k]
    svc: dict[str, Any] = {"metadata": {"name": SVC, "namespace": NS, "annotations": s.get("annotations") or {}},
                           "spec": spec}
    if typ in ("NodePort", "LoadBalancer"):
        spec["ports"][0]["nodePort"] = 30080
    if typ == "LoadBalancer":
        svc["status"] = {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}
    return svc


# ----------------------------------------------------------------------------------- requests


def request_for(vector: dict[str, Any], gates: dict[str, bool]) -> dict[str, Any]:
    """The oracle request that asks upstream the vector's question."""
    inp, kind = vector["input"], vector["kind"]
    family = inp.get("address_type", "IPv4")
    req: dict[str, Any] = {"feature_gates": gates, "address_type": family}
    if kind == "auto-hints":
        slices = inp.get("slices") or [{"name": "vec-new", "state": "create", "endpoints": inp["endpoints"]}]
        lists: dict[str, list[dict[str, Any]]] = {"to_create": [], "to_update": [], "unchanged": []}
        key = {"create": "to_create", "update": "to_update", "unchanged": "unchanged"}
        i = 0
        for s in slices:
            eps = []
            for e in s["endpoints"]:
                eps.append(_endpoint(e, i, family, e.get("node"), e.get("zone")))
                i += 1
            lists[key[s["state"]]].append(_slice(s["name"], family, eps))
        req.update(nodes=[_node(n) for n in inp["nodes"]], add_hints=lists,
                   service=_service(inp["service"], family))
        if inp.get("previously_enabled"):
            req["topology_cache"] = {family: {"populated": True}}
        return req
    if kind == "traffic-distribution":
        nodes = [_node(n) for n in inp["nodes"]]
        by_name = {n["name"]: n for n in inp["nodes"]}
        eps = []
        for i, e in enumerate(inp["endpoints"]):
            node = e.get("node")
            if node not in by_name:
                same = [n["name"] for n in inp["nodes"] if n.get("zone") == e.get("zone")]
                if same:
                    node = same[0]
                else:
                    node = node or f"vec-node-{e.get('zone')}"
                    nodes.append(_node({"name": node, "zone": e.get("zone"), "ready": True,
                                        "allocatable_cpu": "1"}))
                    by_name[node] = {"name": node, "zone": e.get("zone")}
            eps.append(_endpoint(e, i, family, node, by_name[node].get("zone")))
        req.update(nodes=nodes, service=_service(inp["service"], family),
                   endpoint_slices=[_slice("vec-1", family, eps)])
        if inp.get("previously_enabled"):
            req["topology_cache"] = {family: {"populated": True}}
        return req
    # proxy-selection
    local = inp["local_node"]
    labels = {ZONE: local["zone"]} if local.get("zone") is not None else {}
    by_port: dict[int, list[dict[str, Any]]] = {}
    for e in inp["endpoints"]:
        ip, _, port = e["ip"].rpartition(":")
        ep: dict[str, Any] = {"addresses": [ip.strip("[]")], "conditions": {}}
        for c in ("ready", "serving", "terminating"):
            if e.get(c) is not None:
                ep["conditions"][c] = e[c]
        if e.get("node") is not None:
            ep["nodeName"] = e["node"]
        h: dict[str, Any] = {}
        if "zone_hints" in e:
            h["forZones"] = [{"name": z} for z in e["zone_hints"]]
        if "node_hints" in e:
            h["forNodes"] = [{"name": n} for n in e["node_hints"]]
        if h:
            ep["hints"] = h
        by_port.setdefault(int(port), []).append(ep)
    req.update(controller=False, nodes=[{"name": local["name"], "labels": labels}],
               service=_service(inp["service"], family), proxy_nodes=[local["name"]],
               endpoint_slices=[_slice(f"vec-p{p}", family, eps, p) for p, eps in sorted(by_port.items())])
    return req


def reconcile_request_for_auto(vector: dict[str, Any], gates: dict[str, bool], trials: int) -> dict[str, Any]:
    """An ``auto-hints`` vector with one new slice, asked of the whole reconciler instead.

    Each endpoint becomes a Pod on its vector node, or on a Ready node of its zone; an endpoint
    whose zone has no such node gets an added NotReady node with that zone label (SetNodes skips
    it, and the controller still takes the endpoint's zone from it).
    """
    inp = vector["input"]
    family = inp.get("address_type", "IPv4")
    nodes = [_node(n) for n in inp["nodes"]]
    known = {n["name"]: n for n in inp["nodes"]}
    by_zone: dict[str | None, str] = {}
    for n in inp["nodes"]:
        if n["ready"] and not n.get("control_plane") and not n.get("master_label"):
            by_zone.setdefault(n.get("zone"), n["name"])
    pods = []
    for i, e in enumerate(inp["endpoints"]):
        node = e.get("node")
        if node not in known or known[node].get("zone") != e.get("zone"):
            node = by_zone.get(e.get("zone"))
        if node is None:
            node = f"vec-unready-{e.get('zone')}"
            nodes.append({"name": node, "labels": {ZONE: e["zone"]} if e.get("zone") else {}, "ready": False})
            known[node] = {"name": node, "zone": e.get("zone")}
            by_zone[e.get("zone")] = node
        ip = _address(e["name"], i, family)
        pods.append({"metadata": {"name": e["name"], "namespace": NS, "labels": {"app": SVC}},
                     "spec": {"nodeName": node, "containers": [{"name": "c"}]},
                     "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}],
                                "conditions": [{"type": "Ready",
                                                "status": "True" if e.get("ready") is True else "False"}]}})
    req: dict[str, Any] = {"feature_gates": gates, "address_type": family, "nodes": nodes, "pods": pods,
                           "service": _service(inp["service"], family), "trials": trials}
    if inp.get("previously_enabled"):
        req["topology_cache"] = {family: {"populated": True}}
    return req


# ------------------------------------------------------------------------------------- checks


def _names(h: dict[str, Any] | None, key: str) -> list[str]:
    return sorted(x["name"] for x in (h or {}).get(key) or [])


def check_auto(vector: dict[str, Any], req: dict[str, Any], ans: dict[str, Any]) -> None:
    exp, ah = vector["expected"], ans["add_hints"]
    assert ah["events"] == exp["events"]
    written = {s["metadata"]["name"]: s for s in ah["to_create"] + ah["to_update"]}
    final: dict[str, dict[str, Any]] = {}
    ready: dict[str, bool] = {}
    for lst in ("to_create", "to_update", "unchanged"):
        for s in req["add_hints"][lst]:
            src = written.get(s["metadata"]["name"], s)
            for e in src["endpoints"]:
                final[e["targetRef"]["name"]] = e
                ready[e["targetRef"]["name"]] = e["conditions"].get("ready") is True
    for name, want in exp["hints"].items():
        got = final[name].get("hints")
        if want is None:
            assert got is None or got == {}, f"{name}: {got}"
        elif "forZones_one_of" in want:
            zs = _names(got, "forZones")
            assert len(zs) == 1 and zs[0] in want["forZones_one_of"], f"{name}: {got}"
        else:
            assert _names(got, "forZones") == sorted(want["forZones"]), f"{name}: {got}"
            assert _names(got, "forNodes") == sorted(want.get("forNodes", [])), f"{name}: {got}"
    if "hint_counts_by_zone" in exp:
        counts = Counter(z for n, e in final.items() if ready[n] for z in _names(e.get("hints"), "forZones"))
        assert dict(counts) == exp["hint_counts_by_zone"]
    if "unchanged_slices_kept" in exp:
        kept = [s["metadata"]["name"] for s in req["add_hints"]["unchanged"]
                if s["metadata"]["name"] not in written]
        assert kept == exp["unchanged_slices_kept"]


def check_td(vector: dict[str, Any], ans: dict[str, Any]) -> None:
    exp, ctl = vector["expected"], ans["controller"]
    assert ctl["error"] is None
    assert ctl["events"] == exp["events"]
    got = {e["pod"]: e["hints"] for e in ctl["endpoints"]}
    assert sorted(got) == sorted(exp["hints"])
    for name, want in exp["hints"].items():
        h = got[name]
        if want is None:
            assert h is None, f"{name}: {h}"
        else:
            assert (_names(h, "forZones"), _names(h, "forNodes")) == \
                (sorted(want.get("forZones") or []), sorted(want.get("forNodes") or [])), f"{name}: {h}"


def check_proxy(vector: dict[str, Any], req: dict[str, Any], ans: dict[str, Any]) -> None:
    exp = vector["expected"]
    assert not ans.get("proxy_skipped")
    got = ans["proxy"][req["proxy_nodes"][0]]["/TCP"]
    empty = not vector["input"]["endpoints"]
    for mine, theirs in (("cluster", "cluster_endpoints"), ("local", "local_endpoints"),
                         ("all_reachable", "all_reachable_endpoints")):
        if empty:  # no endpoints: CategorizeEndpoints returns before choosing categories
            assert not got[mine] and not exp[theirs], (mine, got[mine], exp[theirs])
        elif mine == "local" and exp[theirs] == [] and got[mine] is None:
            # CategorizeEndpoints leaves localEndpoints nil when no local endpoint is usable,
            # whether or not the Service uses Local policy (upstream's TestCategorizeEndpoints
            # compares it as a set, nil == empty); "used but empty" is not in its return value.
            pass
        else:
            assert got[mine] == exp[theirs], (mine, got[mine], exp[theirs])
    assert got["has_any"] == exp["has_any_endpoints"]


# -------------------------------------------------------------------------------------- tests

_VECTORS = _load()
PARAMS = [pytest.param(v, mi, g, id=f"{v['name']}@1.{mi}{'+' + ','.join(sorted(g)) if g else ''}")
          for v in _VECTORS for mi, g in minors_for(v)]
_ORACLES: dict[str, oc.Oracle] = {}


def _required() -> bool:
    return bool(os.environ.get("CI")) or os.environ.get("ZONEMETER_ORACLE_REQUIRED") == "1"


@pytest.fixture(scope="module", autouse=True)
def _close_oracles():  # type: ignore[no-untyped-def]
    yield
    for o in _ORACLES.values():
        o.close()
    _ORACLES.clear()


def oracle(minor: str) -> oc.Oracle:
    if minor not in _ORACLES:
        try:
            _ORACLES[minor] = oc.Oracle(minor)
        except oc.OracleError as e:
            if _required():
                pytest.fail(str(e))
            pytest.skip(str(e))
    return _ORACLES[minor]


def test_vectors_cover_the_oracle_range() -> None:
    assert len(_VECTORS) == json.loads(VECTORS.read_text())["vector_count"]
    covered = {id(p.values[0]) for p in PARAMS}
    below = [v["name"] for v in _VECTORS if id(v) not in covered]
    # only vectors that claim nothing from 1.31 on are left out
    for v in _VECTORS:
        if v["name"] in below:
            assert all(int(m) < 31 for m in re.findall(r"1\.(\d+)", v["versions"])), v["versions"]


@pytest.mark.parametrize(("vector", "minor", "gates"), PARAMS)
def test_vector_against_upstream(vector: dict[str, Any], minor: int, gates: dict[str, bool]) -> None:
    req = request_for(vector, gates)
    ans = oracle(f"1.{minor}").ask(req)
    if vector["kind"] == "auto-hints":
        check_auto(vector, req, ans)
    elif vector["kind"] == "traffic-distribution":
        check_td(vector, ans)
    else:
        check_proxy(vector, req, ans)


AUTO_RECONCILE = [p for p in PARAMS if p.values[0]["kind"] == "auto-hints" and "endpoints" in p.values[0]["input"]]


@pytest.mark.parametrize(("vector", "minor", "gates"), AUTO_RECONCILE)
def test_auto_vector_through_the_reconciler(vector: dict[str, Any], minor: int, gates: dict[str, bool]) -> None:
    """The same question through ``Reconcile`` with Pods, 20 times (new slices come from a map).

    Compared: what does not depend on the endpoint order inside a new slice (events, hint counts
    per zone, no hints on unready endpoints), in every trial. Which endpoint of a zone donates is
    not compared here (the AddHints test above fixes the order the vector assumes).
    """
    exp = vector["expected"]
    ans = oracle(f"1.{minor}").ask(reconcile_request_for_auto(vector, gates, trials=20))
    for a in ans["answers"]:
        ctl = a["controller"]
        assert ctl["error"] is None
        assert ctl["events"] == exp["events"]
        ready = {e["name"]: e.get("ready") is True for e in vector["input"]["endpoints"]}
        hinted = {e["pod"]: _names(e["hints"], "forZones") for e in ctl["endpoints"]}
        assert sorted(hinted) == sorted(ready)
        for name, zones in hinted.items():
            if not ready[name] or exp["hints"][name] is None:
                assert zones == [], (name, zones)
        if "hint_counts_by_zone" in exp:
            counts = Counter(z for n, zs in hinted.items() if ready[n] for z in zs)
            assert dict(counts) == exp["hint_counts_by_zone"]


def test_missing_binary_names_the_build_command(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ZONEMETER_ORACLE_CACHE", str(tmp_path))
    with pytest.raises(oc.OracleError, match=r"^oracle for Kubernetes 1\.37 not built: .*; "
                                             r"run: bash tools/oracle/build.sh 1\.37$"):
        oc.Oracle("1.37")
    assert oc.built_minors() == []


def test_bad_request_is_an_error_line_and_the_process_goes_on() -> None:
    built = oc.built_minors()
    if not built:
        if _required():
            pytest.fail("no oracle built; run: bash tools/oracle/build.sh 1.37")
        pytest.skip("no oracle built; run: bash tools/oracle/build.sh 1.37")
    with oc.Oracle(built[-1]) as o:
        assert o.ask_raw({"id": "x", "nodez": []}) == {"id": "x", "error": 'request: unknown field "nodez"'}
        with pytest.raises(oc.OracleError, match=r"nodes\[0\]\.allocatable_cpu"):
            o.ask({"nodes": [{"name": "n", "allocatable_cpu": "four"}], "service": {"metadata": {"name": "s"}}})
        ans = o.ask({"controller": False, "service": {"metadata": {"name": "s"}}})
        assert ans["kubernetes"].startswith(f"v{built[-1]}.")
        defaults = ans["gates"]
        # a refused gate leaves no trace (SetFromMap keeps every key it is given)
        with pytest.raises(oc.OracleError, match="unrecognized feature gate: NoSuchGate"):
            o.ask({"controller": False, "feature_gates": {"NoSuchGate": True}, "service": {"metadata": {"name": "s"}}})
        assert o.ask({"controller": False, "service": {"metadata": {"name": "s"}}})["gates"] == defaults
