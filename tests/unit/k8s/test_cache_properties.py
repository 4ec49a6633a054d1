"""Property tests (hypothesis): odd object shapes and CIDR files never raise tracebacks.

Objects are built from the real field names with arbitrary JSON at every level, so the
shapes are the ones a buggy controller or a hand-edited dump could produce: missing keys,
lists where objects belong, strings where numbers belong, FQDN addresses, duplicates.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.errors import InputError
from agent.k8s.cache import RESOURCES, ClusterMetadata
from agent.k8s.cidrs import parse_zone_cidrs
from agent.k8s.parse import NodeInfo, ServiceInfo, Slice
from tests.fixtures import k8s
from tests.fixtures.fakes import Clock


def _records_only(c: ClusterMetadata) -> None:
    """What the cache hands the hint model is parsed records or the error parsing raised."""
    nodes, services, slices = c.model_inputs()
    assert all(isinstance(n, (NodeInfo, type(None))) and isinstance(e, (InputError, type(None)))
               for n, e in nodes)
    assert all(isinstance(s, (ServiceInfo, type(None))) and isinstance(e, (InputError, type(None)))
               and (s is None) == (e is not None) for s, e in services)
    assert all(isinstance(ns, str) and isinstance(name, str) and isinstance(sl, (Slice, type(None)))
               and (sl is None) == (e is not None) for ns, name, sl, e in slices)


FIELDS = ["metadata", "name", "namespace", "labels", "kubernetes.io/service-name",
          "topology.kubernetes.io/zone", "pod-template-hash", "ownerReferences", "kind",
          "controller", "spec", "status", "ports", "port", "protocol", "targetPort",
          "endpoints", "addresses", "conditions", "ready", "serving", "nodeName", "zone",
          "hints", "forZones", "podIP", "podIPs", "ip", "hostNetwork", "clusterIP",
          "clusterIPs", "type", "address", "podCIDR", "podCIDRs", "phase", "addressType"]
LEAVES = (st.none() | st.booleans() | st.integers(-2, 70000) | st.text(max_size=4)
          | st.sampled_from(["10.0.1.5", "fd00::5", "10.0.1.0/24", "TCP", "UDP", "SCTP", "ICMP",
                             "n1", "web", "shop", "ReplicaSet", "Running", "Failed", "InternalIP",
                             "db.example.com", "None", "not-an-ip"]))
JSON = st.recursive(LEAVES, lambda kids: st.lists(kids, max_size=3)
                    | st.dictionaries(st.sampled_from(FIELDS), kids, max_size=5), max_leaves=25)
NAMED = st.fixed_dictionaries(
    {"metadata": st.fixed_dictionaries({"name": st.sampled_from(["a", "b"]),
                                        "namespace": st.sampled_from(["shop", "x"])},
                                       optional={"labels": JSON})},
    optional={"spec": JSON, "status": JSON, "ports": JSON, "endpoints": JSON})
OBJECTS = st.one_of(NAMED, JSON)
ADDRS = [ipaddress.ip_address(a) for a in ("10.0.1.5", "fd00::5", "192.0.2.1")]


def _use_everything(c: ClusterMetadata) -> None:
    for a in ADDRS:
        c.resolve(a)
        c.resolve(a, at=0.0)
        for port in (0, 80, 8080):
            for proto in (6, 17, 132):
                c.endpoint_services(a, port, proto)
                c.service_address(a, port, proto)
    c.local_endpoints("n1")
    _records_only(c)
    c.take_dirty()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(RESOURCES), st.sampled_from(["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]),
                          OBJECTS), max_size=8))
def test_any_event_sequence_is_absorbed(events: list[tuple[str, str, Any]]) -> None:
    c = ClusterMetadata()
    for resource, etype, obj in events:
        c.apply(resource, etype, obj)
    _use_everything(c)
    # and a relist to nothing leaves nothing behind in the indexes
    for resource in RESOURCES:
        c.replace(resource, [])
    for a in ADDRS:
        for port in range(0, 70000, 997):
            assert c.endpoint_services(a, port, 6) == ()
        assert c.service_address(a, 80, 6) is None
    assert c.local_endpoints("n1") == frozenset()
    assert c.counts()["pods"] == c.counts()["services"] == c.counts()["endpointslices"] == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([
    k8s.endpoint("10.0.1.5", "zone-a", "n1", target="x", target_namespace="y"),
    k8s.endpoint(["10.0.1.5", "10.0.1.5"], "zone-a", "n1", target="x", target_namespace="y"),
    k8s.endpoint("db.example.com", "zone-a", "n1", target="x", target_namespace="y"),
    k8s.endpoint("fd00::5", "zone-a", "n1", conditions={}, target="x", target_namespace="y"),
    k8s.endpoint("10.0.1.6", "zone-a", "n1", ready=False, serving=False, target="x", target_namespace="y"),
    {"addresses": []}, {"conditions": {}}, {}]), max_size=6),
    st.lists(st.sampled_from([{"port": 8080}, {"port": 8080, "protocol": "UDP"}, {"name": "x"},
                              {"port": 0}, {"port": 99999}, {"port": "8080"}, {"port": 53, "protocol": "SCTP"}]),
             max_size=4))
def test_odd_endpointslices_index_only_valid_entries(eps: list[dict[str, Any]], ports: list[dict[str, Any]]) -> None:
    clock = Clock()
    c = ClusterMetadata(clock=clock)
    c.apply("services", "ADDED",
            k8s.service("web", "shop", cluster_ip="10.96.0.1", ports=[{"port": 80, "targetPort": 8080}], selector={},
                        noise=True))
    c.apply("endpointslices", "ADDED", k8s.endpointslice("web-1", "web", eps, ports=ports, noise=True))
    assert c.bad_objects()["endpointslices"] == 0
    valid_ports = {(p["port"], {"UDP": 17, "SCTP": 132}.get(p.get("protocol", "TCP"), 6)) for p in ports
                   if isinstance(p.get("port"), int) and 0 < p["port"] <= 65535}
    has_ip = any("10.0.1.5" in e.get("addresses", []) for e in eps)
    for port, proto in {(8080, 6), (8080, 17), (53, 132), (99999 & 0xFFFF, 6)}:
        got = c.endpoint_services(ipaddress.ip_address("10.0.1.5"), port, proto)
        assert bool(got) == (has_ip and (port, proto) in valid_ports)
    listed = c.endpoint_services(ipaddress.ip_address("10.0.1.5"), 8080, 6)
    c.apply("endpointslices", "DELETED",
            k8s.endpointslice("web-1", "web", None, omit=("ports", "endpoints"), noise=True))
    # kept for the grace after its slice went, then gone
    assert c.endpoint_services(ipaddress.ip_address("10.0.1.5"), 8080, 6) == listed
    clock.t += c.settings.grace_seconds + 1
    assert c.endpoint_services(ipaddress.ip_address("10.0.1.5"), 8080, 6) == ()


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.text(max_size=60),
    st.lists(st.tuples(st.sampled_from(["10.0.0.0/8", "fd00::/8", "10.0.0.1/8", "x", "", "10.0.0.0/33"]),
                       st.sampled_from(["a", "", " ", "b,c"]), st.sampled_from(["", "r", "r,s"])),
             max_size=4).map(lambda rows: "\n".join(",".join(r) for r in rows)),
    st.lists(st.fixed_dictionaries({}, optional={"cidr": LEAVES, "zone": LEAVES, "region": LEAVES,
                                                 "other": LEAVES}), max_size=3).map(json.dumps),
))
def test_cidr_files_parse_or_fail_with_one_line(text: str) -> None:
    try:
        rows = parse_zone_cidrs(text, "z")
    except InputError as err:
        assert str(err).startswith("z") and "\n" not in str(err)
    else:
        assert all(r.zone.strip() == r.zone and r.zone for r in rows)
