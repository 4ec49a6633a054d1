"""Structural property of the exported series (bench/bench_series.py, BENCHMARKS.md).

Per node, the number of Prometheus series depends on Services, zones and workloads, never
on pods or connections: the same Services and zones with 10x the pods and 10x the
connections export exactly the same series count per family; more Services export more.
No label value is ever a pod name or an IP address. The one exception (pods that are their
own workload: owner-less pods, Jobs) stays bounded under churn only through series expiry
(``--series-retention``).
"""

from __future__ import annotations

from agent.attribution.join import HINT_IGNORED_NODES
from bench.bench_series import FAMILIES, churn, count_series, measure

HI = "zonemeter_service_hint_ignored_bytes"


def test_series_do_not_grow_with_pods_or_connections() -> None:
    small = measure(pods=400, conns=1, services=10, zones=3)
    big = measure(pods=4000, conns=10, services=10, zones=3)
    assert big["deltas"] > 10 * small["deltas"]  # the traffic really grew
    assert big["local_pods"] >= small["local_pods"]
    # hint-ignored series carry the client's node: they grow with nodes (4000 pods are 40
    # nodes here), up to HINT_IGNORED_NODES per Service and client zone, never with pods
    same = [f for f in FAMILIES if f != HI]
    assert {f: big["series"][f] for f in same} == {f: small["series"][f] for f in same}
    assert big["series_total"] - big["series"][HI] == small["series_total"] - small["series"][HI]
    assert {f: small["series"][f] for f in same} == {f: small["bound"][f] for f in same}
    assert small["series"][HI] == small["bound"][HI] == 5 * 4  # 4 client nodes in other zones
    assert big["series"][HI] == big["bound"][HI] == 5 * (HINT_IGNORED_NODES + 2)
    assert small["leaks"] == [] and big["leaks"] == []


def test_series_grow_with_services_and_zones() -> None:
    base = measure(pods=400, conns=1, services=10, zones=3)
    more_services = measure(pods=800, conns=1, services=20, zones=3)
    more_zones = measure(pods=500, conns=1, services=10, zones=4)
    for fam in FAMILIES:
        if fam != HI:
            assert more_services["series"][fam] == 2 * base["series"][fam], fam
    for m in (base, more_services, more_zones):
        assert 0 < m["series"][HI] <= m["bound"][HI]
    assert more_zones["series"]["zonemeter_service_bytes"] > base["series"]["zonemeter_service_bytes"]
    assert more_zones["series"]["zonemeter_service_locality_in_effect"] == 10 * 4
    same = [f for f in FAMILIES if f != HI]
    assert {f: more_zones["series"][f] for f in same} == {f: more_zones["bound"][f] for f in same}


def test_leak_detector_flags_pod_names_and_addresses() -> None:
    text = ('# HELP x y\nzonemeter_workload_bytes_total{workload="pod-7",namespace="ns"} 1.0\n'
            'zonemeter_service_bytes_total{service="s",client_zone="10.0.0.1"} 2.0\n'
            'zonemeter_build_info{version="0.1.0"} 1.0\n')
    counts, leaks = count_series(text, {"pod-7"})
    assert counts == {"zonemeter_workload_bytes": 1, "zonemeter_service_bytes": 1,
                      "zonemeter_build_info": 1}
    assert sorted(leaks) == ["10.0.0.1", "pod-7"]


def test_ownerless_pods_are_their_own_workloads() -> None:
    # the known exception: a pod without ownerReferences is its own workload (kind Pod),
    # so its name becomes a workload label value and those series grow with such pods
    few = measure(pods=400, conns=1, services=10, zones=3, bare=True)
    many = measure(pods=4000, conns=1, services=10, zones=3, bare=True)
    assert few["leaks"] and many["leaks"]
    assert many["local_pods"] > few["local_pods"]
    assert many["series"]["zonemeter_workload_bytes"] > few["series"]["zonemeter_workload_bytes"]
    assert many["series"]["zonemeter_service_bytes"] == few["series"]["zonemeter_service_bytes"]


def test_churn_keeps_series_bounded_only_with_expiry() -> None:
    # with expiry: pods (each its own workload, each behind its own short-lived Service)
    # replaced one by one; bench/bench_series.py --churn, small
    kept = churn(120, retention=600.0, lifetime=60.0, interval=10.0, kind="job", samples=4)
    grown = churn(120, retention=0.0, lifetime=60.0, interval=10.0, kind="job", samples=4)
    assert kept["balanced"] and grown["balanced"]
    last_kept, last_grown = kept["rows"][-1], grown["rows"][-1]
    # without expiry: two service series (request, response) and one workload series per pod
    assert (last_grown["service_series"], last_grown["workload_series"]) == (240, 120)
    # with it: the pods of the last 600-720 s, however many came before
    assert [r["workload_series"] for r in kept["rows"][1:]] == [11, 11, 11]
    assert last_kept["service_series"] == 2 * last_kept["workload_series"]
    assert last_kept["exported_samples"] < last_grown["exported_samples"] / 4
    e = last_kept["expired"]
    assert e["zonemeter_workload_bytes_total"] == 120 - 11
    assert e["zonemeter_service_bytes_total"] == 2 * (120 - 11)
