"""Lab topology validation, address plan, kube-proxy rule rendering, ground-truth parsing."""

from __future__ import annotations

import copy
import ipaddress
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.errors import InputError
from tools.lab import DEFAULT_TOPOLOGY, Topology, groundtruth, kubeproxy

BASE: dict[str, Any] = yaml.safe_load(DEFAULT_TOPOLOGY)


def _with(path: str, value: Any) -> dict[str, Any]:
    """Return BASE with the dotted ``path`` (list indexes as numbers) set to ``value``."""
    data = copy.deepcopy(BASE)
    *parents, last = path.split(".")
    node: Any = data
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


# ------------------------------------------------------------------ valid input


def test_default_topology_resolves_addresses() -> None:
    topo = Topology.from_yaml(DEFAULT_TOPOLOGY)
    assert [n.name for n in topo.nodes] == ["a1", "a2", "b1"]
    a1 = topo.node("a1")
    assert a1.ip == ipaddress.IPv4Address("192.168.100.1")
    assert a1.pod_cidr == ipaddress.IPv4Network("10.244.1.0/24")
    assert topo.pod("client-a1").ip == ipaddress.IPv4Address("10.244.1.2")
    assert topo.pod("web-a1").ip == ipaddress.IPv4Address("10.244.1.3")
    assert topo.pod("web-b1").ip == ipaddress.IPv4Address("10.244.3.3")
    web = topo.service("shop/web")
    assert web.cluster_ip == ipaddress.IPv4Address("10.96.0.10")
    assert web.endpoints == ("web-a1", "web-a2", "web-b1")
    assert topo.service("web") is web
    assert web.cluster_ip6 is None and a1.ip6 is None


def test_ipv6_and_vxlan_addresses() -> None:
    data = _with("options", {"mode": "vxlan", "ipv6": True})
    topo = Topology.from_dict(data)
    b1 = topo.node("b1")
    assert b1.overlay_ip == ipaddress.IPv4Address("192.168.101.3")
    assert b1.pod_cidr_v6 == ipaddress.IPv6Network("fd00:244:0:3::/64")
    assert topo.pod("web-b1").ip6 == ipaddress.IPv6Address("fd00:244:0:3::3")
    assert topo.service("web").cluster_ip6 == ipaddress.IPv6Address("fd00:96::a")
    assert topo.options.pod_mtu == 1450


def test_explicit_addresses_are_kept_and_auto_skips_them() -> None:
    data = copy.deepcopy(BASE)
    data["pods"][1]["ip"] = "10.244.2.2"  # client-a2, first auto address of a2
    data["pods"][4]["ip"] = "10.244.2.9"  # web-a2
    topo = Topology.from_dict(data)
    assert topo.pod("client-a2").ip == ipaddress.IPv4Address("10.244.2.2")
    assert topo.pod("web-a2").ip == ipaddress.IPv4Address("10.244.2.9")


def test_lab_index_keeps_gaps_and_fills_them_in_order() -> None:
    data = copy.deepcopy(BASE)
    data["pods"] = data["pods"][:2]
    data["pods"][0]["labIndex"] = 1
    data["pods"].append({"name": "late", "node": "b1"})
    del data["services"]
    topo = Topology.from_dict(data)
    assert [(p.name, p.index) for p in topo.pods] == [("client-a1", 1), ("client-a2", 0),
                                                       ("late", 2)]


def test_round_trip_through_to_dict() -> None:
    topo = Topology.from_dict(_with("options", {"mode": "vxlan", "ipv6": True}))
    again = Topology.from_dict(json.loads(json.dumps(topo.to_dict())))
    assert again.pods == topo.pods and again.services == topo.services
    assert again.nodes == topo.nodes and again.options == topo.options


def test_offloads_option_is_off_by_default_and_round_trips_when_on() -> None:
    assert Topology.from_dict(BASE).options.offloads is False
    assert "offloads" not in Topology.from_dict(BASE).to_dict()["options"]  # state files unchanged
    topo = Topology.from_dict(_with("options", {"offloads": True}))
    assert topo.options.offloads is True and topo.to_dict()["options"]["offloads"] is True
    again = Topology.from_dict(json.loads(json.dumps(topo.to_dict())))
    assert again.options == topo.options
    with pytest.raises(InputError) as err:
        Topology.from_dict(_with("options", {"offloads": "yes"}))
    assert err.value.field == "offloads" and "\n" not in str(err.value)


def test_data_plane_is_kube_proxy_by_default_and_bypass_round_trips() -> None:
    topo = Topology.from_dict(BASE)
    assert {n.data_plane for n in topo.nodes} == {"kube-proxy"}
    assert all("dataPlane" not in n for n in topo.to_dict()["nodes"])  # state files unchanged
    topo = Topology.from_dict(_with("nodes.0.dataPlane", "bypass"))
    assert [n.data_plane for n in topo.nodes][:2] == ["bypass", "kube-proxy"]
    again = Topology.from_dict(json.loads(json.dumps(topo.to_dict())))
    assert again.nodes == topo.nodes


def test_from_yaml_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "lab.yaml"
    path.write_text(DEFAULT_TOPOLOGY)
    assert Topology.from_yaml(str(path)).source == str(path)
    assert Topology.from_yaml(path).pods == Topology.from_yaml(DEFAULT_TOPOLOGY).pods


# ------------------------------------------------------------------ errors name the field


@pytest.mark.parametrize("data, obj, field, problem", [
    (_with("options", {"mode": "mesh"}), "options", "mode", "flat, vxlan"),
    (_with("options", {"ipv6": "yes"}), "options", "ipv6", "true or false"),
    (_with("options", {"pod_cidr": "10.244.0.0/24"}), "options", "pod_cidr", "/22"),
    (_with("options", {"node_cidr": "fd00::/64"}), "options", "node_cidr", "IPv4"),
    (_with("options", {"bogus": 1}), "options", "bogus", "unknown field"),
    (_with("zones", []), None, "zones", "at least one"),
    (_with("nodes.0.zone", "zone-z"), "Node a1", "zone", "unknown zone"),
    (_with("nodes.0.cpu", -1), "Node a1", "cpu", "positive"),
    (_with("nodes.1.name", "a1"), "Node a1", "name", "duplicate"),
    (_with("nodes.0.name", "A_1"), "nodes[0]", "name", "DNS label"),
    (_with("nodes.0.dataPlane", "cilium"), "Node a1", "dataPlane", "kube-proxy, bypass"),
    ({**_with("nodes.0.dataPlane", "bypass"), "options": {"mode": "vxlan"}}, "Node a1", "dataPlane", "flat"),
    (_with("pods.0.node", "zz"), "Pod client-a1", "node", "unknown node"),
    (_with("pods.0.ip", "10.244.2.5"), "Pod client-a1", "ip", "pod CIDR"),
    (_with("pods.0.ip", "10.244.1.1"), "Pod client-a1", "ip", "reserved"),
    (_with("pods.0.ip", "nope"), "Pod client-a1", "ip", "not an IP"),
    (_with("pods.0.ip6", "fd00:244:0:1::5"), "Pod client-a1", "ip6", "ipv6 is false"),
    (_with("pods.3.ports", [{"port": 70000}]), "Pod web-a1", "ports[0].port", "1-65535"),
    (_with("pods.3.ports", [{"port": 40000}]), "Pod web-a1", "ports[0].port", "ephemeral"),
    (_with("pods.3.ports", [{"port": 80, "protocol": "SCTP"}]), "Pod web-a1",
     "ports[0].protocol", "TCP or UDP"),
    (_with("pods.3.ports", [{"port": 80}, {"port": 80}]), "Pod web-a1", "ports[1].port",
     "duplicate"),
    (_with("pods.0.labIndex", -1), "Pod client-a1", "labIndex", "0-99999"),
    (_with("pods.0.hostNetwork", "no"), "Pod client-a1", "hostNetwork", "true or false"),
    (_with("services.0.selector", {}), "Service shop/web", "selector", "empty selector"),
    (_with("services.0.ports", []), "Service shop/web", "ports", "at least one port"),
    (_with("services.0.ports.0.targetPort", "grpc"), "Service shop/web", "ports[0].targetPort",
     "has no port grpc"),
    (_with("services.0.ports.0.name", None), "Service shop/web", "ports[0].name", "need names"),
    (_with("services.0.trafficDistribution", "PreferZone"), "Service shop/web",
     "trafficDistribution", "PreferSameZone"),
    (_with("services.0.internalTrafficPolicy", "local"), "Service shop/web",
     "internalTrafficPolicy", "Cluster or Local"),
    (_with("services.0.clusterIP", "10.97.0.1"), "Service shop/web", "clusterIP", "service_cidr"),
    (_with("services.0.type", "ExternalName"), "Service shop/web", "type",
     "ClusterIP, NodePort, LoadBalancer"),
    (_with("services.0.ports.0.nodePort", 30080), "Service shop/web", "ports[0].nodePort",
     "only a Service of type NodePort or LoadBalancer"),
    (_with("services.0.externalTrafficPolicy", "Local"), "Service shop/web",
     "externalTrafficPolicy", "only NodePort and LoadBalancer"),
    (_with("services.0", {**BASE["services"][0], "type": "NodePort", "externalTrafficPolicy": "local"}),
     "Service shop/web", "externalTrafficPolicy", "Cluster or Local"),
    (_with("services.0", {**BASE["services"][0], "type": "NodePort", "clusterIP": "None"}),
     "Service shop/web", "clusterIP", "headless"),
    (_with("pods.3.ports", [{"port": 8080, "hostPort": 40000}]), "Pod web-a1", "ports[0].hostPort",
     "ephemeral"),
    (_with("pods.3.ports", [{"port": 8080, "hostPort": 30080}]), "Pod web-a1", "ports[0].hostPort",
     "node-port range"),
    (_with("pods.0.hostNetwork", True) | {"pods": [{**BASE["pods"][0], "hostNetwork": True,
                                                    "ports": [{"port": 80, "hostPort": 81}]},
                                                   *BASE["pods"][1:]]},
     "Pod client-a1", "ports[0].hostPort", "must equal its port"),
    (_with("outside", [{"name": "lb", "kind": "router", "zone": "zone-a"}]), "outside peer lb", "kind",
     "load-balancer, database, vm, external"),
    (_with("outside", [{"name": "lb", "kind": "load-balancer", "zone": "zone-z"}]), "outside peer lb",
     "zone", "unknown zone"),
    (_with("outside", [{"name": "net", "kind": "external", "zone": "zone-a"}]), "outside peer net",
     "zone", "no zone"),
    (_with("outside", [{"name": "db", "kind": "database", "zone": "zone-a", "type": "aws-alb"}]),
     "outside peer db", "type", "only a load-balancer"),
    (_with("outside", [{"name": "web-a1", "kind": "vm", "zone": "zone-a"}]), "outside peer web-a1",
     "name", "duplicate"),
    (_with("outside", [{"name": "db", "kind": "database", "zone": "zone-a", "ports": [50000]}]),
     "outside peer db", "ports[0].port", "ephemeral"),
])
def test_invalid_topology_names_object_and_field(data: Any, obj: str | None, field: str,
                                                 problem: str) -> None:
    with pytest.raises(InputError) as info:
        Topology.from_dict(data, source="lab.yaml")
    err = info.value
    assert (err.source, err.obj, err.field) == ("lab.yaml", obj, field)
    assert problem in err.problem
    assert "\n" not in str(err)


def test_service_with_both_selector_and_endpoints() -> None:
    data = _with("services.0.endpoints", ["web-a1"])
    with pytest.raises(InputError, match="exactly one of selector or endpoints"):
        Topology.from_dict(data)


def test_endpoint_in_other_namespace() -> None:
    data = copy.deepcopy(BASE)
    del data["services"][0]["selector"]
    data["services"][0]["endpoints"] = ["web-a1"]
    data["services"][0]["namespace"] = "other"
    with pytest.raises(InputError) as info:
        Topology.from_dict(data)
    assert info.value.field == "endpoints[0]" and "namespace shop" in info.value.problem


def test_host_network_ports_collide_on_a_node() -> None:
    data = copy.deepcopy(BASE)
    data["pods"] += [{"name": "h1", "node": "a1", "hostNetwork": True, "ports": [9100]},
                     {"name": "h2", "node": "a1", "hostNetwork": True, "ports": [9100]}]
    with pytest.raises(InputError) as info:
        Topology.from_dict(data)
    assert info.value.obj == "Pod h2" and "used on node a1 by pod h1" in info.value.problem


def test_invalid_yaml_names_the_line() -> None:
    with pytest.raises(InputError) as info:
        Topology.from_yaml("zones:\n  - [unclosed\n")
    assert info.value.source == "<yaml>" and info.value.obj and "line" in info.value.obj


def test_lookup_errors() -> None:
    topo = Topology.from_yaml(DEFAULT_TOPOLOGY)
    with pytest.raises(InputError, match="no such pod"):
        topo.pod("ghost")
    with pytest.raises(InputError, match="no such Service"):
        topo.service("shop/ghost")
    with pytest.raises(InputError, match="IPv6"):
        topo.pod("web-a1").address(6)


# ------------------------------------------------------------------ kube-proxy rules


def _rule(n: int, local: bool = False) -> kubeproxy.ProxyRule:
    eps = tuple((ipaddress.ip_address(f"10.244.1.{i + 2}"), 8080) for i in range(n))
    return kubeproxy.ProxyRule("shop/web", "http", ipaddress.ip_address("10.96.0.10"), 80, "TCP",
                               eps, local)


def test_render_random_probabilities_like_kube_proxy() -> None:
    text = kubeproxy.render([_rule(3)], 4)
    probs = [line.split("--probability ")[1].split()[0] for line in text.splitlines()
             if "--probability" in line]
    assert probs == ["0.3333333333", "0.5000000000"]
    dnat = [line for line in text.splitlines() if "DNAT" in line]
    assert [d.split()[-1] for d in dnat] == ["10.244.1.2:8080", "10.244.1.3:8080",
                                             "10.244.1.4:8080"]
    assert "-A PREROUTING" in text and "-A OUTPUT" in text
    assert text.count("COMMIT") == 2


def test_render_empty_endpoints_drop_or_reject() -> None:
    reject = kubeproxy.render([_rule(0)], 4)
    assert "has no endpoints\" -j REJECT --reject-with icmp-port-unreachable" in reject
    drop = kubeproxy.render([_rule(0, local=True)], 4)
    assert "has no local endpoints\" -j DROP" in drop
    assert "KUBE-SVC" not in drop


def test_render_skips_other_family_and_brackets_ipv6() -> None:
    v6 = kubeproxy.ProxyRule("shop/web", "", ipaddress.ip_address("fd00:96::a"), 80, "UDP",
                             ((ipaddress.ip_address("fd00:244:0:1::3"), 5353),))
    assert "fd00" not in kubeproxy.render([v6], 4)
    text6 = kubeproxy.render([v6], 6)
    assert "--to-destination [fd00:244:0:1::3]:5353" in text6
    assert "-d fd00:96::a/128 -p udp" in text6


def test_chain_names_are_stable_and_distinct() -> None:
    a, seps_a = kubeproxy.chain_names(_rule(2))
    b, seps_b = kubeproxy.chain_names(_rule(2))
    assert (a, seps_a) == (b, seps_b)
    assert len(set(seps_a)) == 2 and all(len(s) <= 28 for s in [a, *seps_a])


# ------------------------------------------------------------------ ground truth


def test_groundtruth_render_and_parse() -> None:
    text = groundtruth.render(3, [("TCP", 8080), ("UDP", 5353), ("TCP", 9090)])
    assert "table inet zmgt_3" in text
    assert "tcp dport { 8080, 9090 } update @req4 { ip saddr }" in text
    assert "udp sport { 5353 } update @resp6 { ip6 daddr }" in text
    listing = {"nftables": [
        {"metainfo": {"version": "1.0.6"}},
        {"set": {"name": "req4", "elem": [
            {"elem": {"val": "10.244.1.2", "counter": {"packets": 4, "bytes": 316}}}]}},
        {"set": {"name": "resp6", "elem": [
            {"elem": {"val": "fd00:244:0:1::2", "counter": {"packets": 1, "bytes": 148}}}]}},
        {"set": {"name": "req6"}},
    ]}
    assert groundtruth.parse(json.dumps(listing)) == {
        (ipaddress.ip_address("10.244.1.2"), "request"): (316, 4),
        (ipaddress.ip_address("fd00:244:0:1::2"), "response"): (148, 1),
    }
    assert groundtruth.render_reset(3).count("flush set inet zmgt_3") == 4


# ------------------------------------------------------------------ snapshot


def test_snapshot_carries_the_lab_version_for_the_hint_model(tmp_path: Path) -> None:
    from agent.hints import KubeVersion, proxy_versions
    from agent.k8s.parse import parse_node_info
    from agent.k8s.version import snapshot_version
    from tools.lab import snapshot

    topo = Topology.from_dict(_with("options", {}))
    assert all("nodeInfo" not in n["status"] for n in snapshot.build(topo)["items"] if n["kind"] == "Node")
    path = snapshot.write(topo, tmp_path / "lab.json", kubernetes_version="1.35")
    nodes = [o for o in json.loads(path.read_text())["items"] if o["kind"] == "Node"]
    assert {parse_node_info(n).proxy_version for n in nodes} == {"v1.35.0"}
    assert snapshot_version(path) == "v1.35.0"
    # every node at the cluster's version: no node is judged apart
    assert proxy_versions([parse_node_info(n) for n in nodes], KubeVersion.parse("1.35")).by_node == {}


def test_snapshot_is_readable_by_the_agent_loader() -> None:
    from agent.k8s.snapshot import load_text
    from tools.lab import snapshot

    topo = Topology.from_dict(_with("options", {"ipv6": True}))

    def hints(svc: Any) -> dict[str, dict[str, list[str]]]:
        return {ep: {"forZones": [topo.zone_of(topo.pod(ep).node)]} for ep in svc.endpoints}

    snap = load_text(json.dumps(snapshot.build(topo, hints)), "lab")
    assert [n["metadata"]["name"] for n in snap.nodes] == ["a1", "a2", "b1"]
    a1 = snap.nodes[0]
    assert a1["metadata"]["labels"]["topology.kubernetes.io/zone"] == "zone-a"
    assert a1["metadata"]["labels"]["topology.kubernetes.io/region"] == "region-1"
    assert a1["status"]["allocatable"]["cpu"] == "4"
    assert {"type": "Ready", "status": "True"}.items() <= a1["status"]["conditions"][0].items()
    assert len(snap.pods) == 6 and len(snap.services) == 1
    web_a1 = next(p for p in snap.pods if p["metadata"]["name"] == "web-a1")
    assert web_a1["status"]["podIPs"] == [{"ip": "10.244.1.3"}, {"ip": "fd00:244:0:1::3"}]
    assert web_a1["spec"]["nodeName"] == "a1"
    svc = snap.services[0]
    assert svc["spec"]["clusterIPs"] == ["10.96.0.10", "fd00:96::a"]
    assert [s["addressType"] for s in snap.endpointslices] == ["IPv4", "IPv6"]
    v4 = snap.endpointslices[0]
    assert v4["metadata"]["labels"]["kubernetes.io/service-name"] == "web"
    assert [e["addresses"] for e in v4["endpoints"]] == [["10.244.1.3"], ["10.244.2.3"],
                                                         ["10.244.3.3"]]
    assert [e["zone"] for e in v4["endpoints"]] == ["zone-a", "zone-a", "zone-b"]
    assert v4["endpoints"][2]["hints"] == {"forZones": [{"name": "zone-b"}]}
    assert {(p["name"], p["port"], p["protocol"]) for p in v4["ports"]} == {
        ("http", 8080, "TCP"), ("dns", 5353, "UDP")}


def test_snapshot_without_hints_has_none() -> None:
    from tools.lab import snapshot

    data = snapshot.build(Topology.from_yaml(DEFAULT_TOPOLOGY))
    slices = [i for i in data["items"] if i["kind"] == "EndpointSlice"]
    assert len(slices) == 1 and all("hints" not in e for e in slices[0]["endpoints"])


# ------------------------------------------------------------------ NodePort Services


def _node_port(ports: list[Any]) -> dict[str, Any]:
    data = _with("services.0.type", "NodePort")
    data["services"][0]["ports"] = ports
    return data


def test_node_port_service_round_trips_and_reaches_the_snapshot() -> None:
    from tools.lab import snapshot

    topo = Topology.from_dict(_node_port([{"name": "http", "port": 80, "targetPort": "http", "nodePort": 30080},
                                          {"name": "dns", "port": 53, "targetPort": "dns", "protocol": "UDP"}]))
    web = topo.service("shop/web")
    assert (web.type, [p.node_port for p in web.ports]) == ("NodePort", [30080, None])
    assert Topology.from_dict(topo.to_dict()).services == topo.services
    (spec,) = [o["spec"] for o in snapshot.build(topo)["items"] if o["kind"] == "Service"]
    assert (spec["type"], spec["externalTrafficPolicy"]) == ("NodePort", "Cluster")
    assert [p.get("nodePort") for p in spec["ports"]] == [30080, None]
    # a ClusterIP Service stays as it was: no type key written, no externalTrafficPolicy
    plain = Topology.from_yaml(DEFAULT_TOPOLOGY)
    assert "type" not in plain.to_dict()["services"][0]
    (spec,) = [o["spec"] for o in snapshot.build(plain)["items"] if o["kind"] == "Service"]
    assert spec["type"] == "ClusterIP" and "externalTrafficPolicy" not in spec


@pytest.mark.parametrize(("port", "problem"), [(8080, "30000-32767"), (True, "30000-32767"),
                                               (32768, "30000-32767")])
def test_node_port_out_of_range(port: Any, problem: str) -> None:
    with pytest.raises(InputError) as info:
        Topology.from_dict(_node_port([{"port": 80, "targetPort": "http", "nodePort": port}]))
    assert (info.value.obj, info.value.field) == ("Service shop/web", "ports[0].nodePort")
    assert problem in info.value.problem


def test_node_port_used_twice() -> None:
    data = _node_port([{"port": 80, "targetPort": "http", "nodePort": 30080}])
    other = copy.deepcopy(data["services"][0])
    other["name"] = "web2"
    data["services"].append(other)
    with pytest.raises(InputError) as info:
        Topology.from_dict(data)
    assert (info.value.obj, info.value.field) == ("Service shop/web2", "ports[0].nodePort")
    assert "already used by Service shop/web" in info.value.problem


def test_node_port_in_the_emulated_mode_needs_a_number() -> None:
    from tools.lab import Lab

    lab = Lab(Topology.from_dict(_node_port([{"port": 80, "targetPort": "http"}])))
    with pytest.raises(InputError) as info:
        lab.node_port("shop/web")
    assert info.value.field == "ports.nodePort"
    lab = Lab(Topology.from_yaml(DEFAULT_TOPOLOGY))
    with pytest.raises(InputError, match="not a NodePort Service"):
        lab.node_port("shop/web")
    assert lab.outside_address == ipaddress.IPv4Address("192.168.100.253")
    assert lab.outside_netns == f"{lab.prefix}-outside"


def test_outside_flow_needs_the_outside_peer() -> None:
    from tools.lab import Lab
    from tools.lab.flows import OUTSIDE

    lab = Lab(Topology.from_yaml(DEFAULT_TOPOLOGY), prefix="zzunit9")
    with pytest.raises(InputError) as info:
        lab.start_flow(OUTSIDE, "192.168.100.1", 30080)
    assert (info.value.obj, info.value.field) == ("flow", "client")
    assert "build_outside" in info.value.problem


# ------------------------------------------------------------------ every path


def test_paths_resolve_and_round_trip() -> None:
    """Headless Services, LoadBalancer/externalTrafficPolicy, hostPort and outside peers
    resolve, and survive to_dict (the state file) unchanged."""
    data = copy.deepcopy(BASE)
    data["options"] = {"ipv6": True}
    data["nodes"][2]["ignoreHints"] = True
    data["pods"] += [{"name": "peer-a1", "namespace": "shop", "node": "a1", "app": "peer", "ports": [7000]},
                     {"name": "cache-a1", "namespace": "shop", "node": "a1", "app": "cache",
                      "ports": [{"port": 6379, "hostPort": 16379}]}]
    data["services"] += [{"name": "peer", "namespace": "shop", "clusterIP": "None", "selector": {"app": "peer"},
                          "ports": [{"port": 7000}]},
                         {"name": "lb", "namespace": "shop", "type": "LoadBalancer",
                          "externalTrafficPolicy": "Local", "selector": {"app": "web"},
                          "ports": [{"port": 80, "targetPort": 8080, "nodePort": 30080}]}]
    data["outside"] = [{"name": "lb-a", "kind": "load-balancer", "zone": "zone-a", "type": "aws-alb"},
                       {"name": "db", "kind": "database", "zone": "zone-b", "ports": [5432]},
                       {"name": "net", "kind": "external"}]
    topo = Topology.from_dict(data)
    peer = topo.service("shop/peer")
    assert peer.headless and peer.cluster_ip is None and peer.cluster_ip6 is None
    lb = topo.service("shop/lb")
    assert (lb.node_ports, lb.external_traffic_policy) == (True, "Local")
    assert topo.pod("cache-a1").ports[0].host_port == 16379
    b1 = topo.node("b1")
    assert b1.ignore_hints
    assert [(o.name, o.client_kind, str(o.ip)) for o in topo.outside] == [
        ("lb-a", "load-balancer", "192.168.100.252"), ("db", "cidr", "192.168.100.251"),
        ("net", "external", "192.168.100.250")]
    assert topo.peer("outside/db").ports[0].port == 5432 and topo.peer("db").zone == "zone-b"
    again = Topology.from_dict(json.loads(json.dumps(topo.to_dict())))
    assert again.services == topo.services and again.outside == topo.outside
    assert again.nodes == topo.nodes and again.pods == topo.pods


def test_render_node_ports_cluster_masquerades_local_keeps_the_client() -> None:
    """externalTrafficPolicy Cluster: KUBE-EXT marks for masquerade and uses the Service's
    KUBE-SVC (this node's ClusterIP selection); Local: KUBE-SVL of the node's own endpoints,
    no mark; no local endpoint: DROP. KUBE-NODEPORTS is the last rule of KUBE-SERVICES."""
    cluster = kubeproxy.ProxyRule("shop/web", "http", ipaddress.ip_address("10.96.0.10"), 80, "TCP",
                                  _rule(2).endpoints, node_port=30080)
    local = kubeproxy.ProxyRule("shop/api", "", ipaddress.ip_address("10.96.0.11"), 80, "TCP",
                                _rule(2).endpoints, node_port=30081, external_local=True,
                                local_endpoints=_rule(1).endpoints)
    none = kubeproxy.ProxyRule("shop/db", "", ipaddress.ip_address("10.96.0.12"), 80, "TCP",
                               _rule(1).endpoints, node_port=30082, external_local=True)
    text = kubeproxy.render([cluster, local, none], 4)
    lines = text.splitlines()
    nat = lines[:lines.index("COMMIT")]
    services = [ln for ln in nat if ln.startswith("-A KUBE-SERVICES")]
    assert services[-1].endswith("-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS")
    ext_web = next(ln.split()[-1] for ln in lines if "--dport 30080" in ln)
    svc_web = kubeproxy.chain_names(cluster)[0]
    assert [ln for ln in lines if ln.startswith(f"-A {ext_web}")][-2:] == [
        f'-A {ext_web} -m comment --comment "masquerade traffic for shop/web:http external destinations" '
        "-j KUBE-MARK-MASQ", f"-A {ext_web} -j {svc_web}"]
    ext_api = next(ln.split()[-1] for ln in lines if "--dport 30081" in ln)
    [to_svl] = [ln for ln in lines if ln.startswith(f"-A {ext_api}")]
    svl = to_svl.split()[-1]
    assert svl.startswith("KUBE-SVL-") and "MASQ" not in to_svl
    assert [ln for ln in lines if ln.startswith(f"-A {svl}")] == [
        f'-A {svl} -m comment --comment "shop/api -> 10.244.1.2:8080" -j '
        + kubeproxy.chain_names(local)[1][0]]
    assert '--dport 30082 -m comment --comment "shop/db has no local endpoints" -j DROP' in text
    assert "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN" in text
    assert "MASQUERADE" in text
    assert "local endpoints keep" not in text
    # a bypass node (Cilium's kube-proxy replacement): marked connections to its own pods'
    # veths are not masqueraded, the rest are; the RETURN comes after the mark is cleared
    kpr = kubeproxy.render([cluster], 4, local_pods="zmp+").splitlines()
    post = [ln for ln in kpr if ln.startswith("-A KUBE-POSTROUTING")]
    assert post[1:] == ["-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
                        '-A KUBE-POSTROUTING -o zmp+ -m comment --comment "local endpoints keep the '
                        'client\'s address" -j RETURN',
                        '-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring '
                        'SNAT" -j MASQUERADE']


def test_hostport_render() -> None:
    from tools.lab import hostport
    text = hostport.render([hostport.HostPort("TCP", 16379, ipaddress.ip_address("10.244.1.5"), 6379),
                            hostport.HostPort("TCP", 16379, ipaddress.ip_address("fd00:244:0:1::5"), 6379)])
    assert text.startswith(f"table inet {hostport.TABLE} {{}}\ndelete table inet {hostport.TABLE}\n")
    assert text.count("meta nfproto ipv4 fib daddr type local tcp dport 16379 dnat ip to 10.244.1.5:6379") == 2
    assert text.count("dnat ip6 to [fd00:244:0:1::5]:6379") == 2
    assert "hook prerouting" in text and "hook output" in text
