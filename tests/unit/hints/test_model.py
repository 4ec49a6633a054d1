"""agent.hints.model: HintModel (HintView) over a real ClusterMetadata and evaluate_cluster; locality."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from agent.errors import InputError
from agent.hints import HintModel, merge_locality, merge_views
from agent.k8s import ClusterMetadata
from agent.k8s.snapshot import Snapshot
from agent.records import Locality, ProxyView, ServiceRef
from tests.fixtures.topologies import two_zone_cluster


def loaded(hinted: bool = True) -> ClusterMetadata:
    c = two_zone_cluster(hinted)
    cache = ClusterMetadata()
    cache.load_snapshot(Snapshot(nodes=c["nodes"], services=c["services"],
                                 endpointslices=c["endpointslices"], pods=c["pods"]))
    return cache


def test_hint_model_full_evaluation() -> None:
    cache = loaded()
    h = HintModel(cache)
    assert h.refresh(cache.take_dirty(), at=100.0) == 2
    assert list(h.services()) == [("shop", "db"), ("shop", "web")]
    assert h.locality("shop", "web") == Locality("PreferClose", "none", {"zone-a": True, "zone-b": True}, 100.0,
                                                 {"zone-a": 0.0, "zone-b": 0.0})
    # db's one endpoint is in zone-b: every call from zone-a crosses, none from zone-b
    assert h.locality("shop", "db") == Locality("none", "not-requested", {"zone-a": False, "zone-b": False},
                                                100.0, {"zone-a": 1.0, "zone-b": 0.0})
    assert h.proxy_view("shop", "web", "na") == ProxyView("PreferSameZone", frozenset({"10.244.1.20"}), "cluster")
    assert h.proxy_view("shop", "web", "nb") == ProxyView("PreferSameZone", frozenset({"10.244.2.20"}), "cluster")
    assert h.proxy_view("shop", "web", "no-such-node") is None
    assert h.locality("shop", "nope") is None and h.proxy_view("shop", "nope", "na") is None


def test_hint_model_reevaluates_only_dirty_services() -> None:
    cache = loaded()
    h = HintModel(cache)
    h.refresh(None, at=100.0)
    cache.take_dirty()
    db_before = h.locality("shop", "db")
    sl = two_zone_cluster(hinted=False)["endpointslices"][0]  # web's slice, one hint removed
    sl["endpoints"][0]["hints"] = {"forZones": [{"name": "zone-a"}]}
    cache.apply("endpointslices", "MODIFIED", sl)
    dirty = cache.take_dirty()
    assert dirty.services == {("shop", "web")} and not dirty.all
    assert h.refresh(dirty, at=200.0) == 1
    # kube-proxy ignores all hints when one endpoint lacks them
    assert h.locality("shop", "web") == Locality("PreferClose", "partial-hints",
                                                 {"zone-a": False, "zone-b": False}, 200.0,
                                                 {"zone-a": 0.5, "zone-b": 0.5})
    assert h.proxy_view("shop", "web", "na") == ProxyView(
        "", frozenset({"10.244.1.20", "10.244.2.20"}), "cluster")
    assert h.locality("shop", "db") is db_before  # not re-evaluated


def test_node_change_reevaluates_everything_and_deletes_drop_services() -> None:
    cache = loaded()
    h = HintModel(cache)
    h.refresh(None)
    cache.take_dirty()
    db_before = h.locality("shop", "db")
    nb = two_zone_cluster()["nodes"][1]
    nb["metadata"]["labels"]["topology.kubernetes.io/zone"] = "zone-c"
    cache.apply("nodes", "MODIFIED", nb)
    dirty = cache.take_dirty()
    assert dirty.all
    assert h.refresh(dirty) == 2
    assert h.locality("shop", "db") is not db_before
    assert set(h.locality("shop", "db").in_effect) == {"zone-a", "zone-c"}  # type: ignore[union-attr]
    cache.apply("services", "DELETED", two_zone_cluster()["services"][1])
    assert h.refresh(cache.take_dirty()) == 1
    assert list(h.services()) == [("shop", "web")]


def test_bad_version_is_input_error() -> None:
    with pytest.raises(InputError, match="kubernetes-version"):
        HintModel(ClusterMetadata(), version="1.12")


def test_merge_dual_stack() -> None:
    v4 = SimpleNamespace(mode="PreferClose", reason="none", locality_in_effect={"a": True, "b": True},
                         expected_cross_zone={"a": 0.0, "b": 0.25})
    v6 = SimpleNamespace(mode="PreferClose", reason="partial-hints", locality_in_effect={"a": True, "b": False},
                         expected_cross_zone={"a": None, "b": 0.5})
    # a zone's expected share is the larger family's; a family without a figure adds none
    assert merge_locality([v4, v6], 5.0) == Locality(  # type: ignore[list-item]
        "PreferClose", "partial-hints", {"a": True, "b": False}, 5.0, {"a": 0.0, "b": 0.5})
    assert merge_locality([], 6.0) == Locality("none", "none", {}, 6.0)
    pv4 = ProxyView("PreferSameZone", frozenset({"10.0.0.1"}), "cluster")
    pv6 = ProxyView("", frozenset({"fd00::1", "fd00::2"}), "cluster")
    assert merge_views([pv4, None, pv6]) == ProxyView(
        "PreferSameZone", frozenset({"10.0.0.1", "fd00::1", "fd00::2"}), "cluster")
    assert merge_views([None]) is None
    assert merge_views([pv6]) is pv6


def test_expected_share_change_alone_keeps_last_change() -> None:
    cache = loaded()
    h = HintModel(cache)
    h.refresh(None, at=100.0)
    cache.take_dirty()
    before = h.locality("shop", "db")
    # a second db endpoint in zone-a: still not-requested everywhere, but zone-a's calls now
    # cross only half the time
    sl = next(s for s in two_zone_cluster()["endpointslices"]
              if s["metadata"]["labels"]["kubernetes.io/service-name"] == "db")
    extra = dict(sl["endpoints"][0], addresses=["10.244.1.99"], zone="zone-a", nodeName="na")
    sl["endpoints"].append(extra)
    cache.apply("endpointslices", "MODIFIED", sl)
    h.refresh(cache.take_dirty(), at=200.0)
    after = h.locality("shop", "db")
    assert before is not None and after is not None
    assert (after.reason, dict(after.in_effect)) == (before.reason, dict(before.in_effect))
    assert dict(after.expected_cross_zone) == {"zone-a": 0.5, "zone-b": 0.5}
    assert after.last_change == 100.0


def test_several_dirty_services_in_one_refresh() -> None:
    cache = loaded()
    h = HintModel(cache)
    h.refresh(None)
    cache.take_dirty()
    c = two_zone_cluster()
    web = c["services"][0]
    web["spec"].pop("trafficDistribution")  # locality no longer requested
    cache.apply("services", "MODIFIED", web)
    cache.apply("services", "DELETED", c["services"][1])
    dirty = cache.take_dirty()
    assert dirty.services == {("shop", "web"), ("shop", "db")}
    assert h.refresh(dirty) == 2
    assert list(h.services()) == [("shop", "web")]
    # the slices still carry the old hints and kube-proxy (1.33+, topologyModeFromHints)
    # keeps using them until the controller strips them: the model says so, re-evaluated
    loc = h.locality("shop", "web")
    assert loc is not None and loc.mode == "none" and dict(loc.in_effect) == {"zone-a": True, "zone-b": True}
    assert "stale-hints" in [w.code for d in h.diagnoses("shop", "web") for w in d.warnings]


def test_locality_last_change_moves_only_when_the_state_changes() -> None:
    cache = loaded()
    h = HintModel(cache)
    h.refresh(cache.take_dirty(), at=100.0)
    web = h.locality("shop", "web")
    assert web is not None and web.last_change == 100.0
    # a relist re-evaluates every Service; nothing changed, so nothing is re-stamped
    cache.replace("services", two_zone_cluster()["services"])
    dirty = cache.take_dirty()
    assert dirty.all
    assert h.refresh(dirty, at=150.0) == 2
    assert h.locality("shop", "web") is web
    assert h.localities()[ServiceRef("shop", "db")].last_change == 100.0
    # web loses a hint: its state changes at 200, db's does not
    sl = two_zone_cluster(hinted=False)["endpointslices"][0]
    sl["endpoints"][0]["hints"] = {"forZones": [{"name": "zone-a"}]}
    cache.apply("endpointslices", "MODIFIED", sl)
    h.refresh(cache.take_dirty(), at=200.0)
    got = h.locality("shop", "web")
    assert got is not None and (got.reason, got.last_change) == ("partial-hints", 200.0)
    assert h.localities()[ServiceRef("shop", "db")].last_change == 100.0


def test_localities_is_read_only_and_keeps_its_refresh_state() -> None:
    cache = loaded()
    h = HintModel(cache)
    h.refresh(None, at=100.0)
    before = h.localities()
    assert set(before) == {ServiceRef("shop", "db"), ServiceRef("shop", "web")}
    assert before[ServiceRef("shop", "web")] == h.locality("shop", "web")
    with pytest.raises(TypeError):
        before[ServiceRef("shop", "x")] = before[ServiceRef("shop", "web")]  # type: ignore[index]
    cache.apply("services", "DELETED", two_zone_cluster()["services"][1])  # db
    h.refresh(cache.take_dirty(), at=200.0)
    assert set(h.localities()) == {ServiceRef("shop", "web")}
    assert set(before) == {ServiceRef("shop", "db"), ServiceRef("shop", "web")}  # unchanged


def test_refresh_stamps_wall_time_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent.hints.model.time.time", lambda: 1234.5)
    cache = loaded()
    h = HintModel(cache)
    h.refresh()
    assert {loc.last_change for loc in h.localities().values()} == {1234.5}
