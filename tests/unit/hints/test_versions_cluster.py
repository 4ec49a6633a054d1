"""The versions the cluster reports: /version and version.json text, each node's kube-proxy.

Covers agent.hints.versions (covered_version, choose_version, parse_proxy_flag),
agent.k8s.parse.node_proxy_version, agent.hints.diagnosis.proxy_versions and the per-node
kube-proxy judgement (a node at another version is decided by that version's rules), and
HintModel's refresh and model_info when a Node's version changes.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from agent import hints
from agent.errors import InputError
from agent.hints.proxy import ProxyIndex
from agent.k8s import ClusterMetadata
from agent.k8s.parse import parse_node_info, parse_service_info, parse_slice
from agent.k8s.snapshot import Snapshot
from tests.fixtures import k8s
from tests.fixtures.topologies import own_zone_endpoints, three_zone_nodes


def with_version(node: dict[str, Any], kubelet: str | None, proxy: str | None = None) -> dict[str, Any]:
    info: dict[str, str] = {}
    if kubelet is not None:
        info["kubeletVersion"] = kubelet
    if proxy is not None:
        info["kubeProxyVersion"] = proxy
    node["status"]["nodeInfo"] = info
    return node


# ------------------------------------------------------------------------------ text


@pytest.mark.parametrize(("text", "want"), [
    ("v1.33.5-eks-abc", "1.33"), ("v1.37.2", "1.37"), ("v1.30.2-gke.1587003", "1.30"),
    ("v1.27.0+k3s1", "1.27"), ("1.31", "1.31"), (" v1.35.0 ", "1.35")])
def test_covered_version_reads_git_versions(text: str, want: str) -> None:
    assert hints.covered_version(text, "the API server") == (want, None)


def test_covered_version_clamps_and_says_so() -> None:
    got, note = hints.covered_version("v1.38.0", "the API server")
    assert got == "1.37"
    assert note == ("the API server reports Kubernetes v1.38.0, newer than the hint model covers "
                    "(1.27 to 1.37): modelling it as 1.37")
    got, note = hints.covered_version("v1.20.1", "Node n1")
    assert got == "1.27" and note is not None and "older than" in note and "as 1.27" in note
    assert hints.covered_version("v2.0.0", "x")[0] == "1.37"
    got, note = hints.covered_version("banana", "Node n1")
    assert got is None and note is not None and "'banana'" in note


def test_choose_version_flag_wins_then_cluster_then_default() -> None:
    assert hints.choose_version("1.31", "v1.37.0", "cluster", "the API server") == ("1.31", "flag", None)
    assert hints.choose_version(None, "v1.33.5-eks-abc", "cluster", "s") == ("1.33", "cluster", None)
    assert hints.choose_version(None, None, "cluster", "s") == (hints.DEFAULT_VERSION, "default", None)
    v, src, note = hints.choose_version(None, "v1.38.1", "snapshot", "the snapshot's version.json")
    assert (v, src) == ("1.37", "snapshot") and note is not None and "v1.38.1" in note
    v, src, note = hints.choose_version(None, "dev", "cluster", "the API server")
    assert (v, src) == (hints.DEFAULT_VERSION, "default") and note is not None and "newest" in note
    with pytest.raises(InputError, match="unsupported Kubernetes version"):
        hints.choose_version("1.38", None, "cluster", "s")  # a flag is refused, not clamped


def test_parse_proxy_flag() -> None:
    assert hints.parse_proxy_flag("auto") is None and hints.parse_proxy_flag(None) is None
    assert hints.parse_proxy_flag("v1.31.2") == "1.31"
    with pytest.raises(InputError, match="--kube-proxy-version: expected auto or a version"):
        hints.parse_proxy_flag("1.99")


def test_node_proxy_version_prefers_kube_proxy_then_kubelet() -> None:
    n = k8s.node("n1", "a", cpu="4")
    assert parse_node_info(n).proxy_version is None
    assert parse_node_info(with_version(n, "v1.31.0")).proxy_version == "v1.31.0"
    # newer kubelets leave the deprecated kubeProxyVersion empty (KEP-4004)
    assert parse_node_info(with_version(n, "v1.31.0", "")).proxy_version == "v1.31.0"
    assert parse_node_info(with_version(n, "v1.31.0", "v1.29.3")).proxy_version == "v1.29.3"
    n["status"]["nodeInfo"] = {"kubeletVersion": 131}  # not a string: no version, Node readable
    assert parse_node_info(n).proxy_version is None and parse_node_info(n).cpu_milli == 4000


# ------------------------------------------------------------------------------ per node


def test_proxy_versions_groups_only_nodes_that_differ() -> None:
    kv = hints.KubeVersion.parse("1.37")
    infos = [parse_node_info(with_version(k8s.node("a1", "a", cpu="4"), "v1.37.1")),
             parse_node_info(with_version(k8s.node("a2", "a", cpu="4"), "v1.31.0")),
             parse_node_info(with_version(k8s.node("b1", "b", cpu="4"), "v1.38.0")),
             parse_node_info(with_version(k8s.node("b2", "b", cpu="4"), "v1.20.0")),
             parse_node_info(k8s.node("c1", "c", cpu="4"))]
    pv = hints.proxy_versions(infos, kv)
    assert pv.base is kv and not pv.override
    assert {n: str(v) for n, v in pv.by_node.items()} == {"a2": "1.31", "b2": "1.27"}
    assert pv.by_zone == {"a": {31: ("a2",)}, "b": {27: ("b2",)}}
    assert [t for t, _ in pv.notes] == ["v1.38.0", "v1.20.0"]  # one note per distinct text
    # the override judges every node as that version and ignores what the Nodes report
    pv = hints.proxy_versions(infos, kv, "1.33")
    assert str(pv.base) == "1.33" and pv.by_node == {} and pv.override
    assert hints.proxy_versions(infos, kv, "1.37").base is kv  # same version: the user's gates


def test_old_kube_proxy_on_one_node_ignores_node_hints() -> None:
    # PreferSameNode (1.37): the controller writes zone and node hints; kube-proxy 1.31 reads
    # zone hints only (topologyModeFromHints and node hints are 1.33+), 1.37 prefers the node
    nodes = [k8s.node("a1", "a", cpu="4"), with_version(k8s.node("a2", "a", cpu="4"), "v1.31.4"),
             k8s.node("b1", "b", cpu="4")]
    eps = [k8s.endpoint("10.0.0.1", "a", "a1", for_zones=["a"], for_nodes=["a1"]),
           k8s.endpoint("10.0.0.2", "a", "a2", for_zones=["a"], for_nodes=["a2"]),
           k8s.endpoint("10.0.0.3", "b", "b1", for_zones=["b"], for_nodes=["b1"])]
    svc = k8s.service(traffic_distribution="PreferSameNode")
    sl = k8s.endpointslice("web-1", "web", eps)
    d = hints.evaluate_cluster(nodes, [svc], [sl], version="1.37", strict=True)[0]
    assert d.proxy["a1"].topology_mode == "PreferSameNode"
    assert d.proxy["a1"].cluster_endpoints == ("10.0.0.1:8080",)
    assert d.proxy["a2"].topology_mode == "PreferSameZone"
    assert d.proxy["a2"].cluster_endpoints == ("10.0.0.1:8080", "10.0.0.2:8080")
    assert d.reason == "none"  # both keep traffic in the zone
    w = next(w for w in d.warnings if w.code == "kube-proxy-version-skew")
    assert "1 node(s) of zone a at 1.31 (a2)" in w.message
    # --kube-proxy-version 1.37 judges a2 as 1.37 too
    d = hints.evaluate_cluster(nodes, [svc], [sl], version="1.37", strict=True, kube_proxy_version="1.37")[0]
    assert d.proxy["a2"].topology_mode == "PreferSameNode"
    assert "kube-proxy-version-skew" not in {w.code for w in d.warnings}
    # --kube-proxy-version 1.31 judges every node as 1.31
    d = hints.evaluate_cluster(nodes, [svc], [sl], version="1.37", strict=True, kube_proxy_version="1.31")[0]
    assert {d.proxy[n].topology_mode for n in ("a1", "a2", "b1")} == {"PreferSameZone"}


def test_feature_gates_apply_to_the_control_plane_version_only() -> None:
    # PreferSameTrafficDistribution=false at 1.34 (not locked there): the 1.34 kube-proxy
    # does not read node hints; a node at 1.33, where the gate defaults off, would not either,
    # but a node at 1.35 (gate locked on) does
    nodes = [k8s.node("a1", "a", cpu="4"), with_version(k8s.node("a2", "a", cpu="4"), "v1.35.0"),
             k8s.node("b1", "b", cpu="4")]
    eps = [k8s.endpoint("10.0.0.1", "a", "a1", for_zones=["a"], for_nodes=["a1"]),
           k8s.endpoint("10.0.0.2", "a", "a2", for_zones=["a"], for_nodes=["a2"]),
           k8s.endpoint("10.0.0.3", "b", "b1", for_zones=["b"], for_nodes=["b1"])]
    d = hints.evaluate_cluster(nodes, [k8s.service(traffic_distribution="PreferClose")],
                               [k8s.endpointslice("web-1", "web", eps)], version="1.34",
                               feature_gates={"PreferSameTrafficDistribution": False}, strict=True)[0]
    assert d.proxy["a1"].topology_mode == "PreferSameZone"
    assert d.proxy["a2"].topology_mode == "PreferSameNode"


@pytest.mark.parametrize("seed", range(6))
def test_grouped_decisions_equal_one_index_per_node(seed: int) -> None:
    """ProxyMap shares decisions per (version, zone); each must equal the decision of a
    ProxyIndex of that node's own version (brute force over every node)."""
    import random

    rnd = random.Random(seed)
    versions = ["v1.37.0", "v1.31.2", "v1.30.0", None, "v1.34.1"]
    nodes = []
    for i in range(14):
        z = "abc"[i % 3]
        n = k8s.node(f"n{i}", z if i != 13 else None, cpu="4")
        nodes.append(with_version(n, rnd.choice(versions)))
    eps = []
    for j in range(6):
        host = f"n{rnd.randrange(14)}"
        z = "abc"[int(host[1:]) % 3]
        eps.append(k8s.endpoint(f"10.0.1.{j + 1}", z, host, for_zones=[z], for_nodes=[host],
                                ready=rnd.random() > 0.2))
    td = rnd.choice(["PreferClose", "PreferSameNode", "PreferSameZone"])
    itp = rnd.choice([None, "Local"])
    svc_obj = k8s.service(traffic_distribution=td, internal_traffic_policy=itp)
    sl = k8s.endpointslice("web-1", "web", eps)
    kv = hints.KubeVersion.parse("1.37")
    d = hints.evaluate_cluster(nodes, [svc_obj], [sl], version="1.37", strict=True)[0]
    svc, slices = parse_service_info(svc_obj), [parse_slice(sl)[2]]
    infos = [parse_node_info(n) for n in nodes]
    pv = hints.proxy_versions(infos, kv)
    for info in infos:
        want = ProxyIndex(svc, slices, pv.of(info.name)).decide(info.name, info.zone or "")
        assert d.proxy[info.name] == want, info.name
    # locality is the conjunction over each client zone's Ready nodes: topology filtering,
    # or node-local (internalTrafficPolicy Local: local, or DROP without a local endpoint)
    zone_of = {e["addresses"][0]: e["zone"] for e in eps}
    for z, on in d.locality_in_effect.items():
        members = [i for i in infos if (i.zone or "unknown") == z]
        assert on == all(d.proxy[i.name].internal_traffic in ("local", "DROP") or (
            d.proxy[i.name].internal_traffic == "cluster" and d.proxy[i.name].topology_mode
            in ("PreferSameZone", "PreferSameNode")) for i in members)
        # the expected share, brute force: per node the share of its selected endpoints in
        # another zone (0 when local; none from a node without a zone label that forwards to
        # other nodes), the mean over the nodes that have one
        per_node = []
        for i in members:
            p = d.proxy[i.name]
            if p.internal_traffic == "local":
                per_node.append(0.0)
            elif p.internal_traffic == "cluster" and p.cluster_endpoints and z != "unknown":
                zs = [zone_of[k.rsplit(":", 1)[0]] for k in p.cluster_endpoints]
                per_node.append(sum(1 for ez in zs if ez != z) / len(zs))
        want_share = sum(per_node) / len(per_node) if per_node else None
        assert d.expected_cross_zone[z] == pytest.approx(want_share), z


# ------------------------------------------------------------------------------ HintModel


def _cache(nodes: list[dict[str, Any]], svc: dict[str, Any], sl: dict[str, Any]) -> ClusterMetadata:
    cache = ClusterMetadata()
    cache.load_snapshot(Snapshot(nodes=nodes, services=[svc], endpointslices=[sl], pods=[]))
    return cache


def test_hint_model_follows_a_node_version_change_and_reports_it() -> None:
    nodes = three_zone_nodes()
    svc = k8s.service(traffic_distribution="PreferClose")
    sl = k8s.endpointslice("web-1", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1}))
    cache = _cache(nodes, svc, sl)
    model = hints.HintModel(cache, "1.37", version_source="cluster")
    model.refresh(cache.take_dirty(), at=1.0)
    assert model.locality("shop", "web").reason == "none"  # type: ignore[union-attr]
    assert model.model_info("n-b") == ("1.37", "1.37", "cluster", "default")
    # n-b's kubelet is downgraded to 1.30: a Node change, every Service re-evaluated
    cache.apply("nodes", "MODIFIED", with_version(three_zone_nodes()[1], "v1.30.4"))
    dirty = cache.take_dirty()
    assert dirty.all
    model.refresh(dirty, at=2.0)
    loc = model.locality("shop", "web")
    assert loc is not None and loc.reason == "kube-proxy-version-skew" and loc.last_change == 2.0
    assert dict(loc.in_effect) == {"a": True, "b": False, "c": True}
    assert model.proxy_view("shop", "web", "n-b").topology_mode == ""  # type: ignore[union-attr]
    assert model.model_info("n-b") == ("1.37", "1.30", "cluster", "node")
    assert model.model_info("n-a") == ("1.37", "1.37", "cluster", "default")
    flag = hints.HintModel(cache, "1.37", kube_proxy_version="1.33", version_source="flag")
    assert flag.model_info("n-b") == ("1.37", "1.33", "flag", "flag")


def test_hint_model_says_an_uncovered_node_version_once(caplog: pytest.LogCaptureFixture) -> None:
    nodes = [with_version(n, "v1.40.0") for n in three_zone_nodes()]
    svc = k8s.service(traffic_distribution="PreferClose")
    sl = k8s.endpointslice("web-1", "web", own_zone_endpoints({"a": 1, "b": 1, "c": 1}))
    cache = _cache(nodes, svc, sl)
    model = hints.HintModel(cache, "1.37")
    with caplog.at_level("WARNING"):
        for at in itertools.count(1):
            model.refresh(None, at=float(at))
            if at == 3:
                break
    said = [r.getMessage() for r in caplog.records if "v1.40.0" in r.getMessage()]
    assert len(said) == 1 and "modelling it as 1.37" in said[0]
    assert model.model_info("n-a") == ("1.37", "1.37", "flag", "node")
