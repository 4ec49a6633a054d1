"""DemoCluster.plan_locality / set_locality at model level (no root: nothing is built).

A three-zone lab with one client and one ``api`` endpoint per node; ``api`` starts without
locality settings. The hints, per-node selections and the order in which set_locality
programs proxies and rewrites the snapshot are checked against what Kubernetes does
(EndpointSlice controller hints per KEP-4444/KEP-3015, kube-proxy CategorizeEndpoints).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from agent.errors import InputError
from agent.k8s.snapshot import load
from tests.fixtures.lab_hints import lab_hints
from tools.demo.cluster import DemoCluster
from tools.demo.topology import THREE_ZONE_API_TOPOLOGY, parse_demo

ALL = ("api-1", "api-2", "api-3")
OWN = {"n1": ("api-1",), "n2": ("api-2",), "n3": ("api-3",)}


@pytest.fixture()
def cluster(tmp_path: Path) -> DemoCluster:
    c = DemoCluster(parse_demo(THREE_ZONE_API_TOPOLOGY), tmp_path, hints=lab_hints("model"), prefix="zmflip",
                    state_dir=tmp_path / "state")
    c.write_snapshot()
    return c


def _hints(snapshot: dict[str, Any]) -> dict[str, Any]:
    return {ep["targetRef"]["name"]: ep.get("hints")
            for o in snapshot["items"] if o["kind"] == "EndpointSlice" for ep in o["endpoints"]}


def test_plan_prefer_same_zone(cluster: DemoCluster) -> None:
    assert _hints(cluster.snapshot) == {p: None for p in ALL}
    plan = cluster.plan_locality("app/api", traffic_distribution="PreferSameZone")
    assert (plan.before.mode, plan.before.reason) == ("none", "not-requested")
    assert dict(plan.before.selection) == {n: ALL for n in OWN}
    assert not any(plan.before.filtering.values())
    # the controller writes forZones = own zone on every endpoint (trafficdist, KEP-4444)
    assert _hints(plan.snapshot) == {"api-1": {"forZones": [{"name": "za"}]},
                                     "api-2": {"forZones": [{"name": "zb"}]},
                                     "api-3": {"forZones": [{"name": "zc"}]}}
    assert (plan.after.mode, plan.after.reason) == ("PreferSameZone", "none")
    assert dict(plan.after.locality_in_effect) == {"za": True, "zb": True, "zc": True}
    assert dict(plan.after.selection) == OWN
    assert all(plan.after.filtering.values())
    # enabling: proxies narrow before the agents hear of it
    assert dict(plan.transition) == OWN
    # planning changes nothing yet
    assert cluster.models["app/api"].mode == "none"
    assert cluster.topology.service("app/api").traffic_distribution is None
    assert _hints(json.loads(cluster.snapshot_path.read_text())) == {p: None for p in ALL}


def test_plan_withdraw_keeps_narrow_selection_until_agents_know(cluster: DemoCluster) -> None:
    cluster.lab.set_node_endpoints = lambda node, services: None  # type: ignore[method-assign]
    cluster.set_locality("app/api", traffic_distribution="PreferSameZone", settle_seconds=0)
    plan = cluster.plan_locality("app/api", traffic_distribution=None)
    assert plan.after.mode == "none" and dict(plan.after.selection) == {n: ALL for n in OWN}
    assert _hints(plan.snapshot) == {p: None for p in ALL}
    assert dict(plan.transition) == OWN  # old (filtering) selection while agents learn


def test_plan_topology_mode_annotation(cluster: DemoCluster) -> None:
    # Auto with 3 equal zones and 3 endpoints: one per zone (topologycache allocation)
    plan = cluster.plan_locality("api", annotations={"service.kubernetes.io/topology-mode": "Auto"})
    assert plan.after.mode == "topology-mode"
    assert dict(plan.after.selection) == OWN
    assert plan.topology.service("app/api").annotations == {
        "service.kubernetes.io/topology-mode": "Auto"}
    # removing the annotation again restores the plain Service
    cluster.lab.set_node_endpoints = lambda node, services: None  # type: ignore[method-assign]
    cluster.set_locality("api", annotations={"service.kubernetes.io/topology-mode": "Auto"},
                         settle_seconds=0)
    back = cluster.plan_locality("api", annotations={"service.kubernetes.io/topology-mode": None})
    assert back.topology.service("app/api").annotations == {}
    assert back.after.mode == "none"


def test_set_locality_order(cluster: DemoCluster) -> None:
    calls: list[tuple[str, dict[str, tuple[str, ...]], dict[str, Any]]] = []

    def record(node: str, services: Mapping[str, Any]) -> None:
        hints = _hints(json.loads(cluster.snapshot_path.read_text()))
        calls.append((node, {k: tuple(v) for k, v in services.items()}, hints))

    cluster.lab.set_node_endpoints = record  # type: ignore[method-assign]
    change = cluster.set_locality("app/api", traffic_distribution="PreferSameZone",
                                  settle_seconds=0.05)
    assert len(calls) == 6  # transition, then final, for each of the three nodes
    for node, services, hints in calls[:3]:
        assert services == {"app/api": OWN[node]}
        assert hints == {p: None for p in ALL}  # the file still has the old Service
    for node, services, hints in calls[3:]:
        assert services == {"app/api": OWN[node]}
        assert hints["api-1"] == {"forZones": [{"name": "za"}]}
    assert change.narrowed_at is not None and change.changed_at is not None
    assert change.programmed_at is not None
    assert change.narrowed_at + 0.05 <= change.changed_at <= change.programmed_at - 0.05
    # the file the agents read is the model's input: the Service and hints changed there
    snap = load(cluster.snapshot_path)
    (svc,) = snap.services
    assert svc["spec"]["trafficDistribution"] == "PreferSameZone"
    assert cluster.models["app/api"].mode == "PreferSameZone"
    assert cluster.topology.service("app/api").traffic_distribution == "PreferSameZone"


def test_bad_input(cluster: DemoCluster) -> None:
    with pytest.raises(InputError, match="no such Service"):
        cluster.plan_locality("app/nope", traffic_distribution="PreferSameZone")
    with pytest.raises(InputError, match="trafficDistribution"):
        cluster.plan_locality("app/api", traffic_distribution="Nearby")


def test_ignore_hints_node_keeps_every_endpoint(tmp_path: Path) -> None:
    text = THREE_ZONE_API_TOPOLOGY.replace("{name: n3, zone: zc, cpu: 2}",
                                 "{name: n3, zone: zc, cpu: 2, ignoreHints: true}")
    c = DemoCluster(parse_demo(text), tmp_path, hints=lab_hints("model"), prefix="zmflip", state_dir=tmp_path / "state")
    c.write_snapshot()
    programmed: dict[str, list[Any]] = {}
    c.lab.set_node_endpoints = (  # type: ignore[method-assign]
        lambda node, services: programmed.setdefault(node, []).append(services["app/api"]))
    change = c.set_locality("app/api", traffic_distribution="PreferSameZone", settle_seconds=0)
    # the model still answers for n3 (kube-proxy there would filter) ...
    assert change.after.selection["n3"] == ("api-3",) and change.after.filtering["n3"]
    # ... but its data plane is never narrowed: None = every ready endpoint (Lab default)
    assert "n3" not in change.transition
    assert programmed["n3"] == [None, None]
    assert [tuple(x) for x in programmed["n1"]] == [("api-1",), ("api-1",)]
