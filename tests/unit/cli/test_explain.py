"""zonemeter explain: output contracts, --help of both model verbs, and every bad-input path (exit 2, one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import cli, hints
from tests.fixtures import k8s
from tests.fixtures.topologies import own_zone_endpoints, three_zone_nodes


def dump(path: Path, items: list[dict]) -> Path:
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    return path


def cluster(tmp_path: Path, extra: list[dict] | None = None) -> Path:
    items = [*three_zone_nodes(), k8s.service(auto=True),
             k8s.endpointslice("web-1", "web", own_zone_endpoints({"a": 2, "b": 2, "c": 2}, hinted=False)),
             *(extra or [])]
    return dump(tmp_path / "dump.json", items)


def run(argv: list[str], capsys) -> tuple[int, str, str]:  # type: ignore[no-untyped-def]
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, out: str, err: str, *parts: str) -> None:
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("zonemeter: error: ")
    assert "Traceback" not in err
    for p in parts:
        assert p in err, (p, err)


@pytest.mark.parametrize("verb", ["explain", "what-if"])
def test_help(verb: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        cli.main([verb, "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "examples:" in text
    if verb == "explain":  # the exit codes are documented where a user looks first
        assert "exit codes: 0 every Service explained; 3 some object could not be used" in text


def test_explain_json_schema_exactly(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(["explain", "--snapshot", str(cluster(tmp_path)), "-o", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"kubernetes_version", "kubernetes_version_source", "kube_proxy_version",
                        "kube_proxy_versions", "version_warnings", "services", "problems"}
    assert doc["problems"] == []
    assert doc["kubernetes_version"] == "1.37" and doc["kubernetes_version_source"] == "default"
    assert (doc["kube_proxy_version"], doc["kube_proxy_versions"], doc["version_warnings"]) == ("1.37", {}, [])
    (s,) = doc["services"]
    assert set(s) == {"namespace", "name", "address_type", "mechanism", "controller", "observed_hints",
                      "proxy", "locality_in_effect", "locality_scope", "expected_cross_zone", "client_zones",
                      "endpoint_zones", "reason", "reason_sentence", "warnings"}
    assert set(s["controller"]) == {"hints_enabled", "events", "zone_cpu_ratios", "ready_endpoints", "minimums",
                                    "sum_of_minimums", "allocations", "hinted_per_zone", "donations", "hints"}
    assert set(s["client_zones"]["a"][0]) == {"nodes", "sample", "kube_proxy_version", "topology_mode",
                                              "internal_traffic", "endpoints", "cross_zone_share"}
    # the slices carry no hints yet, so kube-proxy spreads over all six: 4 of 6 cross
    assert s["expected_cross_zone"] == {"a": 4 / 6, "b": 4 / 6, "c": 4 / 6}
    assert set(s["proxy"]) == {"n-a", "n-b", "n-c"}
    assert set(s["proxy"]["n-a"]) == {"topology_mode", "cluster_endpoints", "local_endpoints",
                                      "internal_traffic", "external_traffic"}
    assert s["controller"]["hints"]["10.0.0.1"] == {"forZones": ["a"], "forNodes": []}
    assert s["observed_hints"]["10.0.0.1"] is None
    assert s["controller"]["allocations"]["a"] == {"minimum": 2, "maximum": 2, "desired": 2.0}
    assert s["reason"] == "partial-hints"
    assert {w["code"] for w in s["warnings"]} == {"stale-hints"}


def test_explain_table_and_node_filter(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(["explain", "--snapshot", str(cluster(tmp_path)), "--node", "n-b",
                        "--service", "shop/web"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "Kubernetes 1.37: 1 Service entry"
    assert lines[1].split() == ["SERVICE", "FAMILY", "MECHANISM", "REASON", "LOCAL", "ZONES", "EXPECTED",
                                "CROSS-ZONE"]
    assert lines[2].split()[:3] == ["shop/web", "IPv4", "topology-mode-annotation"]
    assert "partial-hints" in lines[2] and "0/3" in lines[2] and lines[2].endswith("max 67% (a,b,c)")
    assert any(line.startswith("    ! stale-hints:") for line in lines)
    assert any("node n-b: topology_mode=''" in line and "internal=cluster" in line for line in lines)
    code, out, _ = run(["explain", "--snapshot", str(cluster(tmp_path)), "--node", "n-b", "-o", "json"], capsys)
    assert set(json.loads(out)["services"][0]["proxy"]) == {"n-b"}


def _auto_411(tmp_path: Path) -> Path:
    """Auto on 6 replicas spread 4/1/1 over three equal zones, slices hinted as the controller
    writes them, and an internalTrafficPolicy Local Service with endpoints in a and b."""
    nodes, svc = three_zone_nodes(), k8s.service(auto=True)
    slices = hints.compute_slice_hints(
        svc, [k8s.endpointslice("web-1", "web", own_zone_endpoints({"a": 4, "b": 1, "c": 1}, hinted=False))], nodes)
    return dump(tmp_path / "dump.json", [
        *nodes, svc, *slices, k8s.service("cache", cluster_ip="10.96.1.2", internal_traffic_policy="Local"),
        k8s.endpointslice("cache-1", "cache", own_zone_endpoints({"a": 1, "b": 1}, hinted=False))])


def test_explain_table_expected_share_and_node_local(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(["explain", "--snapshot", str(_auto_411(tmp_path))], capsys)
    assert code == 0
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("shop/")}
    assert rows["shop/web"].split()[3:] == ["none", "3/3", "max", "50%", "(b,c)"]
    # node-local is its own state, not "locality off" (0/3)
    assert rows["shop/cache"].split()[3:] == ["internal-traffic-policy-local", "3/3", "node-local", "0%"]
    assert "  ! expected-cross-zone: locality is in effect, yet the endpoints kube-proxy selects send an " \
           "expected 50% of zone b's calls, 50% of zone c's calls to other zones (warning above 25%)" in out


def test_explain_service_prints_the_full_diagnosis(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(["explain", "--snapshot", str(_auto_411(tmp_path)), "--service", "shop/web"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert "  mechanism: topology-mode-annotation (requested: topology-mode)" in lines
    assert f"  reason: none: {hints.REASON_SENTENCES['none']}" in lines
    assert "  controller: 6 ready endpoint(s); hints written" in lines
    table = lines[lines.index("    zone  CPU share  minimum  maximum  desired  hinted"):][:4]
    assert [r.split() for r in table[1:]] == [[z, "0.333", "2", "2", "2.00", "2"] for z in "abc"]
    assert "    sum of minimums 6 of 6 ready endpoint(s) (minimum = ceil(CPU share x N / 1.2))" in lines
    assert "    donated: 10.0.0.1 (zone a) is hinted for zone b" in lines
    assert "    donated: 10.0.0.2 (zone a) is hinted for zone c" in lines
    assert "    zone b: expected cross-zone 50%" in lines
    assert ("      1 node(s) (n-b): cluster (PreferSameZone) -> 10.0.0.1:8080 (zone a), 10.0.0.5:8080 (zone b); "
            "cross-zone 50%") in lines
    assert any(line.startswith("    ! expected-cross-zone: ") for line in lines)
    assert "  events the controller would emit: none" in lines
    code, out, _ = run(["explain", "--snapshot", str(_auto_411(tmp_path)), "--service", "shop/cache"], capsys)
    lines = out.splitlines()
    assert "  locality: a node, b node, c node  (node = kept on the client's node, zone = in its zone, " \
           "off = every zone)" in lines
    assert "      1 node(s) (n-a): local -> 10.0.0.1:8080 (zone a); cross-zone 0%" in lines
    assert "      1 node(s) (n-c): DROP: no call delivered" in lines
    assert "    Warning TopologyAwareHintsDisabled: Topology Aware Hints has been disabled, addressType: IPv4" \
        not in lines  # never populated: no Disabled event
    assert any(line.startswith("    ! internal-traffic-policy-local-drops: ") for line in lines)


def test_explain_service_json_carries_the_same(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(["explain", "--snapshot", str(_auto_411(tmp_path)), "--service", "shop/web", "-o", "json"],
                       capsys)
    (s,) = json.loads(out)["services"]
    assert s["reason_sentence"] == hints.REASON_SENTENCES["none"]
    assert s["expected_cross_zone"] == {"a": 0.0, "b": 0.5, "c": 0.5}
    assert s["locality_scope"] == {"a": "zone", "b": "zone", "c": "zone"}
    c = s["controller"]
    assert (c["ready_endpoints"], c["minimums"], c["sum_of_minimums"], c["hinted_per_zone"]) == (
        6, {"a": 2, "b": 2, "c": 2}, 6, {"a": 2, "b": 2, "c": 2})
    assert c["donations"] == [{"address": "10.0.0.1", "zone": "a", "for_zone": "b"},
                              {"address": "10.0.0.2", "zone": "a", "for_zone": "c"}]
    assert s["client_zones"]["b"] == [{
        "nodes": 1, "sample": ["n-b"], "kube_proxy_version": None, "topology_mode": "PreferSameZone",
        "internal_traffic": "cluster", "endpoints": ["10.0.0.1:8080", "10.0.0.5:8080"],
        "cross_zone_share": 0.5}]
    assert s["endpoint_zones"] == {f"10.0.0.{i}:8080": z for i, z in enumerate("aaaabc", 1)}
    assert [w["code"] for w in s["warnings"]] == ["expected-cross-zone"]


def test_version_and_gates_flags(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, out, _ = run(["explain", "--snapshot", str(cluster(tmp_path)), "--kubernetes-version", "1.32",
                        "--feature-gates", "TopologyAwareHints=false", "-o", "json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["kubernetes_version"] == "1.32" and doc["services"][0]["reason"] == "feature-gate-disabled"


def _versioned(tmp_path: Path, server: str | None, kubelet_b: str | None = None) -> Path:
    """PreferClose over three zones, n-b's kubelet at ``kubelet_b``, and a version.json of
    ``server`` beside the dump (none when None)."""
    nodes = three_zone_nodes()
    if kubelet_b is not None:
        nodes[1]["status"]["nodeInfo"] = {"kubeletVersion": kubelet_b, "kubeProxyVersion": ""}
    path = dump(tmp_path / "dump.json", [*nodes, k8s.service(traffic_distribution="PreferClose"),
                                         k8s.endpointslice("web-1", "web", own_zone_endpoints(
                                             {"a": 1, "b": 1, "c": 1}))])
    if server is not None:
        (tmp_path / "version.json").write_text(json.dumps({
            "clientVersion": {"gitVersion": "v1.34.0"},
            "serverVersion": {"major": "1", "minor": "33+", "gitVersion": server}}))
    return path


def test_snapshot_version_json_sets_the_control_plane_version(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = _versioned(tmp_path, "v1.33.5-eks-abc")
    code, out, err = run(["explain", "--snapshot", str(path), "-o", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and err == ""
    assert (doc["kubernetes_version"], doc["kubernetes_version_source"]) == ("1.33", "snapshot")
    # the flag still wins over version.json
    code, out, _ = run(["explain", "--snapshot", str(path), "--kubernetes-version", "1.30", "-o", "json"], capsys)
    doc = json.loads(out)
    assert (doc["kubernetes_version"], doc["kubernetes_version_source"]) == ("1.30", "flag")
    assert doc["services"][0]["reason"] == "feature-gate-disabled"  # 1.30: gate off by default


def test_snapshot_version_outside_the_range_is_said_once(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = _versioned(tmp_path, "v1.38.0")
    code, out, err = run(["explain", "--snapshot", str(path), "-o", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["kubernetes_version"] == "1.37"
    assert err.count("\n") == 1 and "v1.38.0" in err and "modelling it as 1.37" in err
    assert len(doc["version_warnings"]) == 1 and "newer than the hint model covers" in doc["version_warnings"][0]
    path = _versioned(tmp_path, "v1.20.1")
    code, out, err = run(["explain", "--snapshot", str(path)], capsys)
    assert code == 0 and out.startswith("Kubernetes 1.27:") and err.count("\n") == 1 and "older" in err


def test_snapshot_node_kube_proxy_versions_and_the_override(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = _versioned(tmp_path, "v1.37.2", kubelet_b="v1.30.4")
    code, out, _ = run(["explain", "--snapshot", str(path), "-o", "json"], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["kube_proxy_versions"] == {"n-b": "1.30"}
    (s,) = doc["services"]
    assert s["reason"] == "kube-proxy-version-skew"
    assert s["proxy"]["n-b"]["topology_mode"] == "" and s["proxy"]["n-a"]["topology_mode"] == "PreferSameZone"
    code, out, _ = run(["explain", "--snapshot", str(path)], capsys)
    assert out.splitlines()[1] == "kube-proxy 1.30 on 1 node(s) (n-b)"
    # --kube-proxy-version 1.37 judges n-b as 1.37: locality everywhere
    code, out, _ = run(["explain", "--snapshot", str(path), "--kube-proxy-version", "1.37", "-o", "json"], capsys)
    doc = json.loads(out)
    assert doc["kube_proxy_versions"] == {} and doc["services"][0]["reason"] == "none"


def test_malformed_version_json_is_one_line(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    path = _versioned(tmp_path, None)
    (tmp_path / "version.json").write_text(json.dumps({"clientVersion": {"gitVersion": "v1.34.0"}}))
    code, out, err = run(["explain", "--snapshot", str(path)], capsys)
    assert_one_line_error(code, out, err, "version.json", "serverVersion")
    code, out, err = run(["explain", "--snapshot", str(path), "--kube-proxy-version", "2.x"], capsys)
    assert_one_line_error(code, out, err, "--kube-proxy-version")


def test_unknown_kinds_ignored(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x", "namespace": "shop"}}
    code, out, _ = run(["explain", "--snapshot", str(cluster(tmp_path, [cm])), "-o", "json"], capsys)
    assert code == 0 and len(json.loads(out)["services"]) == 1


def test_yaml_multi_document_dump(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    import yaml

    items = [*three_zone_nodes(), k8s.service(traffic_distribution="PreferClose"),
             k8s.endpointslice("web-1", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1}))]
    p = tmp_path / "dump.yaml"
    p.write_text(yaml.safe_dump_all(items))
    code, out, _ = run(["explain", "--snapshot", str(p), "-o", "json"], capsys)
    assert code == 0 and json.loads(out)["services"][0]["reason"] == "none"


def test_malformed_json(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "bad.json"
    p.write_text('{"kind": "List", "items": [')
    assert_one_line_error(*run(["explain", "--snapshot", str(p)], capsys), str(p), "invalid JSON")


def test_malformed_yaml(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "bad.yaml"
    p.write_text("kind: Node\nmetadata: {name: [unclosed\n")
    assert_one_line_error(*run(["explain", "--snapshot", str(p)], capsys), str(p), "invalid YAML")


def test_missing_file(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert_one_line_error(*run(["explain", "--snapshot", str(tmp_path / "nope.json")], capsys), "nope.json")


@pytest.mark.parametrize("content", ["", "\n", "---\n", '{"apiVersion": "v1", "kind": "List", "items": []}'])
def test_empty_snapshot_is_bad_input(tmp_path: Path, content: str, capsys) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "empty.json"
    p.write_text(content)
    assert_one_line_error(*run(["explain", "--snapshot", str(p)], capsys), str(p),
                          "no Node, Service or EndpointSlice")


def test_snapshot_with_nodes_but_no_services_says_so(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    p = dump(tmp_path / "nodes.json", three_zone_nodes())
    code, out, _ = run(["explain", "--snapshot", str(p)], capsys)
    assert code == 0 and "0 Service entries" in out and "no Services in the input" in out
    code, out, _ = run(["explain", "--snapshot", str(p), "-o", "json"], capsys)
    assert code == 0 and json.loads(out)["services"] == []


def test_bad_cpu_quantity_names_node_and_field(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # a malformed Node is a row of its own; it still counts with unknown CPU, so Auto is
    # refused (as the controller would), and the Service is explained; exit 3
    p = cluster(tmp_path, [k8s.node("n-x", "a", cpu="4 cores")])
    code, out, err = run(["explain", "--snapshot", str(p)], capsys)
    assert code == 3 and err == ""
    rows = {line.split()[0] + " " + line.split()[1]: line for line in out.splitlines()
            if line.startswith(("shop/", "Node "))}
    assert rows["shop/web IPv4"].split()[4] == "insufficient-node-info"
    assert rows["Node n-x"].split()[2:] == ["-", "-", "malformed-object", "-", "-"]
    assert f"  ! {p}: Node n-x: status.allocatable.cpu: bad quantity '4 cores': Invalid number format: " \
           "4 cores" in out.splitlines()
    assert "1 object(s) could not be used (rows with FAMILY -); every other Service is explained" in out
    code, out, _ = run(["explain", "--snapshot", str(p), "-o", "json"], capsys)
    doc = json.loads(out)
    assert code == 3 and [s["name"] for s in doc["services"]] == ["web"]
    assert doc["problems"] == [{"object": "Node n-x", "service": None, "reason": "malformed-object",
                                "message": f"{p}: Node n-x: status.allocatable.cpu: bad quantity '4 cores': "
                                           "Invalid number format: 4 cores"}]


def test_endpointslice_missing_field(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    sl = k8s.endpointslice("web-2", "web", [k8s.endpoint("10.0.0.9", "a", "n-a")])
    del sl["addressType"]
    p = cluster(tmp_path, [sl])
    assert_one_line_error(*run(["explain", "--snapshot", str(p)], capsys), str(p),
                          "EndpointSlice shop/web-2", "addressType")


def test_endpoint_without_addresses(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    sl = k8s.endpointslice("web-2", "web", [{"conditions": {"ready": True}}])
    p = cluster(tmp_path, [sl])
    assert_one_line_error(*run(["explain", "--snapshot", str(p)], capsys), "EndpointSlice shop/web-2",
                          "endpoints[0].addresses")


def test_bad_condition_type(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    sl = k8s.endpointslice("web-2", "web", [k8s.endpoint("10.0.0.9", "a", "n-a")])
    sl["endpoints"][0]["conditions"]["ready"] = "yes"
    p = cluster(tmp_path, [sl])
    assert_one_line_error(*run(["explain", "--snapshot", str(p)], capsys), "endpoints[0].conditions.ready")


def test_object_without_name(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    p = cluster(tmp_path, [{"apiVersion": "v1", "kind": "Service", "metadata": {"namespace": "x"}}])
    code, out, _ = run(["explain", "--snapshot", str(p), "-o", "json"], capsys)
    doc = json.loads(out)
    assert code == 3 and [s["name"] for s in doc["services"]] == ["web"]
    assert doc["problems"] == [{
        "object": "Service (document 1 items[5])", "service": None, "reason": "malformed-object",
        "message": f"{p}: Service (document 1 items[5]): metadata.name: missing or not a string"}]
    # the nameless Service alone: no usable Service, bad input
    alone = dump(tmp_path / "alone.json", [*three_zone_nodes(),
                                           {"apiVersion": "v1", "kind": "Service", "metadata": {}}])
    assert_one_line_error(*run(["explain", "--snapshot", str(alone)], capsys), str(alone), "metadata.name")


def test_service_without_slices(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    p = cluster(tmp_path, [k8s.service(name="api", cluster_ip="10.96.1.9")])
    code, out, err = run(["explain", "--snapshot", str(p)], capsys)
    assert code == 3 and err == ""
    lines = out.splitlines()
    assert lines[0] == "Kubernetes 1.37: 1 Service entry"
    row = next(line for line in lines if line.startswith("shop/api"))
    assert row.split() == ["shop/api", "-", "-", "no-endpointslices", "-", "-"]
    assert lines[lines.index(row) + 1] == (
        f"  ! {p}: Service shop/api: metadata.name: has a selector but no EndpointSlice labelled "
        "kubernetes.io/service-name=api (dump endpointslices too: kubectl get "
        "nodes,services,endpointslices,pods -A -o json)")
    assert any(line.startswith("shop/web ") for line in lines)  # every other Service explained
    # asked for by name, the odd Service alone is bad input
    assert_one_line_error(*run(["explain", "--snapshot", str(p), "--service", "shop/api"], capsys), str(p),
                          "Service shop/api", "no EndpointSlice labelled kubernetes.io/service-name=api")
    # and asking for another Service does not report it
    code, out, _ = run(["explain", "--snapshot", str(p), "--service", "shop/web", "-o", "json"], capsys)
    assert code == 0 and json.loads(out)["problems"] == []


def test_one_malformed_slice_leaves_only_its_service_unexplained(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    bad = k8s.endpointslice("api-1", "api", [k8s.endpoint("10.0.0.9", "a", "n-a")])
    bad["endpoints"][0]["conditions"]["ready"] = "yes"
    p = cluster(tmp_path, [k8s.service(name="api", cluster_ip="10.96.1.9"), bad])
    code, out, _ = run(["explain", "--snapshot", str(p), "-o", "json"], capsys)
    doc = json.loads(out)
    assert code == 3 and [s["name"] for s in doc["services"]] == ["web"]
    (prob,) = doc["problems"]
    assert (prob["object"], prob["service"], prob["reason"]) == ("EndpointSlice shop/api-1", "shop/api",
                                                                 "malformed-object")
    assert prob["message"].startswith(f"{p}: EndpointSlice shop/api-1: endpoints[0].conditions.ready")
    code, out, _ = run(["explain", "--snapshot", str(p)], capsys)
    assert code == 3
    assert next(line for line in out.splitlines() if line.startswith("shop/api")).split()[3] == "malformed-object"


def test_selectorless_service_without_slices_is_fine(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    svc = k8s.service(name="ext")
    del svc["spec"]["selector"]
    code, out, _ = run(["explain", "--snapshot", str(cluster(tmp_path, [svc])), "--service", "shop/ext",
                        "-o", "json"], capsys)
    assert code == 0 and json.loads(out)["services"][0]["reason"] == "no-endpoints"


@pytest.mark.parametrize(("flags", "parts"), [
    (["--service", "shop/nope"], ["--service", "no such Service"]),
    (["--service", "nope"], ["--service", "NAMESPACE/NAME"]),
    (["--node", "n-z"], ["--node", "n-z"]),
    (["--kubernetes-version", "1.26"], ["--kubernetes-version", "1.26"]),
    (["--feature-gates", "Nope=true"], ["--feature-gates", "Nope"]),
    (["--feature-gates", "PreferSameTrafficDistribution=maybe"], ["--feature-gates"]),
    (["--feature-gates", "PreferSameTrafficDistribution=false"], ["locked"]),
])
def test_bad_flags(flags: list[str], parts: list[str], tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert_one_line_error(*run(["explain", "--snapshot", str(cluster(tmp_path)), *flags], capsys), *parts)


def test_bad_kubeconfig(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "kubeconfig"
    p.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\n")
    assert_one_line_error(*run(["explain", "--kubeconfig", str(p)], capsys), str(p), "kubeconfig")


def test_list_cluster_uses_api_shaped_dicts() -> None:
    from kubernetes import client

    from agent.k8s.client import list_cluster

    api = client.ApiClient()
    node = client.V1Node(metadata=client.V1ObjectMeta(name="n1", labels={hints.LABEL_ZONE: "a"}),
                         status=client.V1NodeStatus(allocatable={"cpu": "2"}))

    class Fake:
        def __init__(self, items):  # type: ignore[no-untyped-def]
            self.items = items

    core = client.CoreV1Api
    disc = client.DiscoveryV1Api
    orig = (core.list_node, core.list_service_for_all_namespaces, disc.list_endpoint_slice_for_all_namespaces)
    try:
        core.list_node = lambda self: Fake([node])  # type: ignore[method-assign]
        core.list_service_for_all_namespaces = lambda self: Fake([])  # type: ignore[method-assign]
        disc.list_endpoint_slice_for_all_namespaces = lambda self: Fake([])  # type: ignore[method-assign]
        got = list_cluster(api)
    finally:
        core.list_node, core.list_service_for_all_namespaces, disc.list_endpoint_slice_for_all_namespaces = orig
    assert got["nodes"] == [{"kind": "Node", "metadata": {"name": "n1", "labels": {hints.LABEL_ZONE: "a"}},
                             "status": {"allocatable": {"cpu": "2"}}}]
    assert hints.parse_node_info(got["nodes"][0]).cpu_milli == 2000


@pytest.mark.parametrize("extra", [[], ["--service", "shop/web"]])
def test_readme_explain_example_is_what_explain_prints(extra: list[str], capsys) -> None:  # type: ignore[no-untyped-def]
    """README.md shows explain's output on docs/examples/three-zones.json verbatim."""
    root = Path(__file__).resolve().parents[3]
    code, out, _ = run(["explain", "--snapshot", str(root / "docs/examples/three-zones.json"), *extra], capsys)
    assert code == 0
    assert f"```\n{out}```\n" in (root / "README.md").read_text()
