"""HintModel.localities(): the per-Service locality record and its change time.

Locality is owned by the hint model (stamped at refresh time) and read by the exporter;
these are the checks that attribution's locality tests made before locality left it.
"""

from __future__ import annotations

import pytest

from agent.hints import HintModel
from agent.k8s.cache import ClusterMetadata
from agent.k8s.snapshot import Snapshot
from agent.records import ServiceRef
from tests.fixtures.topologies import two_zone_cluster

T0 = 1_764_470_000.0
WEB, DB = ServiceRef("shop", "web"), ServiceRef("shop", "db")


def loaded() -> ClusterMetadata:
    c = two_zone_cluster()
    cache = ClusterMetadata()
    cache.load_snapshot(Snapshot(nodes=c["nodes"], services=c["services"],
                                 endpointslices=c["endpointslices"], pods=c["pods"]))
    return cache


def test_locality_last_change_moves_only_on_change() -> None:
    cache = loaded()
    h = HintModel(cache)
    h.refresh(None, at=T0)
    loc = h.localities()[WEB]
    assert (loc.mode, loc.reason, loc.last_change) == ("PreferClose", "none", T0)
    assert dict(loc.in_effect) == {"zone-a": True, "zone-b": True}
    # re-evaluated, nothing changed: the change time stays
    h.refresh(None, at=T0 + 10)
    assert h.localities()[WEB].last_change == T0
    # web's slice loses a hint: locality off, the change is stamped with this refresh
    sl = two_zone_cluster(hinted=False)["endpointslices"][0]
    sl["endpoints"][0]["hints"] = {"forZones": [{"name": "zone-a"}]}
    cache.apply("endpointslices", "MODIFIED", sl)
    h.refresh(cache.take_dirty(), at=T0 + 20)
    loc = h.localities()[WEB]
    assert (loc.reason, loc.last_change) == ("partial-hints", T0 + 20)
    assert dict(loc.in_effect) == {"zone-a": False, "zone-b": False}
    assert h.localities()[DB].last_change == T0  # not re-evaluated, not changed
    # Service deleted: its record (and so its gauges) goes away
    cache.apply("services", "DELETED", two_zone_cluster()["services"][1])
    h.refresh(cache.take_dirty(), at=T0 + 30)
    assert DB not in h.localities()
    assert WEB in h.localities()


def test_localities_are_read_only_and_first_seen_is_the_first_refresh() -> None:
    cache = loaded()
    h = HintModel(cache)
    assert dict(h.localities()) == {}
    h.refresh(None, at=T0 + 10)
    locs = h.localities()
    assert {r: v.last_change for r, v in locs.items()} == {WEB: T0 + 10, DB: T0 + 10}
    with pytest.raises(TypeError):
        locs[WEB] = locs[DB]  # type: ignore[index]


def test_a_failing_refresh_keeps_the_previous_localities() -> None:
    cache = loaded()
    h = HintModel(cache)
    h.refresh(None, at=T0)
    before = dict(h.localities())

    def broken() -> None:
        raise RuntimeError("model rebuilding")

    cache.model_inputs = broken  # type: ignore[assignment,method-assign]
    with pytest.raises(RuntimeError):
        h.refresh(None, at=T0 + 10)
    assert dict(h.localities()) == before
