"""agent.hints at 1.36 and 1.37: removed gates, kube-proxy's duplicate ip:port rule, address keys.

Upstream sources: ``pkg/features/kube_features.go`` (PR #136112 removed TopologyAwareHints and
ServiceTrafficDistribution in 1.36), ``k8s.io/component-base/featuregate unsafeSetFromMap``
(error wording), ``pkg/proxy/endpointslicecache.go addEndpoints`` (1.31-1.35
``!exists || isLocal``; 1.36+ ``!exists || !terminating``, PR #135593), ``pkg/proxy/endpoint.go``
(keys from ``ParseIPSloppy``).
"""

from __future__ import annotations

from typing import Any

import pytest

from agent import hints
from agent.errors import InputError
from agent.hints.proxy import normalise_ip
from tests.fixtures import k8s as k
from tests.fixtures.topologies import own_zone_endpoints as own_zone
from tests.fixtures.topologies import three_zone_nodes as zones3


def diag(nodes: list[dict[str, Any]], svc: dict[str, Any], slices: list[dict[str, Any]],
         version: str, gates: dict[str, bool] | None = None) -> hints.ServiceDiagnosis:
    (d,) = hints.evaluate_cluster(nodes, [svc], slices, version=version, feature_gates=gates, strict=True)
    return d


def test_range_and_default_cover_1_37() -> None:
    assert hints.MAX_MINOR == 37 and hints.DEFAULT_VERSION == "1.37"
    assert str(hints.KubeVersion.parse("v1.37.2")) == "1.37"
    with pytest.raises(InputError, match=r"supported: 1.27 to 1.37"):
        hints.KubeVersion.parse("1.38")


@pytest.mark.parametrize("version", ["1.36", "1.37"])
@pytest.mark.parametrize("gate", ["TopologyAwareHints", "ServiceTrafficDistribution"])
@pytest.mark.parametrize("value", [True, False])
def test_removed_gates_are_unrecognized(version: str, gate: str, value: bool) -> None:
    with pytest.raises(InputError, match=f"unrecognized feature gate: {gate}"):
        hints.KubeVersion.parse(version, {gate: value})


def test_removed_gates_read_as_on_and_others_as_off() -> None:
    kv = hints.KubeVersion.parse("1.36")
    assert kv.gates == {"PreferSameTrafficDistribution": True}
    assert kv.gate("TopologyAwareHints") and kv.gate("ServiceTrafficDistribution")
    assert not kv.gate("NoSuchGate")
    # before 1.30 ServiceTrafficDistribution did not exist yet: off, not "removed"
    assert not hints.KubeVersion.parse("1.29").gate("ServiceTrafficDistribution")
    # 1.35 still has them, and setting a locked one against its value is refused
    assert hints.KubeVersion.parse("1.35", {"TopologyAwareHints": True}).gate("TopologyAwareHints")
    with pytest.raises(InputError, match="cannot set feature gate TopologyAwareHints to false, "
                                         "feature is locked to true"):
        hints.KubeVersion.parse("1.35", {"TopologyAwareHints": False})


@pytest.mark.parametrize("version", ["1.35", "1.36", "1.37"])
def test_prefer_same_locked_wording(version: str) -> None:
    with pytest.raises(InputError, match="cannot set feature gate PreferSameTrafficDistribution to false, "
                                         "feature is locked to true"):
        hints.KubeVersion.parse(version, {"PreferSameTrafficDistribution": False})


@pytest.mark.parametrize("version", ["1.35", "1.36", "1.37"])
def test_auto_and_traffic_distribution_still_write_hints(version: str) -> None:
    """The topology cache always exists from 1.36 (endpointslice_controller.go NewController)."""
    slices = [k.endpointslice("s", "web", own_zone({"a": 2, "b": 2, "c": 2}))]
    d = diag(zones3(), k.service(auto=True), slices, version)
    assert d.mechanism == "topology-mode-annotation" and d.controller.hints_enabled
    assert d.reason == "none"
    d = diag(zones3(), k.service(traffic_distribution="PreferSameZone"),
             [k.endpointslice("s", "web", own_zone({"a": 1, "b": 1, "c": 1}, hinted=False))], version)
    assert d.mechanism == "trafficDistribution"
    assert not any(w.code == "traffic-distribution-not-accepted" for w in d.warnings)


def _ghost(order: str) -> list[dict[str, Any]]:
    """Issue kubernetes#135266 shrunk: a Terminating pod's IP reused by a running pod on another node."""
    ghost = k.endpointslice("s-old", "web",
                            [k.endpoint("10.0.0.1", "a", "n-a", ready=False, serving=True, terminating=True)])
    ghost["endpoints"][0]["conditions"]["serving"] = False
    live = k.endpointslice("s-new", "web", [k.endpoint("10.0.0.1", "b", "n-b")])
    return [ghost, live] if order == "ghost-first" else [live, ghost]


@pytest.mark.parametrize("order", ["ghost-first", "live-first"])
@pytest.mark.parametrize("version", ["1.36", "1.37"])
def test_1_36_keeps_the_non_terminating_copy_on_every_node(order: str, version: str) -> None:
    d = diag(zones3(), k.service(), _ghost(order), version)
    for n in ("n-a", "n-b", "n-c"):
        assert d.proxy[n].cluster_endpoints == ("10.0.0.1:8080",) and d.proxy[n].internal_traffic == "cluster"


@pytest.mark.parametrize("version", ["1.31", "1.35"])
def test_1_35_first_copy_wins_except_on_the_node_of_a_later_copy(version: str) -> None:
    d = diag(zones3(), k.service(), _ghost("ghost-first"), version)
    # n-a and n-c keep the first (terminating, not serving) copy: nothing usable -> REJECT
    for n in ("n-a", "n-c"):
        assert d.proxy[n].internal_traffic == "REJECT" and d.proxy[n].cluster_endpoints == ()
    # n-b's kube-proxy lets its local copy replace the first one
    assert d.proxy["n-b"].cluster_endpoints == ("10.0.0.1:8080",)
    # live copy first: the later ghost copy is local to n-a, so only n-a loses the endpoint
    d = diag(zones3(), k.service(), _ghost("live-first"), version)
    assert d.proxy["n-a"].internal_traffic == "REJECT"
    assert d.proxy["n-b"].cluster_endpoints == d.proxy["n-c"].cluster_endpoints == ("10.0.0.1:8080",)


def test_1_35_local_copy_carries_its_hints() -> None:
    """A later local copy brings its own zone hints: n-b sees hints, the others do not."""
    first = k.endpointslice("s1", "web", [k.endpoint("10.0.0.1", "a", "n-a"),
                                          k.endpoint("10.0.0.2", "b", "n-b", for_zones=["b"])])
    later = k.endpointslice("s2", "web", [k.endpoint("10.0.0.1", "a", "n-b", for_zones=["b"])])
    d = diag(zones3(), k.service(), [first, later], "1.35")
    assert d.proxy["n-b"].topology_mode == "PreferSameZone"
    assert d.proxy["n-b"].cluster_endpoints == ("10.0.0.1:8080", "10.0.0.2:8080")
    assert d.proxy["n-c"].topology_mode == "" and d.proxy["n-a"].topology_mode == ""
    d = diag(zones3(), k.service(), [first, later], "1.36")  # later non-terminating copy wins
    assert all(d.proxy[n].topology_mode == "PreferSameZone" for n in ("n-b",))
    assert d.proxy["n-c"].cluster_endpoints == ("10.0.0.1:8080", "10.0.0.2:8080")


def test_1_36_two_terminating_copies_first_wins() -> None:
    a = k.endpoint("10.0.0.1", "a", "n-a", ready=False, serving=True, terminating=True)
    b = k.endpoint("10.0.0.1", "b", "n-b", ready=False, serving=True, terminating=True)
    b["conditions"]["serving"] = False
    d = diag(zones3(), k.service(), [k.endpointslice("s", "web", [a, b])], "1.36")
    assert d.proxy["n-c"].cluster_endpoints == ("10.0.0.1:8080",)  # the serving-terminating fallback
    d = diag(zones3(), k.service(), [k.endpointslice("s", "web", [b, a])], "1.36")
    assert d.proxy["n-c"].internal_traffic == "REJECT"


@pytest.mark.parametrize(("raw", "key"), [
    ("10.0.0.1", "10.0.0.1"), ("010.000.000.001", "10.0.0.1"), ("fd00::01", "fd00::1"),
    ("FD00:0:0:0:0:0:0:1", "fd00::1"), ("::ffff:10.0.0.1", "10.0.0.1"), ("not-an-ip", "not-an-ip"),
    ("1.2.3.256", "1.2.3.256")])
def test_normalise_ip_like_parse_ip_sloppy(raw: str, key: str) -> None:
    assert normalise_ip(raw) == key


def test_ipv6_spellings_collide_like_upstream() -> None:
    s1 = k.endpointslice("s1", "web", [k.endpoint("fd00::01", "a", "n-a")], address_type="IPv6")
    s2 = k.endpointslice("s2", "web", [k.endpoint("fd00::1", "b", "n-b")], address_type="IPv6")
    d = diag(zones3(), k.service(families=("IPv6",)), [s1, s2], "1.37")
    assert d.proxy["n-c"].cluster_endpoints == ("[fd00::1]:8080",)


@pytest.mark.parametrize("version", ["1.31", "1.32"])
def test_proxy_before_1_33_reads_zone_hints_only_with_topology_aware_hints(version: str) -> None:
    """Shrunk from the differential test (tests/unit/hints/test_oracle_diff.py), seed 5, 1.31.

    ``pkg/proxy/endpointslicecache.go addEndpoints`` <= 1.32 copies ``hints.forZones`` only when
    the TopologyAwareHints gate is on; with ServiceTrafficDistribution on and TopologyAwareHints
    off, ``canUseTopology`` sees no hints and every node uses all endpoints.
    """
    nodes = [k.node("n0", "za"), k.node("n1", "zb")]
    slices = [k.endpointslice("s0", "web", [k.endpoint("10.1.0.1", "za", "n0", for_zones=["za"])]),
              k.endpointslice("s1", "web", [k.endpoint("10.1.0.2", "zb", "n1", for_zones=["zb"])])]
    d = diag(nodes, k.service(traffic_distribution="PreferClose"), slices, version, {"TopologyAwareHints": False})
    assert d.proxy["n1"].cluster_endpoints == ("10.1.0.1:8080", "10.1.0.2:8080")
    assert d.proxy["n1"].topology_mode == ""
    d = diag(nodes, k.service(traffic_distribution="PreferClose"), slices, version)
    assert d.proxy["n1"].cluster_endpoints == ("10.1.0.2:8080",)
