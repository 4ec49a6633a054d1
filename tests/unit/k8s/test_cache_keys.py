"""Attacks on the metadata cache's object keys (bad input).

Objects without ``metadata.namespace`` (legal in a hand-written snapshot: the API server
fills in ``default``) and a Node that carries a namespace field used to be filed under one
key by the parsers and looked up under another: a list or a snapshot load deleted the pod
or Service it had just added (its bytes then went to ``unknown``/``no_pod_for_ip`` once the
grace expired), a DELETED event without namespace left the pod live forever, and a relist
dropped such a Node.
"""

from __future__ import annotations

import copy
import ipaddress
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.k8s import snapshot as snapshot_mod
from agent.k8s.cache import ClusterMetadata, MetadataSettings
from agent.records import PeerKind
from tests.fixtures import k8s
from tests.fixtures.fakes import Clock

ip = ipaddress.ip_address


def _no_ns(obj: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"].pop("namespace", None)
    return out


def _cluster(drop_namespace: bool) -> list[dict[str, Any]]:
    strip = _no_ns if drop_namespace else (lambda o: o)
    return [
        k8s.node("n1", "zone-a", internal="192.168.0.1", pod_cidrs=["10.0.1.0/24"], region="region-1", noise=True),
        strip(k8s.pod("web-1", "10.0.1.5", "n1", namespace="default", noise=True)),
        strip(k8s.service("web", "default", cluster_ip="10.96.0.10",
                          ports=[{"name": "http", "port": 80, "targetPort": 8080}], selector={}, noise=True)),
        strip(k8s.endpointslice("web-abc", "web",
                                [k8s.endpoint("10.0.1.5", "zone-a", "n1", target="x",
                                              target_namespace="y")],
                                namespace="default", ports=[{"name": "http", "port": 8080, "protocol": "TCP"}],
                                noise=True)),
    ]


def _state(cache: ClusterMetadata) -> tuple[Any, ...]:
    peer = cache.resolve(ip("10.0.1.5"))
    return (cache.counts()["pods"], cache.counts()["services"], cache.counts()["endpointslices"],
            peer.kind, peer.namespace, peer.name,
            cache.service_address(ip("10.96.0.10"), 80, 6),
            cache.endpoint_services(ip("10.0.1.5"), 8080, 6),
            cache.local_endpoints("n1"))


def test_snapshot_objects_without_namespace_are_kept_as_default(tmp_path: Path) -> None:
    clock = Clock()
    with_ns, without = (ClusterMetadata(MetadataSettings(grace_seconds=60), clock=clock) for _ in range(2))
    with_ns.load_snapshot(snapshot_mod.load_text(_json({"kind": "List", "items": _cluster(False)})))
    without.load_snapshot(snapshot_mod.load_text(_json({"kind": "List", "items": _cluster(True)})))
    clock.t += 120  # past the grace: a pod the load deleted again would be gone now
    want = _state(with_ns)
    assert want[:3] == (1, 1, 1) and want[3] is PeerKind.POD and want[6] is not None
    assert want[7][0].port == 80  # the slice maps to the Service's port, not "not cached" 0
    assert _state(without) == want


def test_diff_reload_of_an_unchanged_namespaceless_snapshot_changes_nothing() -> None:
    cache = ClusterMetadata()
    snap = snapshot_mod.load_text(_json({"kind": "List", "items": _cluster(True)}))
    cache.load_snapshot(snap)
    cache.take_dirty()
    released = cache.released()
    cache.load_snapshot(snap, diff=True)
    assert cache.released() == released  # no pod gave up its address
    assert cache.take_dirty().services == frozenset()
    assert cache.counts()["pods"] == 1


def test_deleted_event_without_namespace_deletes_the_pod() -> None:
    clock = Clock()
    cache = ClusterMetadata(MetadataSettings(grace_seconds=60), clock=clock)
    cache.apply("nodes", "ADDED", k8s.node("n1", "zone-a", pod_cidrs=["10.0.1.0/24"], region="region-1", noise=True))
    p = _no_ns(k8s.pod("web-1", "10.0.1.5", "n1", namespace="default", noise=True))
    cache.apply("pods", "ADDED", p)
    cache.apply("pods", "DELETED", p)
    assert cache.counts()["pods"] == 0
    clock.t += 120
    assert cache.resolve(ip("10.0.1.5")).kind is PeerKind.UNKNOWN


def test_a_node_with_a_namespace_field_survives_a_relist() -> None:
    n = k8s.node("n1", "zone-a", internal="192.168.0.1", pod_cidrs=["10.0.1.0/24"], region="region-1", noise=True)
    n["metadata"]["namespace"] = "kube-system"  # meaningless on a Node, still a Node
    cache = ClusterMetadata()
    cache.replace("nodes", [n])
    assert cache.node("n1") is not None
    assert cache.resolve(ip("192.168.0.1")).kind is PeerKind.NODE
    cache.apply("nodes", "DELETED", n)
    assert cache.node("n1") is None


NAMESPACES = st.sampled_from([None, "", "default", "shop"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(NAMESPACES, st.sampled_from(["a", "b", "c"]), st.integers(1, 250)),
                max_size=8))
def test_every_listed_pod_is_in_the_cache_after_a_list(pods: list[tuple[str | None, str, int]]) -> None:
    """Property: after ``replace`` the cache holds exactly the distinct pods listed (a
    missing or empty namespace is ``default``), each resolvable at its address."""
    objs, want = [], {}
    for i, (ns, name, last) in enumerate(pods):
        p = k8s.pod(name, f"10.0.{i}.{last}", "n1", namespace=ns or "default", noise=True)
        if ns is None:
            p["metadata"].pop("namespace")
        elif ns == "":
            p["metadata"]["namespace"] = ""
        objs.append(p)
        want[(ns or "default", name)] = f"10.0.{i}.{last}"  # a later duplicate wins
    cache = ClusterMetadata()
    cache.replace("nodes", [k8s.node("n1", "zone-a", pod_cidrs=["10.0.0.0/16"], region="region-1", noise=True)])
    cache.replace("pods", objs)
    assert cache.counts()["pods"] == len(want)
    for (ns, name), addr in want.items():
        peer = cache.resolve(ip(addr))
        assert (peer.kind, peer.namespace, peer.name) == (PeerKind.POD, ns, name)
    cache.replace("pods", objs)  # a relist of the same objects keeps them all
    assert cache.counts()["pods"] == len(want)


def _json(doc: Any) -> str:
    import json
    return json.dumps(doc)


# --------------------------------------------------------------------------- IP reuse

def _reuse_cache() -> tuple[ClusterMetadata, Clock]:
    clock = Clock()
    cache = ClusterMetadata(MetadataSettings(grace_seconds=60), clock=clock)
    cache.apply("nodes", "ADDED", k8s.node("n1", "zone-a", pod_cidrs=["10.0.1.0/24"], region="region-1", noise=True))
    return cache, clock


def _terminating(p: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(p)
    out["metadata"]["deletionTimestamp"] = "2026-11-30T06:00:00Z"
    out["status"]["containerStatuses"] = [{"name": "c", "state": {"terminated": {"exitCode": 0}}}]
    return out


def test_late_update_of_the_previous_holder_does_not_take_the_address_back() -> None:
    """Rolling update with fast IP reuse: web-new gets 10.0.1.5 while the terminating
    web-old's status (phase still Running) still lists it, and a status update of web-old
    arrives after web-new's ADDED. That update used to take the address back: web-new was
    buried, web-old's tenure then covered every time (its ``since`` was kept), and once
    web-old was deleted and the grace ran out web-new's bytes went to unknown
    (``no_pod_for_ip``) until web-new's next update, which may be hours away."""
    cache, clock = _reuse_cache()
    old = k8s.pod("web-old", "10.0.1.5", "n1", noise=True)
    new = k8s.pod("web-new", "10.0.1.5", "n1", noise=True)
    cache.apply("pods", "ADDED", old)
    clock.t = 1010.0
    cache.apply("pods", "ADDED", new)
    clock.t = 1020.0
    cache.apply("pods", "MODIFIED", _terminating(old))
    clock.t = 1030.0
    assert [cache.resolve(ip("10.0.1.5"), at).name for at in (1005.0, 1015.0, 1025.0, None)] == [
        "web-old", "web-new", "web-new", "web-new"]
    clock.t = 1040.0
    cache.apply("pods", "DELETED", _terminating(old))
    assert cache.resolve(ip("10.0.1.5"), 1042.0).name == "web-new"
    clock.t = 1200.0  # far past the grace
    peer = cache.resolve(ip("10.0.1.5"))
    assert (peer.kind, peer.name) == (PeerKind.POD, "web-new")


@pytest.mark.parametrize("order", ["old-first", "new-first"])
def test_relist_with_both_claimants_keeps_the_newer_one(order: str) -> None:
    """A relist that still carries the terminating holder next to the new one (list order
    is by name, not by time) keeps the pod that claimed the address last."""
    cache, clock = _reuse_cache()
    old = k8s.pod("web-old", "10.0.1.5", "n1", noise=True)
    new = k8s.pod("web-new", "10.0.1.5", "n1", noise=True)
    cache.apply("pods", "ADDED", old)
    clock.t = 1010.0
    cache.apply("pods", "ADDED", new)
    clock.t = 1020.0
    objs = [_terminating(old), new] if order == "old-first" else [new, _terminating(old)]
    cache.replace("pods", objs)
    clock.t = 1200.0
    assert cache.resolve(ip("10.0.1.5")).name == "web-new"


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(["old", "new"]), min_size=1, max_size=6), st.booleans())
def test_once_the_new_pod_claimed_the_address_updates_never_move_it_back(
        updates: list[str], delete_old: bool) -> None:
    """Property: after web-new's ADDED, any sequence of MODIFIED events of either pod (and
    web-old's deletion) leaves the address with web-new, now and after the grace."""
    cache, clock = _reuse_cache()
    old = k8s.pod("web-old", "10.0.1.5", "n1", noise=True)
    new = k8s.pod("web-new", "10.0.1.5", "n1", noise=True)
    cache.apply("pods", "ADDED", old)
    clock.t += 10
    cache.apply("pods", "ADDED", new)
    for who in updates:
        clock.t += 1
        cache.apply("pods", "MODIFIED", _terminating(old) if who == "old" else new)
        assert cache.resolve(ip("10.0.1.5")).name == "web-new"
    if delete_old:
        clock.t += 1
        cache.apply("pods", "DELETED", _terminating(old))
    clock.t += 120
    assert cache.resolve(ip("10.0.1.5")).name == "web-new"
