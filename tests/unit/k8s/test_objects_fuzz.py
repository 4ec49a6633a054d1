"""Fuzz (hypothesis) odd Kubernetes objects through the metadata cache and the hint model.

Each odd object sits next to a good cluster (two zones, a Service ``shop/web`` with one
good EndpointSlice), and the properties are:

* the cache (``ClusterMetadata.load_snapshot`` and ``apply``) never raises, and what the
  good objects resolve to is exactly what it is without the odd ones;
* the hint model with ``strict=False`` never raises anything but collects one-line
  InputErrors naming the object and field; with ``strict=True`` it raises the first of
  those; the good Service's diagnosis is unchanged unless the odd object is one of its
  own (then it has no diagnosis rather than a wrong one);
* ``zonemeter explain`` on a dump holding the odd object exits 0, or 2 with exactly one
  stderr line and no traceback.
"""

from __future__ import annotations

import copy
import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent import hints
from agent.cli import main
from agent.errors import InputError
from agent.k8s.cache import ClusterMetadata
from agent.k8s.parse import NodeInfo, ServiceInfo, Slice
from agent.k8s.snapshot import Snapshot
from tests.fixtures.mutation import mutate_once


def _records_only(c: ClusterMetadata) -> None:
    """What the cache hands the hint model is parsed records or the error parsing raised."""
    nodes, services, slices = c.model_inputs()
    assert all(isinstance(n, (NodeInfo, type(None))) and isinstance(e, (InputError, type(None)))
               for n, e in nodes)
    assert all(isinstance(s, (ServiceInfo, type(None))) and isinstance(e, (InputError, type(None)))
               and (s is None) == (e is not None) for s, e in services)
    assert all(isinstance(ns, str) and isinstance(name, str) and isinstance(sl, (Slice, type(None)))
               and (sl is None) == (e is not None) for ns, name, sl, e in slices)


ZONE = hints.LABEL_ZONE


def node(name: str, zone: str, cpu: Any = "4", ip: str = "192.168.0.1") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {ZONE: zone}},
            "spec": {"podCIDRs": []},
            "status": {"conditions": [{"type": "Ready", "status": "True"}],
                       "allocatable": {"cpu": cpu}, "addresses": [{"type": "InternalIP", "address": ip}]}}


def pod(name: str, ip: str, node_name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "shop"},
            "spec": {"nodeName": node_name}, "status": {"phase": "Running", "podIP": ip}}


def service(name: str = "web", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"type": "ClusterIP", "clusterIP": "10.96.0.10", "selector": {"app": name},
                            "ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}
    base.update(spec)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": "shop",
                         "annotations": {hints.ANNOTATION_TOPOLOGY_MODE: "Auto"}}, "spec": base}


def endpoint(ip: str, node_name: str, zone: str) -> dict[str, Any]:
    return {"addresses": [ip], "conditions": {"ready": True, "serving": True, "terminating": False},
            "nodeName": node_name, "zone": zone, "hints": {"forZones": [{"name": zone}]}}


def eslice(name: str, svc: str, endpoints: Any, ports: Any = None, family: str = "IPv4") -> dict[str, Any]:
    return {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": family,
            "metadata": {"name": name, "namespace": "shop",
                         "labels": {hints.LABEL_SERVICE_NAME: svc,
                                    hints.LABEL_MANAGED_BY: hints.CONTROLLER_NAME}},
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}] if ports is None else ports,
            "endpoints": endpoints}


def good_cluster() -> Snapshot:
    nodes = [node("n1", "a", ip="192.168.0.1"), node("n2", "b", ip="192.168.0.2")]
    pods = [pod("web-1", "10.0.1.5", "n1"), pod("web-2", "10.0.2.5", "n2")]
    eps = [endpoint("10.0.1.5", "n1", "a"), endpoint("10.0.2.5", "n2", "b")]
    return Snapshot(nodes=nodes, services=[service()], endpointslices=[eslice("web-1", "web", eps)], pods=pods)


# --------------------------------------------------------------------------- odd shapes

ODD_VALUES = st.sampled_from([None, "", "x", 0, -1, 1.5, True, [], {}, [None], {"a": 1}, 70000,
                              "10.0.1.5", "fd00::9", "::", "None", "abc", "-1", "1e3", "500m"])
ENDPOINT_MUTATIONS = st.sampled_from([
    lambda e: {k: v for k, v in e.items() if k != "conditions"},
    lambda e: {**e, "conditions": None},
    lambda e: {**e, "conditions": {}},
    lambda e: {**e, "conditions": {"ready": "yes"}},
    lambda e: {**e, "addresses": []},
    lambda e: {**e, "addresses": None},
    lambda e: {**e, "addresses": "10.0.3.5"},
    lambda e: {**e, "addresses": ["10.0.3.5", "10.0.3.5"]},
    lambda e: {**e, "addresses": ["fd00::35"]},
    lambda e: {**e, "addresses": ["db.example.com"]},
    lambda e: {**e, "hints": "a"},
    lambda e: {**e, "hints": []},
    lambda e: {**e, "hints": {"forZones": "a"}},
    lambda e: {**e, "hints": {"forZones": [{"name": 5}]}},
    lambda e: {**e, "hints": {"forZones": [None]}},
    lambda e: {**e, "hints": {"forNodes": [{"name": "n9"}], "forZones": []}},
    lambda e: {**e, "hints": None},
    lambda e: {**e, "zone": 5},
    lambda e: {**e, "nodeName": ["n1"]},
    lambda e: {**e, "unknownField": {"x": [1, 2]}},
    lambda e: "10.0.3.5",
    lambda e: None,
])
PORTS: st.SearchStrategy[Any] = st.sampled_from([None, [], [{}], [{"port": None}], [{"name": "http"}],
                         [{"port": 70000}],
                         [{"port": -1}], [{"port": "8080"}], [{"port": 8080, "protocol": "ICMP"}],
                         [{"port": 8080, "protocol": 6}], "8080", [None], [{"port": 2**64}],
                         [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": 5}]])


@st.composite
def odd_slices(draw: Any) -> dict[str, Any]:
    """An EndpointSlice of Service ``shop/other`` or ``shop/web`` with odd parts."""
    svc = draw(st.sampled_from(["other", "web"]))
    base = [endpoint("10.0.3.5", "n1", "a"), endpoint("10.0.4.5", "n2", "b")]
    eps: Any = [draw(ENDPOINT_MUTATIONS)(e) if draw(st.booleans()) else e for e in base]
    eps = draw(st.sampled_from([eps, eps, None, [], "x", eps + eps]))
    ports = draw(PORTS) if draw(st.booleans()) else None
    obj = eslice(draw(st.sampled_from(["odd-1", "odd-2"])), svc, eps, ports,
                 draw(st.sampled_from(["IPv4", "IPv6", "FQDN", "", 5, None])))
    for key in draw(st.lists(st.sampled_from(["addressType", "ports", "endpoints", "metadata"]), max_size=1)):
        if key == "metadata":
            obj["metadata"] = draw(st.sampled_from([None, {}, {"name": 5}, {"name": "odd", "namespace": 3},
                                                    {"name": "odd", "labels": "x"}]))
        else:
            obj.pop(key)
    return obj


@st.composite
def odd_services(draw: Any) -> dict[str, Any]:
    obj = service("other")
    choice = draw(st.sampled_from(["nospec", "spec-null", "none", "None-str", "headless", "ports",
                                   "target-str", "no-protocol", "type", "ann", "ips"]))
    spec = obj["spec"]
    if choice == "nospec":
        del obj["spec"]
    elif choice == "spec-null":
        obj["spec"] = None
    elif choice == "none":
        spec["clusterIP"] = None
    elif choice in ("None-str", "headless"):
        spec["clusterIP"] = "None"
        spec["clusterIPs"] = ["None"] if choice == "headless" else None
    elif choice == "ports":
        spec["ports"] = draw(st.sampled_from([None, "80", [None], [{"port": None}], [{"port": "80"}],
                                              [{"port": 80, "nodePort": "x"}], [{"port": 80, "protocol": "ICMP"}]]))
    elif choice == "target-str":
        spec["ports"][0]["targetPort"] = draw(st.sampled_from(["http", "8080", "", None, -1]))
    elif choice == "no-protocol":
        del spec["ports"][0]["protocol"]
    elif choice == "type":
        spec["type"] = draw(ODD_VALUES)
    elif choice == "ann":
        obj["metadata"]["annotations"] = draw(st.sampled_from([None, "x", {"a": None}, {"a": 5}, {5: "a"}]))
    else:
        spec["clusterIPs"] = draw(st.sampled_from([["10.96.0.11", "fd00::11"], ["x"], "10.96.0.11", [5]]))
    return obj


@st.composite
def odd_nodes(draw: Any) -> dict[str, Any]:
    obj = node("n3", draw(st.sampled_from(["a", "b"])), ip="192.168.0.3")
    choice = draw(st.sampled_from(["cpu", "labels", "conditions", "status", "alloc"]))
    if choice == "cpu":
        obj["status"]["allocatable"]["cpu"] = draw(st.sampled_from(
            ["abc", "-1", "1e3", "500m", "NaN", "Infinity", "0", True, 1.5, None, [], "1Ki", "4.5"]))
    elif choice == "labels":
        obj["metadata"]["labels"] = draw(st.sampled_from([None, {}, "x", {ZONE: 5}, {ZONE: ""}]))
    elif choice == "conditions":
        obj["status"]["conditions"] = draw(st.sampled_from([None, [], "x", [None], [{"type": "Ready"}],
                                                            [{"type": "Ready", "status": "False"}]]))
    elif choice == "status":
        obj["status"] = draw(st.sampled_from([None, "x", {}]))
    else:
        obj["status"]["allocatable"] = draw(st.sampled_from([None, "4", {}]))
    return obj


ODD = st.one_of(odd_slices(), odd_services(), odd_nodes())


def _kind_list(snap: Snapshot, obj: dict[str, Any]) -> list[dict[str, Any]]:
    return {"Node": snap.nodes, "Service": snap.services, "EndpointSlice": snap.endpointslices}[obj["kind"]]


# --------------------------------------------------------------------------- the cache

GOOD_ADDRS = [ipaddress.ip_address(a) for a in ("10.0.1.5", "10.0.2.5", "192.168.0.1", "10.96.0.10")]


def _cache_view(c: ClusterMetadata) -> Any:
    """What the good objects resolve to."""
    return ([c.resolve(a) for a in GOOD_ADDRS],
            [c.endpoint_services(a, 8080, 6) for a in GOOD_ADDRS],
            c.service_address(ipaddress.ip_address("10.96.0.10"), 80, 6),
            sorted(map(str, c.local_endpoints("n1"))))


BASELINE = ClusterMetadata()
BASELINE.load_snapshot(good_cluster())
BASELINE_VIEW = _cache_view(BASELINE)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ODD, min_size=1, max_size=3))
def test_cache_absorbs_odd_objects_without_changing_good_ones(odd: list[dict[str, Any]]) -> None:
    snap = good_cluster()
    for obj in odd:
        _kind_list(snap, obj).append(copy.deepcopy(obj))
    c = ClusterMetadata()
    c.load_snapshot(snap)
    got = _cache_view(c)
    # good objects resolve as before, except that an odd slice of shop/web may add its own
    # (valid) endpoints to web's local set, and an odd Node n3 adds its own address only
    assert got[0] == BASELINE_VIEW[0]
    assert got[1] == BASELINE_VIEW[1]
    if not any(o.get("kind") == "Service" for o in odd):
        assert got[2] == BASELINE_VIEW[2]
    assert set(BASELINE_VIEW[3]) <= set(got[3])
    # and events one by one (ADDED, MODIFIED, DELETED) never raise either
    resource = {"Node": "nodes", "Service": "services", "EndpointSlice": "endpointslices"}
    for obj in odd:
        for event in ("ADDED", "MODIFIED", "DELETED"):
            c.apply(resource[obj["kind"]], event, obj)
    assert _cache_view(c)[0] == BASELINE_VIEW[0]
    _records_only(c)


def test_cache_counts_a_slice_whose_endpoints_are_not_a_list() -> None:
    snap = good_cluster()
    snap.endpointslices.append(eslice("odd", "web", "10.0.3.5"))
    c = ClusterMetadata()
    c.load_snapshot(snap)
    assert c.bad_objects()["endpointslices"] == 1
    assert _cache_view(c) == BASELINE_VIEW


def test_cache_bad_endpoint_next_to_good_ones_changes_nothing_for_them() -> None:
    snap = good_cluster()
    eps = snap.endpointslices[0]["endpoints"]
    snap.endpointslices[0]["endpoints"] = [eps[0], {"addresses": "10.0.9.9"}, None, eps[1],
                                           {**eps[1], "addresses": ["db.example.com"]}]
    c = ClusterMetadata()
    c.load_snapshot(snap)
    assert _cache_view(c) == BASELINE_VIEW
    assert c.endpoint_services(ipaddress.ip_address("10.0.9.9"), 8080, 6) == ()


def test_cache_ignores_out_of_range_slice_ports() -> None:
    snap = good_cluster()
    snap.endpointslices[0]["ports"] = [{"port": 70000}, {"port": -1}, {"port": 2**64}, {"port": True},
                                       {"name": "http", "port": 8080, "protocol": "TCP"}]
    c = ClusterMetadata()
    c.load_snapshot(snap)
    assert _cache_view(c) == BASELINE_VIEW
    assert c.endpoint_services(ipaddress.ip_address("10.0.1.5"), 70000 & 0xFFFF, 6) == ()
    assert c.endpoint_services(ipaddress.ip_address("10.0.1.5"), 1, 6) == ()


# --------------------------------------------------------------------------- the hint model

def _diag_view(diags: list[hints.ServiceDiagnosis], key: tuple[str, str]) -> Any:
    return [json.dumps(d.to_json(), sort_keys=True) for d in diags if (d.namespace, d.name) == key]


def _evaluate(snap: Snapshot, **kw: Any) -> list[hints.ServiceDiagnosis]:
    return hints.evaluate_cluster(snap.nodes, snap.services, snap.endpointslices, snap.pods,
                                  version="1.33", **kw)


BASE_DIAG = _diag_view(_evaluate(good_cluster(), strict=True), ("shop", "web"))


def one_line_naming(err: InputError) -> None:
    text = str(err)
    assert "\n" not in text and "\r" not in text
    assert err.obj and err.field, text


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ODD, min_size=1, max_size=3))
def test_hint_model_collects_errors_and_never_answers_wrongly(odd: list[dict[str, Any]]) -> None:
    snap = good_cluster()
    for obj in odd:
        _kind_list(snap, obj).append(copy.deepcopy(obj))
    errors: list[InputError] = []
    diags = _evaluate(snap, errors=errors)
    for err in errors:
        one_line_naming(err)
    try:
        strict = _evaluate(snap, strict=True)
    except InputError as err:
        assert errors and str(err) == str(errors[0])
    else:
        assert not errors
        assert [d.to_json() for d in strict] == [d.to_json() for d in diags]
    web = _diag_view(diags, ("shop", "web"))
    slices = [(o, _owner(o)) for o in odd if o["kind"] == "EndpointSlice"]
    web_names = {_name(o) for o, owner in slices if owner == "web"}
    other_names = {_name(o) for o, owner in slices if owner != "web"}
    unreadable = {e.obj for e in errors}
    if any(f"EndpointSlice shop/{n}" in unreadable for n in web_names - other_names):
        # a slice of web could not be read: no diagnosis rather than one from the others
        assert web == []
    elif not web_names and not any(o["kind"] == "Node" for o in odd):
        assert web == BASE_DIAG


def _owner(obj: dict[str, Any]) -> Any:
    meta = obj.get("metadata")
    labels = meta.get("labels") if isinstance(meta, dict) else None
    return labels.get(hints.LABEL_SERVICE_NAME) if isinstance(labels, dict) else None


def _name(obj: dict[str, Any]) -> Any:
    meta = obj.get("metadata")
    return meta.get("name") if isinstance(meta, dict) else None


@pytest.mark.parametrize("cpu,problem", [("abc", "unreadable allocatable CPU"),
                                         ("-1", "unreadable allocatable CPU"),
                                         ("NaN", "unreadable allocatable CPU"),
                                         (True, "unreadable allocatable CPU"),
                                         ("0", "zero allocatable CPU"),
                                         (None, "no status.allocatable.cpu")])
def test_node_with_bad_cpu_makes_auto_refuse(cpu: Any, problem: str) -> None:
    # pkg/controller/endpointslice/topologycache TopologyCache.SetNodes: one ready worker
    # without usable CPU (or zone) poisons the ratios for every Service; skipping the node
    # would give ratios from the other nodes instead
    snap = good_cluster()
    snap.nodes.append(node("n3", "a", cpu=cpu, ip="192.168.0.3"))
    errors: list[InputError] = []
    d = [x for x in _evaluate(snap, errors=errors) if x.name == "web"][0]
    assert not d.controller.hints_enabled
    assert d.controller.refusal_reason == "insufficient-node-info"
    assert any(problem in w.message and "n3" in w.message for w in d.warnings), d.warnings
    # zero and missing CPU are what upstream reads as zero (no input error), named apart
    assert (len(errors) == 1 and "n3" in str(errors[0])) == (
        problem not in ("zero allocatable CPU", "no status.allocatable.cpu"))


def test_node_with_bad_cpu_that_is_not_ready_is_skipped_as_the_controller_would() -> None:
    snap = good_cluster()
    bad = node("n3", "a", cpu="abc", ip="192.168.0.3")
    bad["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    snap.nodes.append(bad)
    good = [x for x in _evaluate(good_cluster()) if x.name == "web"][0]
    got = [x for x in _evaluate(snap, errors=[]) if x.name == "web"][0]
    assert got.controller.hints_enabled == good.controller.hints_enabled
    assert dict(got.controller.hints) == dict(good.controller.hints)


@pytest.mark.parametrize("cpu,milli", [("1e3", 1_000_000), ("500m", 500), ("1Ki", 1_024_000), (1.5, 1500)])
def test_cpu_quantities_kubernetes_accepts(cpu: Any, milli: int) -> None:
    assert hints.cpu_millis(cpu, "Node n") == milli


# --------------------------------------------------------------------------- explain CLI

def _dump(snap: Snapshot) -> str:
    return json.dumps({"kind": "List", "items": snap.nodes + snap.services + snap.endpointslices + snap.pods})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(ODD, min_size=1, max_size=2), st.sampled_from([[], ["-o", "json"], ["--service", "shop/web"],
                                                               ["--node", "n1"], ["--node", "n9"]]))
def test_explain_exits_0_3_or_2_with_one_line(tmp_path: Path, capsys: Any, odd: list[dict[str, Any]],
                                            extra: list[str]) -> None:
    snap = good_cluster()
    for obj in odd:
        _kind_list(snap, obj).append(copy.deepcopy(obj))
    path = tmp_path / "dump.json"
    path.write_text(_dump(snap))
    capsys.readouterr()
    code = main(["explain", "--snapshot", str(path), "--kubernetes-version", "1.33", *extra])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    if code == 2:
        lines = err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("zonemeter: error: " + str(path)), err
    elif code == 3:  # the odd objects are rows of their own, every other Service explained
        assert err == "" and ("malformed-object" in out or "no-endpointslices" in out), out
        if "--service" not in extra:
            assert "shop/web" in out or '"name": "web"' in out  # the good Service is explained
    else:
        assert code == 0 and err == "" and out


@pytest.mark.parametrize("text", ["[" * 100_000, "kind: Node\nmetadata: {name: [", "\ufeff{}",
                                  '{"kind": "List", "items": [{"kind": "Node", "metadata": {"name": "n", '
                                  '"labels": {"topology.kubernetes.io/zone": "a"}}, "status": {"allocatable": '
                                  '{"cpu": "NaN"}, "conditions": [{"type": "Ready", "status": "True"}]}}]}'])
def test_explain_bad_files(tmp_path: Path, capsys: Any, text: str) -> None:
    path = tmp_path / "dump"
    path.write_text(text)
    code = main(["explain", "--snapshot", str(path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if code == 2:
        assert len(err.splitlines()) == 1
    else:
        assert code == 0 and "0 Service entries" in out


def test_explain_unreadable_file(tmp_path: Path, capsys: Any) -> None:
    path = tmp_path / "dump"
    path.write_bytes(b"\xff\xfe\x00bad")
    assert main(["explain", "--snapshot", str(path)]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_service_with_an_unreadable_slice_gets_no_diagnosis() -> None:
    snap = good_cluster()
    snap.endpointslices.append(eslice("web-2", "web", [{"addresses": ["10.0.3.5"], "conditions": "x"}]))
    errors: list[InputError] = []
    diags = _evaluate(snap, errors=errors)
    assert [str(e) for e in errors] == ["EndpointSlice shop/web-2: endpoints[0].conditions: must be an object"]
    assert _diag_view(diags, ("shop", "web")) == []
    with pytest.raises(InputError):
        _evaluate(snap, strict=True)


@pytest.mark.parametrize("port", [True, 70000, -1, 0, "80", None])
def test_cache_refuses_a_service_port_that_is_not_a_port(port: Any) -> None:
    # port true used to match port 1 and be exported as port label "True"; 70000 as "70000"
    snap = good_cluster()
    snap.services[0]["spec"]["ports"][0]["port"] = port
    c = ClusterMetadata()
    c.load_snapshot(snap)
    assert c.bad_objects()["services"] == 1
    assert c.service_address(ipaddress.ip_address("10.96.0.10"), 1, 6) is None
    got = c.endpoint_services(ipaddress.ip_address("10.0.1.5"), 8080, 6)
    assert [(s.service, s.port) for s in got] == [("web", 0)]  # slice known, Service not


@pytest.mark.parametrize("target,want", [(8080, 8080), ("8080", 8080), ("http", 0), (True, 0), (70000, 0),
                                         ("８０８０", 0)])
def test_cache_target_port(target: Any, want: int) -> None:
    snap = good_cluster()
    snap.services[0]["spec"]["ports"][0]["targetPort"] = target
    c = ClusterMetadata()
    c.load_snapshot(snap)
    sp = c.service_address(ipaddress.ip_address("10.96.0.10"), 80, 6)
    assert sp is not None and sp.target_port == want


@pytest.mark.parametrize("port", [True, 70000, -1, 0, "8080"])
def test_hint_model_refuses_a_slice_port_that_is_not_a_port(port: Any) -> None:
    snap = good_cluster()
    snap.endpointslices[0]["ports"] = [{"name": "http", "port": port, "protocol": "TCP"}]
    errors: list[InputError] = []
    assert _diag_view(_evaluate(snap, errors=errors), ("shop", "web")) == []
    assert [(e.obj, e.field) for e in errors] == [("EndpointSlice shop/web-1", "ports[0].port")]


@pytest.mark.parametrize("label", [["web"], {"a": 1}, 5, None])
def test_explain_slice_service_label_of_any_type(tmp_path: Path, capsys: Any, label: Any) -> None:
    # a list label value made explain's pre-check raise TypeError (unhashable)
    snap = good_cluster()
    snap.endpointslices.append(eslice("odd", "x", []))
    snap.endpointslices[-1]["metadata"]["labels"][hints.LABEL_SERVICE_NAME] = label
    path = tmp_path / "dump.json"
    path.write_text(_dump(snap))
    code = main(["explain", "--snapshot", str(path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err and code in (0, 2)
    assert code == 0 or len(err.splitlines()) == 1


# --------------------------------------------------------------------------- random mutations



ANY_JSON = st.recursive(ODD_VALUES, lambda kids: st.lists(kids, max_size=2)
                        | st.dictionaries(st.sampled_from(["name", "port", "ready", "forZones", "x"]), kids,
                                          max_size=2), max_leaves=5)


@st.composite
def mutated(draw: Any) -> Snapshot:
    """The good cluster with 1-3 values anywhere replaced by odd JSON, or deleted."""
    snap = copy.deepcopy(good_cluster())
    objs = snap.nodes + snap.services + snap.endpointslices + snap.pods
    for _ in range(draw(st.integers(1, 3))):
        # False when an earlier mutation left only kind/apiVersion: try another object
        mutate_once(draw, draw(st.sampled_from(objs)), ANY_JSON, skip=("kind", "apiVersion"))
    return snap


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_any_mutation_of_a_good_cluster(snap: Snapshot) -> None:
    c = ClusterMetadata()
    c.load_snapshot(snap)
    _cache_view(c)
    _records_only(c)
    errors: list[InputError] = []
    diags = _evaluate(snap, errors=errors)
    for err in errors:
        one_line_naming(err)
    for d in diags:
        json.dumps(d.to_json())
    try:
        _evaluate(snap, strict=True)
    except InputError as err:
        assert errors and str(err) == str(errors[0])
    else:
        assert not errors


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(mutated(), st.sampled_from([[], ["-o", "json"], ["--node", "n1"]]))
def test_explain_any_mutation(tmp_path: Path, capsys: Any, snap: Snapshot, extra: list[str]) -> None:
    path = tmp_path / "dump.json"
    path.write_text(_dump(snap))
    capsys.readouterr()
    code = main(["explain", "--snapshot", str(path), *extra])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    assert code == 0 or (code == 2 and len(err.splitlines()) == 1) or (
        code == 3 and err == "" and ("malformed-object" in out or "no-endpointslices" in out)), (code, err)


def test_cache_fqdn_slice_with_ip_looking_addresses_is_no_endpoint() -> None:
    # "10.0.3.5" passes the API's FQDN validation (a DNS subdomain); kube-proxy ignores FQDN
    # slices, so the cache must not index it nor write it into the kernel endpoint map
    snap = good_cluster()
    snap.endpointslices.append(eslice("fqdn", "web", [endpoint("10.0.3.5", "n1", "a")], family="FQDN"))
    c = ClusterMetadata()
    c.load_snapshot(snap)
    assert c.endpoint_services(ipaddress.ip_address("10.0.3.5"), 8080, 6) == ()
    assert _cache_view(c) == BASELINE_VIEW


def test_a_service_without_spec_is_an_error_not_an_auto_clusterip() -> None:
    """A hand-made dump's Service without ``spec`` was judged as a ClusterIP Service with
    defaults; its type, ports and policies are unknown, so it is one error naming the field."""
    from agent.errors import InputError
    from agent.k8s.parse import parse_service_info

    with pytest.raises(InputError) as err:
        parse_service_info({"apiVersion": "v1", "kind": "Service",
                            "metadata": {"name": "web", "namespace": "shop",
                                         "annotations": {"service.kubernetes.io/topology-mode": "Auto"}}})
    assert str(err.value).startswith("Service shop/web: spec: missing")
    assert "\n" not in str(err.value)
    assert parse_service_info({"metadata": {"name": "web", "namespace": "shop"}, "spec": {}}).type == "ClusterIP"
