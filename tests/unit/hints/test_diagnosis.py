"""agent.hints: every diagnosis reason and warning, versions/gates, the lab helpers."""

from __future__ import annotations

import pytest

from agent import hints
from agent.errors import InputError
from agent.records import ProxyView
from tests.fixtures import k8s
from tests.fixtures.topologies import own_zone_endpoints, three_zone_nodes


def diag(nodes, svc, slices, version="1.35", gates=None, populated=None):  # type: ignore[no-untyped-def]
    out = hints.evaluate_cluster(nodes, [svc], slices, version=version, feature_gates=gates,
                                 hints_populated=populated, strict=True)
    assert len(out) == 1
    return out[0]


def codes(d: hints.ServiceDiagnosis) -> set[str]:
    return {w.code for w in d.warnings}


# ------------------------------------------------------------------------------ reasons


def test_reason_none_auto_in_effect_everywhere() -> None:
    d = diag(three_zone_nodes(), k8s.service(auto=True),
             [k8s.endpointslice("web-1", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1}))])
    assert (d.reason, d.mode, d.mechanism) == ("none", "topology-mode", "topology-mode-annotation")
    assert d.locality_in_effect == {"a": True, "b": True, "c": True}
    assert d.proxy["n-a"].cluster_endpoints == ("10.0.0.1:8080",)
    assert codes(d) == {"single-endpoint-zone"}  # one endpoint per zone takes its zone's traffic
    # slices carry hints and no Enabled event repeats (populated inferred from observed hints)
    assert d.controller.events == ()


def test_reason_not_requested() -> None:
    d = diag(three_zone_nodes(), k8s.service(),
             [k8s.endpointslice("web-1", "web", own_zone_endpoints({"a": 1, "b": 1}, False))])
    assert (d.reason, d.mode, d.mechanism) == ("not-requested", "none", "none")
    assert d.locality_in_effect == {"a": False, "b": False, "c": False}
    assert d.proxy["n-a"].topology_mode == ""


def test_reason_insufficient_node_info_and_bad_node_warning() -> None:
    nodes = three_zone_nodes() + [k8s.node("n-x", None)]
    d = diag(nodes, k8s.service(auto=True),
             [k8s.endpointslice("web-1", "web", own_zone_endpoints({"a": 2, "b": 2, "c": 2}))])
    assert d.reason == "insufficient-node-info"
    assert d.mechanism == "topology-mode-annotation (refused)"
    w = [w for w in d.warnings if w.code == "node-info-disables-auto"]
    assert len(w) == 1 and "n-x" in w[0].message and "no zone label" in w[0].message
    assert d.controller.events[0].message.startswith("Insufficient Node information")


def test_zero_cpu_worker_poisons_but_control_plane_and_unready_do_not() -> None:
    nodes = three_zone_nodes() + [k8s.node("cp", None, control_plane=True), k8s.node("down", None, ready=False)]
    nodes[3]["metadata"]["labels"][hints.LABEL_ZONE] = "a"  # control plane: labelled, still excluded
    eps = own_zone_endpoints({"a": 1, "b": 1, "c": 1})
    assert diag(nodes, k8s.service(auto=True), [k8s.endpointslice("s", "web", eps)]).reason == "none"
    d = diag(nodes + [k8s.node("zero", "a", cpu="0")], k8s.service(auto=True), [k8s.endpointslice("s", "web", eps)])
    assert d.reason == "insufficient-node-info"
    assert "zero allocatable CPU" in next(w.message for w in d.warnings if w.code == "node-info-disables-auto")


def test_reason_insufficient_number_of_endpoints_with_minimum_hint() -> None:
    d = diag(three_zone_nodes(), k8s.service(auto=True),
             [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1, "b": 1}))])
    assert d.reason == "insufficient-number-of-endpoints"
    assert d.controller.events[0].message == (
        "Insufficient number of endpoints (2 endpoints, 3 zones), addressType: IPv4")
    w = next(w for w in d.warnings if w.code == "auto-minimum-endpoints")
    assert "accepts is 3" in w.message


def test_reason_min_allocation_and_next_accepted_count() -> None:
    d = diag(three_zone_nodes(), k8s.service(auto=True),
             [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 2, "b": 1, "c": 1}))])
    assert d.reason == "min-allocation-exceeds-overload-threshold"
    assert dict(d.controller.minimums or {}) == {"a": 2, "b": 2, "c": 2}
    assert "accepts is 6" in next(w.message for w in d.warnings if w.code == "auto-minimum-endpoints")
    # observed own-zone hints are what kube-proxy uses, but the controller would strip them
    assert "stale-hints" in codes(d)


def test_reason_endpoint_without_zone() -> None:
    eps = own_zone_endpoints({"a": 2, "b": 2, "c": 1}, hinted=False) + [k8s.endpoint("10.0.0.9", None, "n-a")]
    d = diag(three_zone_nodes(), k8s.service(auto=True), [k8s.endpointslice("s", "web", eps)])
    assert d.reason == "endpoint-without-zone"
    assert [e.message for e in d.controller.events] == [
        "One or more endpoints do not have a zone specified, addressType: IPv4"]
    assert all(h is None for h in d.controller.hints.values())
    # upstream's AddHints computes the allocations before it finds the zoneless endpoint:
    # the refusal keeps them (6 ready endpoints, 3 equal zones: 2 each)
    assert not d.controller.hints_enabled
    doc = d.to_json()["controller"]
    assert doc["allocations"] == {z: {"minimum": 2, "maximum": 2, "desired": 2.0} for z in "abc"}
    assert doc["minimums"] == {"a": 2, "b": 2, "c": 2} and doc["donations"] == []


def test_reason_annotation_value_not_accepted() -> None:
    svc = k8s.service(annotations={hints.ANNOTATION_TOPOLOGY_MODE: "PreferZone"})
    d = diag(three_zone_nodes(), svc,
             [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1}, False))])
    assert d.reason == "annotation-value-not-accepted"
    assert "annotation-value-not-accepted" in codes(d)
    # kube-proxy <= 1.32 accepts any non-disabled value: the warning says so
    d32 = diag(three_zone_nodes(), svc,
               [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1}, False))], version="1.32")
    assert "kube-proxy <= 1.32" in next(w.message for w in d32.warnings if w.code == "annotation-value-not-accepted")


def test_reason_feature_gate_disabled_prefer_same_node_1_33() -> None:
    eps = own_zone_endpoints({"a": 1, "b": 1, "c": 1}, hinted=False)
    svc = k8s.service(traffic_distribution="PreferSameNode")
    d = diag(three_zone_nodes(), svc, [k8s.endpointslice("s", "web", eps)], version="1.33")
    assert d.reason == "feature-gate-disabled" and d.mode == "PreferSameNode" and d.mechanism == "none"
    assert "PreferSameTrafficDistribution gate is off" in next(
        w.message for w in d.warnings if w.code == "traffic-distribution-not-accepted")
    on = diag(three_zone_nodes(), svc, [k8s.endpointslice("s", "web", eps)], version="1.33",
              gates={"PreferSameTrafficDistribution": True})
    assert on.mechanism == "trafficDistribution"
    assert on.controller.hints["10.0.0.1"] == hints.Hints(("a",), ("n-a",))


def test_reason_feature_gate_disabled_auto_without_topology_cache() -> None:
    d = diag(three_zone_nodes(), k8s.service(auto=True),
             [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1}, False))],
             version="1.32", gates={"TopologyAwareHints": False})
    assert d.reason == "feature-gate-disabled" and d.mechanism == "none"
    assert d.controller.events == ()


def test_reason_partial_hints_foreign_slice() -> None:
    slices = [k8s.endpointslice("web-1", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1})),
              k8s.endpointslice("web-mirror", "web", [k8s.endpoint("10.9.9.9", "a", "n-a")], managed=False)]
    d = diag(three_zone_nodes(), k8s.service(traffic_distribution="PreferClose"), slices)
    assert d.reason == "partial-hints"
    w = next(w for w in d.warnings if w.code == "ready-endpoints-without-hints")
    assert "10.9.9.9 (EndpointSlice web-mirror)" in w.message
    assert "10.9.9.9" not in d.controller.hints  # the controller never touches foreign slices
    assert d.proxy["n-a"].topology_mode == "" and len(d.proxy["n-a"].cluster_endpoints or ()) == 4


def test_reason_no_hints_for_zone() -> None:
    d = diag(three_zone_nodes(), k8s.service(traffic_distribution="PreferClose"),
             [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 2, "b": 2}))])
    assert d.reason == "no-hints-for-zone"
    assert d.locality_in_effect == {"a": True, "b": True, "c": False}
    assert d.mechanism == "trafficDistribution" and d.mode == "PreferClose"


def test_reason_internal_traffic_policy_local_and_drop_warning() -> None:
    d = diag(three_zone_nodes(), k8s.service(traffic_distribution="PreferClose", internal_traffic_policy="Local"),
             [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1}))])
    assert d.reason == "internal-traffic-policy-local" and d.mode == "internalTrafficPolicy-Local"
    assert d.proxy["n-b"].internal_traffic == "DROP"
    view = d.proxy_view("n-b")
    assert view is not None and view.selected == frozenset()
    assert d.proxy_view("n-a") == ProxyView("", frozenset({"10.0.0.1"}), "local")
    w = next(w for w in d.warnings if w.code == "internal-traffic-policy-local-drops")
    assert "2 node(s)" in w.message and "n-b" in w.message and "n-c" in w.message


def test_reason_no_endpoints_reject() -> None:
    d = diag(three_zone_nodes(), k8s.service(auto=True), [k8s.endpointslice("s", "web", [])])
    assert d.reason == "no-endpoints"
    assert d.proxy["n-a"].internal_traffic == "REJECT"
    assert d.proxy_view("n-a") == ProxyView("", frozenset(), "REJECT")


def test_reason_kube_proxy_version_skew() -> None:
    # control plane 1.37 writes zone hints for PreferClose; a node whose kubelet (and so
    # kube-proxy) is 1.30 runs ServiceTrafficDistribution off by default and ignores them
    nodes = three_zone_nodes()
    nodes[1]["status"]["nodeInfo"] = {"kubeletVersion": "v1.30.4"}
    d = diag(nodes, k8s.service(traffic_distribution="PreferClose"),
             [k8s.endpointslice("web-1", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1}))],
             version="1.37")
    assert d.reason == "kube-proxy-version-skew"
    assert d.locality_in_effect == {"a": True, "b": False, "c": True}
    assert d.proxy["n-b"].topology_mode == "" and d.proxy["n-a"].topology_mode == "PreferSameZone"
    w = next(w for w in d.warnings if w.code == "kube-proxy-version-skew")
    assert "zone b at 1.30 (n-b)" in w.message and "instead of 'PreferSameZone'" in w.message


def test_every_reason_in_vocabulary_is_covered_above() -> None:
    import inspect
    import sys

    src = inspect.getsource(sys.modules[__name__])
    for r in hints.REASONS:
        assert f'"{r}"' in src, r


# ------------------------------------------------------------------------------ warnings


def test_auto_shadows_traffic_distribution_and_refusal_means_no_hints() -> None:
    eps = own_zone_endpoints({"a": 2, "b": 1, "c": 1})
    d = diag(three_zone_nodes(), k8s.service(auto=True, traffic_distribution="PreferClose"),
             [k8s.endpointslice("s", "web", eps)])
    w = next(w for w in d.warnings if w.code == "auto-shadows-traffic-distribution")
    assert "no hints at all" in w.message
    assert all(h is None for h in d.controller.hints.values())
    ok = diag(three_zone_nodes(), k8s.service(auto=True, traffic_distribution="PreferClose"),
              [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1}))])
    assert "no hints at all" not in next(w.message for w in ok.warnings
                                         if w.code == "auto-shadows-traffic-distribution")


def test_deprecated_annotation_shadows_topology_mode() -> None:
    svc = k8s.service(annotations={hints.ANNOTATION_DEPRECATED: "Disabled", hints.ANNOTATION_TOPOLOGY_MODE: "Auto"})
    d = diag(three_zone_nodes(), svc,
             [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1}, False))])
    assert "deprecated-annotation-shadows-topology-mode" in codes(d)
    assert d.mode == "none" and d.reason == "not-requested"


def test_stale_hints_warning_names_endpoints() -> None:
    eps = own_zone_endpoints({"a": 1, "b": 1, "c": 1}, hinted=False)
    d = diag(three_zone_nodes(), k8s.service(auto=True), [k8s.endpointslice("s", "web", eps)], populated=[])
    w = next(w for w in d.warnings if w.code == "stale-hints")
    assert "3 endpoint(s)" in w.message and "10.0.0.1" in w.message
    assert d.controller.rewritten == ("s",)
    assert [e.reason for e in d.controller.events] == ["TopologyAwareHintsEnabled"]
    assert d.reason == "partial-hints"


def test_prefer_same_node_skew() -> None:
    nodes = three_zone_nodes() + [k8s.node("n-a2", "a")]
    eps = [k8s.endpoint("10.0.0.1", "a", "n-a", for_zones=["a"], for_nodes=["n-a"]),
           k8s.endpoint("10.0.0.2", "b", "n-b", for_zones=["b"], for_nodes=["n-b"]),
           k8s.endpoint("10.0.0.3", "c", "n-c", for_zones=["c"], for_nodes=["n-c"])]
    d = diag(nodes, k8s.service(traffic_distribution="PreferSameNode"), [k8s.endpointslice("s", "web", eps)])
    assert "prefer-same-node-skew" in codes(d)
    assert d.proxy["n-a"].topology_mode == "PreferSameNode"
    assert d.proxy["n-a2"].topology_mode == "PreferSameZone"
    assert d.proxy["n-a2"].cluster_endpoints == ("10.0.0.1:8080",)
    assert d.reason == "none"


def test_single_endpoint_zone() -> None:
    d = diag(three_zone_nodes()[:2], k8s.service(traffic_distribution="PreferClose"),
             [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1, "b": 3}))])
    w = next(w for w in d.warnings if w.code == "single-endpoint-zone")
    assert "a -> 10.0.0.1:8080" in w.message and "b ->" not in w.message


def test_node_without_zone_warning_and_unknown_client_zone() -> None:
    nodes = three_zone_nodes() + [k8s.node("bare", None)]
    d = diag(nodes, k8s.service(traffic_distribution="PreferClose"),
             [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1}))])
    assert "node-without-zone" in codes(d)
    assert d.locality_in_effect["unknown"] is False
    assert d.reason == "no-hints-for-zone"


def test_no_endpointslices_warning_in_model() -> None:
    d = diag(three_zone_nodes(), k8s.service(), [])
    assert "no-endpointslices" in codes(d) and d.reason == "no-endpoints"


def test_every_warning_code_is_covered() -> None:
    import inspect
    import sys

    src = inspect.getsource(sys.modules[__name__])
    for c in hints.WARNING_CODES:
        assert f'"{c}"' in src, c


def test_traffic_distribution_not_accepted_before_1_30() -> None:
    d = diag(three_zone_nodes(), k8s.service(traffic_distribution="PreferClose"),
             [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1}))], version="1.29")
    assert "needs Kubernetes 1.30+" in next(w.message for w in d.warnings
                                            if w.code == "traffic-distribution-not-accepted")
    assert all(h is None for h in d.controller.hints.values())
    assert d.reason == "feature-gate-disabled"


# ------------------------------------------------------------------------------ controller details


def test_dual_stack_populated_mark_is_per_service() -> None:
    eps4 = own_zone_endpoints({"a": 1, "b": 1, "c": 1}, hinted=False)
    eps6 = [k8s.endpoint(f"fd00::{i}", z, f"n-{z}") for i, z in enumerate("abc", 1)]
    svc = k8s.service(auto=True, families=("IPv4", "IPv6"))
    out = hints.evaluate_cluster(three_zone_nodes(), [svc],
                                 [k8s.endpointslice("s4", "web", eps4),
                                  k8s.endpointslice("s6", "web", eps6, address_type="IPv6")],
                                 hints_populated=[], strict=True)
    assert [d.address_type for d in out] == ["IPv4", "IPv6"]
    assert [e.message for e in out[0].controller.events] == [
        "Topology Aware Hints has been enabled, addressType: IPv4"]
    assert out[1].controller.events == ()
    assert out[1].controller.hints["fd00::2"] == hints.Hints(("b",), ())
    assert out[1].proxy["n-b"].cluster_endpoints == ("[fd00::1]:8080", "[fd00::2]:8080", "[fd00::3]:8080")


def test_topology_disabled_event_when_annotation_removed() -> None:
    d = diag(three_zone_nodes(), k8s.service(),
             [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1}))])
    assert [(e.type, e.message) for e in d.controller.events] == [
        ("Warning", "Topology Aware Hints has been disabled, addressType: IPv4")]
    assert all(h is None for h in d.controller.hints.values())


def test_float64_kep_example_refuses_three_endpoints() -> None:
    ratios = {"a": 0.4, "b": 0.32, "c": 0.28}
    res = hints.get_allocations(ratios, 3)
    assert res.allocations is None and dict(res.minimums or {}) == {"a": 2, "b": 1, "c": 1}
    assert hints.get_allocations(ratios, 6).allocations is None
    assert hints.minimum_accepted_endpoints(ratios, 3) == 7


def test_quantities_round_up_to_milli_cpu() -> None:
    assert hints.cpu_millis("3500m", "x") == 3500
    assert hints.cpu_millis("0.0001", "x") == 1
    assert hints.cpu_millis("2", "x") == 2000
    with pytest.raises(InputError, match="status.allocatable.cpu"):
        hints.cpu_millis("four", "Node n1")


def test_versions_and_gates() -> None:
    assert hints.KubeVersion.parse().gates == {"PreferSameTrafficDistribution": True}
    assert hints.KubeVersion.parse("1.35").gates == {
        "TopologyAwareHints": True, "ServiceTrafficDistribution": True, "PreferSameTrafficDistribution": True}
    assert hints.KubeVersion.parse("1.30").gates == {"TopologyAwareHints": True, "ServiceTrafficDistribution": False}
    assert hints.KubeVersion.parse("v1.34.2").gate("PreferSameTrafficDistribution") is True
    assert hints.KubeVersion.parse("1.27").gates == {"TopologyAwareHints": True}
    for bad, gates in (("1.26", None), ("1.38", None), ("2.0", None), ("1.27", {"ServiceTrafficDistribution": True}),
                       ("1.35", {"PreferSameTrafficDistribution": False}), ("1.33", {"TopologyAwareHints": False})):
        with pytest.raises(InputError):
            hints.KubeVersion.parse(bad, gates)


def test_proxy_map_is_lazy_and_complete() -> None:
    nodes = [k8s.node(f"w{i}", "abc"[i % 3]) for i in range(300)]
    d = diag(nodes, k8s.service(traffic_distribution="PreferClose"),
             [k8s.endpointslice("s", "web", [k8s.endpoint("10.0.0.1", "a", "w0", for_zones=["a"]),
                                           k8s.endpoint("10.0.0.2", "b", "w1", for_zones=["b"]),
                                           k8s.endpoint("10.0.0.3", "c", "w2", for_zones=["c"])])])
    assert len(d.proxy) == 300 and set(d.proxy) == {f"w{i}" for i in range(300)}
    assert d.proxy["w3"] is d.proxy["w6"]  # same zone, no endpoint: one shared decision
    assert d.proxy["w4"].cluster_endpoints == ("10.0.0.2:8080",)
    assert d.proxy_view("nope") is None


def test_headless_service_has_no_proxy_view() -> None:
    d = diag(three_zone_nodes(), k8s.service(traffic_distribution="PreferClose", headless=True),
             [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1}))])
    assert d.proxy_view("n-a") is None and dict(d.proxy) == {}


def test_non_strict_skips_bad_objects_and_reports_them() -> None:
    errors: list[InputError] = []
    bad_node = k8s.node("bad", "a", cpu="lots")
    out = hints.evaluate_cluster([bad_node, *three_zone_nodes()],
                                 [k8s.service(traffic_distribution="PreferClose"), {"kind": "Service"}],
                                 [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1}))], errors=errors)
    assert len(out) == 1 and len(errors) == 2
    assert "Node bad" in str(errors[0]) and "status.allocatable.cpu" in str(errors[0])
    with pytest.raises(InputError):
        hints.evaluate_cluster([bad_node], [], [], strict=True)


def test_controller_hints_for_the_lab() -> None:
    svc = k8s.service(auto=True)
    # a3 b2 c1 (+1 unready): desired 2 each, the first zone-a endpoint is donated to zone c
    sl = k8s.endpointslice("web-1", "web", own_zone_endpoints({"a": 3, "b": 2, "c": 1}, hinted=False)
                         + [k8s.endpoint("10.0.0.7", "a", "n-a", ready=False, for_zones=["x"])])
    other = k8s.endpointslice("other", "api", [k8s.endpoint("10.1.0.1", "a", "n-a")])
    new, events = hints.controller_hints(svc, [sl, other], three_zone_nodes())
    got = [e.get("hints") for e in new[0]["endpoints"]]
    assert got[:6] == [{"forZones": [{"name": z}]} for z in "caabbc"]
    assert got[6] == {"forZones": [{"name": "x"}]}  # unready: left as it was (Go copies the value)
    assert new[1] == other and "hints" not in sl["endpoints"][0]
    assert [e.reason for e in events] == ["TopologyAwareHintsEnabled"]
    assert hints.compute_slice_hints(svc, [sl], three_zone_nodes()) == [new[0]]


def test_donation_uses_first_endpoints_and_sorted_receiver() -> None:
    # 6 endpoints a4 b1 c1 in 3 equal zones: a gives 2, b and c each receive 1; the first two
    # zone-a endpoints donate, the first to b (sorted zone order), the second to c.
    eps = [k8s.endpoint(f"10.0.0.{i}", z, f"n-{z}") for i, z in enumerate("aaaabc", 1)]
    d = diag(three_zone_nodes(), k8s.service(auto=True), [k8s.endpointslice("s", "web", eps)])
    z = {a: h.for_zones for a, h in d.controller.hints.items() if h}
    assert z == {"10.0.0.1": ("b",), "10.0.0.2": ("c",), "10.0.0.3": ("a",), "10.0.0.4": ("a",),
                 "10.0.0.5": ("b",), "10.0.0.6": ("c",)}


def test_kube_proxy_1_29_ignores_third_party_hints_without_annotation() -> None:
    # hints written by another controller: kube-proxy <= 1.29 needs the annotation
    foreign = [k8s.endpointslice("web-x", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1}), managed=False)]
    d = diag(three_zone_nodes(), k8s.service(), foreign, version="1.29")
    assert d.reason == "not-requested" and d.proxy["n-a"].topology_mode == ""
    on = diag(three_zone_nodes(), k8s.service(annotations={hints.ANNOTATION_TOPOLOGY_MODE: "PreferZone"}),
              foreign, version="1.29")
    assert on.proxy["n-a"].topology_mode == "PreferSameZone"  # any non-disabled value enables it
    assert diag(three_zone_nodes(), k8s.service(), foreign, version="1.31").reason == "none"


def test_prefer_close_zoneless_endpoint_1_32_vs_1_33() -> None:
    # 1.30-1.32 write forZones [""] for a zoneless endpoint (filtering stays on in zone a);
    # 1.33+ write no zone hint, so kube-proxy stops filtering everywhere.
    nodes = [k8s.node("n-a", "a"), k8s.node("n-x", None)]
    eps = [k8s.endpoint("10.0.0.1", "a", "n-a"), k8s.endpoint("10.0.0.2", None, "n-x")]
    svc = k8s.service(traffic_distribution="PreferClose")
    d32 = diag(nodes, svc, [k8s.endpointslice("s", "web", eps)], version="1.32")
    assert d32.controller.hints["10.0.0.2"] == hints.Hints(("",), ())
    d33 = diag(nodes, svc, [k8s.endpointslice("s", "web", eps)], version="1.33")
    assert d33.controller.hints["10.0.0.2"] is None
    assert d33.controller.hints["10.0.0.1"] == hints.Hints(("a",), ())
    # apply what 1.33 writes, then ask kube-proxy
    new, _ = hints.controller_hints(svc, [k8s.endpointslice("s", "web", eps)], nodes, version="1.33")
    after = diag(nodes, svc, new, version="1.33")
    assert after.reason == "partial-hints" and after.proxy["n-a"].topology_mode == ""
    w = next(w for w in after.warnings if w.code == "ready-endpoints-without-hints")
    assert "10.0.0.2 (EndpointSlice s)" in w.message


# ------------------------------------------------------------------ expected cross-zone share


def _auto_hinted(counts: dict[str, int]) -> tuple[list[dict], dict, list[dict]]:  # type: ignore[type-arg]
    """Three equal zones, an Auto Service and its slice with the hints the controller writes."""
    nodes, svc = three_zone_nodes(), k8s.service(auto=True)
    slices = hints.compute_slice_hints(
        svc, [k8s.endpointslice("s", "web", own_zone_endpoints(counts, hinted=False))], nodes)
    return nodes, svc, slices


def test_expected_share_auto_donations_warn_while_in_effect() -> None:
    # Auto, 6 replicas spread 4/1/1: zone a donates one endpoint to b and one to c, so b
    # and c each select one own and one zone-a endpoint
    d = diag(*_auto_hinted({"a": 4, "b": 1, "c": 1}))
    assert d.reason == "none" and all(d.locality_in_effect.values())
    assert d.expected_cross_zone == {"a": 0.0, "b": 0.5, "c": 0.5}
    assert d.locality_scope == {"a": "zone", "b": "zone", "c": "zone"}
    assert d.donations == (("10.0.0.1", "a", "b"), ("10.0.0.2", "a", "c"))
    w = next(w for w in d.warnings if w.code == "expected-cross-zone")
    assert "50% of zone b's calls" in w.message and "50% of zone c's calls" in w.message
    assert "zone a" not in w.message
    b = next(g for g in d.client_groups if g.zone == "b")
    assert b.endpoints == ("10.0.0.1:8080", "10.0.0.5:8080") and b.cross_zone_share == 0.5
    assert (d.endpoint_zones["10.0.0.1:8080"], d.endpoint_zones["10.0.0.5:8080"]) == ("a", "b")
    doc = d.to_json()
    assert doc["expected_cross_zone"] == {"a": 0.0, "b": 0.5, "c": 0.5}
    assert doc["controller"]["donations"][0] == {"address": "10.0.0.1", "zone": "a", "for_zone": "b"}
    assert doc["controller"]["minimums"] == {"a": 2, "b": 2, "c": 2}
    assert doc["controller"]["hinted_per_zone"] == {"a": 2, "b": 2, "c": 2}
    assert doc["client_zones"]["b"][0]["cross_zone_share"] == 0.5
    assert doc["reason_sentence"] == hints.REASON_SENTENCES["none"]


def test_expected_share_no_warning_at_or_below_threshold() -> None:
    d = diag(*_auto_hinted({"a": 2, "b": 2, "c": 2}))
    assert d.expected_cross_zone == {"a": 0.0, "b": 0.0, "c": 0.0}
    assert "expected-cross-zone" not in codes(d) and d.donations == ()


def test_expected_share_prefer_same_zone_without_endpoint_in_a_zone() -> None:
    # zone c has no endpoint: kube-proxy there uses every endpoint, all in other zones
    d = diag(three_zone_nodes(), k8s.service(traffic_distribution="PreferSameZone"),
             [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1, "b": 1}))])
    assert d.locality_in_effect == {"a": True, "b": True, "c": False}
    assert d.expected_cross_zone == {"a": 0.0, "b": 0.0, "c": 1.0}
    assert "expected-cross-zone" not in codes(d)  # only where locality is in effect


def test_expected_share_partial_hints_spreads_everywhere() -> None:
    eps = own_zone_endpoints({"a": 2, "b": 1, "c": 1})
    eps[0].pop("hints")
    d = diag(three_zone_nodes(), k8s.service(traffic_distribution="PreferClose"), [k8s.endpointslice("s", "web", eps)])
    assert d.reason == "partial-hints"
    assert d.expected_cross_zone == {"a": 0.5, "b": 0.75, "c": 0.75}


def test_expected_share_weighs_nodes_of_a_zone_equally() -> None:
    # PreferSameNode hints: n-b keeps its calls on its own endpoint (0 cross); b2 has no
    # node hint and zone b no zone hint, so it spreads over all three (2 of 3 cross): zone
    # b's share is the mean over its two nodes, 1/3
    nodes = [*three_zone_nodes(), k8s.node("b2", "b", cpu="4")]
    eps = [k8s.endpoint("10.0.0.1", "a", "n-a", for_zones=["a"], for_nodes=["n-a"]),
           k8s.endpoint("10.0.0.2", "b", "n-b", for_zones=["a"], for_nodes=["n-b"]),
           k8s.endpoint("10.0.0.3", "c", "n-c", for_zones=["c"], for_nodes=["n-c"])]
    d = diag(nodes, k8s.service(traffic_distribution="PreferSameNode"), [k8s.endpointslice("s", "web", eps)])
    by_node = {g.sample[0]: g.cross_zone_share for g in d.client_groups if g.zone == "b"}
    assert by_node == {"n-b": 0.0, "b2": 2 / 3}
    assert d.expected_cross_zone["b"] == 1 / 3
    assert d.locality_scope["b"] == "off" and d.locality_scope["c"] == "node"


def test_node_local_is_its_own_state() -> None:
    # internalTrafficPolicy Local: ClusterIP traffic never leaves the node, so locality is
    # in effect everywhere (node-local); nodes without a local endpoint drop their calls
    d = diag(three_zone_nodes(), k8s.service(internal_traffic_policy="Local"),
             [k8s.endpointslice("s", "web", own_zone_endpoints({"a": 1, "b": 1}))])
    assert d.reason == "internal-traffic-policy-local"
    assert d.locality_in_effect == {"a": True, "b": True, "c": True}
    assert d.locality_scope == {"a": "node", "b": "node", "c": "node"}
    assert d.expected_cross_zone == {"a": 0.0, "b": 0.0, "c": None}
    assert "Node-local" in d.reason_sentence and "expected-cross-zone" not in codes(d)


def test_prefer_same_node_scope_per_zone() -> None:
    nodes = [*three_zone_nodes(), k8s.node("a2", "a", cpu="4")]
    eps = [k8s.endpoint(f"10.0.0.{i}", z, f"n-{z}") for i, z in enumerate("abc", 1)]
    svc = k8s.service(traffic_distribution="PreferSameNode")
    slices = hints.compute_slice_hints(svc, [k8s.endpointslice("s", "web", eps)], nodes)
    d = diag(nodes, svc, slices)
    # zone a: n-a keeps calls on the node, a2 only in the zone; b and c: every node has one
    assert d.locality_scope == {"a": "zone", "b": "node", "c": "node"}
    assert d.expected_cross_zone == {"a": 0.0, "b": 0.0, "c": 0.0}
