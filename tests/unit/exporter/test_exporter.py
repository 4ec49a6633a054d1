"""agent.exporter: exact exposition text, label escaping, snapshot swap, HTTP endpoints."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import fields

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agent.errors import InputError
from agent.exporter import (
    FAMILIES,
    AttributionTotals,
    ClientPathKey,
    Exporter,
    ExportSnapshot,
    HintIgnoredKey,
    Locality,
    MetricsServer,
    PairRow,
    ServiceBytesKey,
    ServiceRef,
    WorkloadBytesKey,
    make_app,
    make_readiness,
    parse_address,
    start_server,
)
from agent.exporter.families import KEYED_LABELS
from agent.records import CoverageState


def full_snapshot() -> ExportSnapshot:
    return ExportSnapshot(
        totals=AttributionTotals(
        service_bytes={
            ServiceBytesKey("shop", "cart", "80", "zone-a", "zone-b", "cross_zone", "response",
                            "pod", "none"): 5000,
            ServiceBytesKey("shop", "cart", "80", "zone-a", "zone-b", "cross_zone", "request",
                            "pod", "none"): 1200,
            ServiceBytesKey("shop", "cart", "80", "zone-b", "zone-b", "same_zone", "request",
                            "load-balancer", "aws-alb"): 300,
        },
        hint_ignored_bytes={HintIgnoredKey("shop", "cart", "zone-a", "zone-b", "n-a", "pod"): 1200},
        service_entry_bytes={ServiceBytesKey("shop", "cart", "80", "zone-a", "zone-b", "cross_zone", "request",
                                             "load-balancer", "aws-nlb"): 800},
        client_path_bytes={ClientPathKey("shop", "cart", "n-b", "clusterip"): 300},
        workload_bytes={WorkloadBytesKey("shop", "cart", "Deployment", "zone-a", "", "external",
                                          "external", "ingress"): 77},
        unattributed_bytes={"flow_table_full": 9},
        unknown_crossing_bytes={"no_pod_for_ip": 4},
        skipped_bytes={"clusterip_client_copy": 6200},
        diagnostics_bytes={"endpoint_not_in_kernel": 3300},
        series_expired={"zonemeter_workload_bytes_total": 2, "zonemeter_service_bytes_total": 0},
        top_pairs=(PairRow(client="shop/ui-1", server="shop/cart-2", client_zone="zone-a", server_zone="zone-b",
                           crossing="cross_zone", namespace="shop", service="cart", port="80", bytes=6200,
                           client_kind="pod"),
                   PairRow(client="10.0.9.4", server="shop/cart-2", client_zone="zone-b", server_zone="zone-b",
                           crossing="same_zone", namespace="shop", service="cart", port="80", bytes=300,
                           client_kind="load-balancer", lb_type="aws-alb"))),
        locality={ServiceRef("shop", "cart"): Locality("PreferSameZone", "none",
                                                        {"zone-a": True, "zone-b": False}, 1700000000.5,
                                                        {"zone-a": 0.0, "zone-b": 0.5})},
        flow_table_entries=12, flow_table_capacity=65536, attached_interfaces=3,
        collector_duration_seconds=0.25,
        metadata_synced={"pods": True, "nodes": False},
        generated_at=1700000001.0, interval_seconds=10.0,
        coverage=CoverageState(counted_bytes=90000, carried_bytes=120000, unseen_bytes=30000, ratio=0.75,
                               tcp_direction_ratio=0.5),
        hint_model=("1.37", "1.31", "cluster", "node"),
        datapath=("cgroup", "cgroup", "auto"),
    )


EXPECTED = '''\
# HELP zonemeter_service_bytes_total L3 bytes of Service traffic counted at the endpoint's node, by client and server zone, crossing, direction and the client's class (pod, node, load-balancer with its lb_type, cidr, external, unknown).
# TYPE zonemeter_service_bytes_total counter
zonemeter_service_bytes_total{client_kind="pod",client_zone="zone-a",crossing="cross_zone",direction="request",lb_type="none",namespace="shop",port="80",server_zone="zone-b",service="cart"} 1200.0
zonemeter_service_bytes_total{client_kind="pod",client_zone="zone-a",crossing="cross_zone",direction="response",lb_type="none",namespace="shop",port="80",server_zone="zone-b",service="cart"} 5000.0
zonemeter_service_bytes_total{client_kind="load-balancer",client_zone="zone-b",crossing="same_zone",direction="request",lb_type="aws-alb",namespace="shop",port="80",server_zone="zone-b",service="cart"} 300.0
# HELP zonemeter_service_entry_bytes_total L3 bytes of the first hop of a node port (a load balancer or another client off the node to a node port, LoadBalancer IP or externalIP of a Service with externalTrafficPolicy Cluster), counted on the receiving node's uplinks: server_zone is that node's; the endpoint counts the next hop in zonemeter_service_bytes_total.
# TYPE zonemeter_service_entry_bytes_total counter
zonemeter_service_entry_bytes_total{client_kind="load-balancer",client_zone="zone-a",crossing="cross_zone",direction="request",lb_type="aws-nlb",namespace="shop",port="80",server_zone="zone-b",service="cart"} 800.0
# HELP zonemeter_service_hint_ignored_bytes_total L3 bytes from a client zone to an endpoint outside the set kube-proxy selects for that zone while topology hints were in effect, by the client's node and kind (pod or node).
# TYPE zonemeter_service_hint_ignored_bytes_total counter
zonemeter_service_hint_ignored_bytes_total{client_kind="pod",client_node="n-a",client_zone="zone-a",namespace="shop",server_zone="zone-b",service="cart"} 1200.0
# HELP zonemeter_service_client_path_bytes_total L3 bytes this node's pods exchanged with a Service its kube-proxy filters by topology, by path: clusterip (a Service address) or direct (an endpoint outside this node's selection); evidence for why bytes ignored the hints, never billed again.
# TYPE zonemeter_service_client_path_bytes_total counter
zonemeter_service_client_path_bytes_total{client_node="n-b",namespace="shop",path="clusterip",service="cart"} 300.0
# HELP zonemeter_service_locality_in_effect 1 when kube-proxy keeps this Service's ClusterIP traffic from client_zone close: topology hints (same zone or node) or internalTrafficPolicy Local (node-local), else 0.
# TYPE zonemeter_service_locality_in_effect gauge
zonemeter_service_locality_in_effect{client_zone="zone-a",namespace="shop",service="cart"} 1.0
zonemeter_service_locality_in_effect{client_zone="zone-b",namespace="shop",service="cart"} 0.0
# HELP zonemeter_service_expected_cross_zone_ratio Share (0..1) of client_zone's calls to this Service expected to cross zones under today's hints: equal weight per endpoint kube-proxy selects, equal weight per node.
# TYPE zonemeter_service_expected_cross_zone_ratio gauge
zonemeter_service_expected_cross_zone_ratio{client_zone="zone-a",namespace="shop",service="cart"} 0.0
zonemeter_service_expected_cross_zone_ratio{client_zone="zone-b",namespace="shop",service="cart"} 0.5
# HELP zonemeter_service_locality_info Requested locality mode and why locality is not in effect by topology hints (reason none when it is; internal-traffic-policy-local: node-local instead); always 1.
# TYPE zonemeter_service_locality_info gauge
zonemeter_service_locality_info{mode="PreferSameZone",namespace="shop",reason="none",service="cart"} 1.0
# HELP zonemeter_service_locality_last_change_timestamp_seconds When the Service's locality state last changed.
# TYPE zonemeter_service_locality_last_change_timestamp_seconds gauge
zonemeter_service_locality_last_change_timestamp_seconds{namespace="shop",service="cart"} 1.7000000005e+09
# HELP zonemeter_workload_bytes_total L3 bytes of non-Service traffic of a local pod by workload, remote zone and kind, crossing and direction (egress from / ingress to the workload).
# TYPE zonemeter_workload_bytes_total counter
zonemeter_workload_bytes_total{client_zone="zone-a",crossing="external",direction="ingress",namespace="shop",remote_kind="external",remote_zone="unknown",workload="cart",workload_kind="Deployment"} 77.0
# HELP zonemeter_unattributed_bytes_total L3 bytes that could not be attributed, by reason.
# TYPE zonemeter_unattributed_bytes_total counter
zonemeter_unattributed_bytes_total{reason="attribution_error"} 0.0
zonemeter_unattributed_bytes_total{reason="endpoint_without_service"} 0.0
zonemeter_unattributed_bytes_total{reason="entry_without_service"} 0.0
zonemeter_unattributed_bytes_total{reason="flow_table_full"} 9.0
# HELP zonemeter_unknown_crossing_bytes_total L3 bytes of service, entry and workload series whose crossing is unknown, by reason (a subset of those series).
# TYPE zonemeter_unknown_crossing_bytes_total counter
zonemeter_unknown_crossing_bytes_total{reason="cidr_without_zone"} 0.0
zonemeter_unknown_crossing_bytes_total{reason="clusterip_to_host_network_endpoint"} 0.0
zonemeter_unknown_crossing_bytes_total{reason="no_pod_for_ip"} 4.0
zonemeter_unknown_crossing_bytes_total{reason="node_without_zone"} 0.0
# HELP zonemeter_skipped_bytes_total L3 bytes seen but not counted here because another veth counts them (client-side copies), by reason; never billed.
# TYPE zonemeter_skipped_bytes_total counter
zonemeter_skipped_bytes_total{reason="clusterip_client_copy"} 6200.0
zonemeter_skipped_bytes_total{reason="clusterip_mixed_host_network"} 0.0
zonemeter_skipped_bytes_total{reason="endpoint_client_copy"} 0.0
zonemeter_skipped_bytes_total{reason="entry_endpoint_copy"} 0.0
zonemeter_skipped_bytes_total{reason="pod_peer_ingress"} 0.0
# HELP zonemeter_diagnostic_bytes_total L3 bytes already counted in the series above that are worth a look, by diagnostic name (e.g. endpoint_not_in_kernel: the kernel endpoint map lagged the EndpointSlices).
# TYPE zonemeter_diagnostic_bytes_total counter
zonemeter_diagnostic_bytes_total{name="ambiguous_service"} 0.0
zonemeter_diagnostic_bytes_total{name="endpoint_not_in_kernel"} 3300.0
zonemeter_diagnostic_bytes_total{name="flow_table_full_unfiltered"} 0.0
zonemeter_diagnostic_bytes_total{name="hint_check_client_node_unknown"} 0.0
zonemeter_diagnostic_bytes_total{name="hold_full"} 0.0
# HELP zonemeter_series_expired_total Series dropped because their Service or workload no longer exists and they gained no bytes for --series-retention seconds, by the metric (family) they belonged to.
# TYPE zonemeter_series_expired_total counter
zonemeter_series_expired_total{family="zonemeter_service_bytes_total"} 0.0
zonemeter_series_expired_total{family="zonemeter_workload_bytes_total"} 2.0
# HELP zonemeter_checkpoint_discarded_total Checkpoint files the agent could not use and started from zero instead, by reason (unreadable, corrupt, version: another format or kernel layout, node: another node's); absent without --checkpoint-path.
# TYPE zonemeter_checkpoint_discarded_total counter
# HELP zonemeter_flow_table_entries Entries in the kernel flow table at the last drain.
# TYPE zonemeter_flow_table_entries gauge
zonemeter_flow_table_entries 12.0
# HELP zonemeter_flow_table_capacity Maximum entries of the kernel flow table.
# TYPE zonemeter_flow_table_capacity gauge
zonemeter_flow_table_capacity 65536.0
# HELP zonemeter_attached_interfaces Interfaces the datapath is attached to.
# TYPE zonemeter_attached_interfaces gauge
zonemeter_attached_interfaces 3.0
# HELP zonemeter_hook_counted_bytes_total L3 bytes our programs counted that the compared interfaces should have carried: every byte on the veth hook, bytes of peers off the node on the cgroup hook (intervals with interface counters only).
# TYPE zonemeter_hook_counted_bytes_total counter
zonemeter_hook_counted_bytes_total 90000.0
# HELP zonemeter_interface_bytes_total L3 bytes the compared interfaces (the hooked veths; the node's uplinks on the cgroup hook) carried in the same intervals by their own counters (non-IP frames included).
# TYPE zonemeter_interface_bytes_total counter
zonemeter_interface_bytes_total 120000.0
# HELP zonemeter_hook_unseen_bytes_total L3 bytes the compared interfaces carried beyond what our programs counted, summed per interval: a data plane moving packets past the hook, or sockets outside its cgroup.
# TYPE zonemeter_hook_unseen_bytes_total counter
zonemeter_hook_unseen_bytes_total 30000.0
# HELP zonemeter_hook_coverage_ratio Bytes our programs counted over bytes the compared interfaces carried in the last 5 minutes; NaN below 64 KiB carried.
# TYPE zonemeter_hook_coverage_ratio gauge
zonemeter_hook_coverage_ratio 0.75
# HELP zonemeter_hook_tcp_direction_ratio TCP packets our programs counted in the less busy direction (into or out of local pods or sockets) over the busier one in the last 5 minutes; 0 when a data plane moves one direction past the hook; NaN below 1,000 packets.
# TYPE zonemeter_hook_tcp_direction_ratio gauge
zonemeter_hook_tcp_direction_ratio 0.5
# HELP zonemeter_datapath_info Where this agent counts: hook (veth or cgroup), attach (tcx, clsact or cgroup) and the --hook it was given (requested: veth, cgroup or auto); always 1. Every agent of a cluster should show the same hook (alert ZonemeterHookMixed).
# TYPE zonemeter_datapath_info gauge
zonemeter_datapath_info{attach="cgroup",hook="cgroup",requested="auto"} 1.0
# HELP zonemeter_collector_duration_seconds Wall time of the last drain and attribution.
# TYPE zonemeter_collector_duration_seconds gauge
zonemeter_collector_duration_seconds 0.25
# HELP zonemeter_metadata_synced 1 when the resource's Kubernetes metadata is in sync.
# TYPE zonemeter_metadata_synced gauge
zonemeter_metadata_synced{resource="nodes"} 0.0
zonemeter_metadata_synced{resource="pods"} 1.0
# HELP zonemeter_hint_model_info Kubernetes versions the hint model judges with: the control plane's (kubernetes_version, from source cluster, snapshot, flag or default) and this node's kube-proxy's (kube_proxy_version, from kube_proxy_source node, flag or default); always 1.
# TYPE zonemeter_hint_model_info gauge
zonemeter_hint_model_info{kube_proxy_source="node",kube_proxy_version="1.31",kubernetes_version="1.37",source="cluster"} 1.0
# HELP zonemeter_build_info zonemeter build; always 1.
# TYPE zonemeter_build_info gauge
zonemeter_build_info{version="9.9.9"} 1.0
'''


def test_exact_exposition_text() -> None:
    exp = Exporter(version="9.9.9")
    exp.update(full_snapshot())
    assert generate_latest(exp.registry()).decode() == EXPECTED


def test_metric_names_are_exactly_the_contract() -> None:
    exp = Exporter()
    exp.update(full_snapshot())
    names = {f.name: f.type for f in text_string_to_metric_families(generate_latest(exp.registry()).decode())}
    assert names == {
        "zonemeter_service_bytes": "counter",
        "zonemeter_service_entry_bytes": "counter",
        "zonemeter_service_hint_ignored_bytes": "counter",
        "zonemeter_service_client_path_bytes": "counter",
        "zonemeter_service_locality_in_effect": "gauge",
        "zonemeter_service_expected_cross_zone_ratio": "gauge",
        "zonemeter_service_locality_info": "gauge",
        "zonemeter_service_locality_last_change_timestamp_seconds": "gauge",
        "zonemeter_workload_bytes": "counter",
        "zonemeter_unattributed_bytes": "counter",
        "zonemeter_unknown_crossing_bytes": "counter",
        "zonemeter_skipped_bytes": "counter",
        "zonemeter_diagnostic_bytes": "counter",
        "zonemeter_series_expired": "counter",
            "zonemeter_checkpoint_discarded": "counter",
        "zonemeter_hook_counted_bytes": "counter",
        "zonemeter_interface_bytes": "counter",
        "zonemeter_hook_unseen_bytes": "counter",
        "zonemeter_hook_coverage_ratio": "gauge",
        "zonemeter_hook_tcp_direction_ratio": "gauge",
        "zonemeter_datapath_info": "gauge",
        "zonemeter_flow_table_entries": "gauge",
        "zonemeter_flow_table_capacity": "gauge",
        "zonemeter_attached_interfaces": "gauge",
        "zonemeter_collector_duration_seconds": "gauge",
        "zonemeter_metadata_synced": "gauge",
        "zonemeter_hint_model_info": "gauge",
        "zonemeter_build_info": "gauge",
    }


def test_label_values_are_escaped_and_missing_ones_are_unknown() -> None:
    exp = Exporter()
    exp.update(ExportSnapshot(totals=AttributionTotals(service_bytes={
        ServiceBytesKey('we"ird', "back\\slash", "80", "line\nbreak", None, "", "request"): 1,  # type: ignore[arg-type]
    })))
    text = generate_latest(exp.registry()).decode()
    line = next(ln for ln in text.splitlines() if ln.startswith("zonemeter_service_bytes_total{"))
    assert line == ('zonemeter_service_bytes_total{client_kind="unknown",client_zone="line\\nbreak",'
                    'crossing="unknown",direction="request",lb_type="none",namespace="we\\"ird",'
                    'port="80",server_zone="unknown",service="back\\\\slash"} 1.0')
    # and a Prometheus parser reads the original values back
    fam = next(f for f in text_string_to_metric_families(text) if f.name == "zonemeter_service_bytes")
    assert fam.samples[0].labels["namespace"] == 'we"ird'
    assert fam.samples[0].labels["client_zone"] == "line\nbreak"


def test_empty_exporter_exposes_families_and_gauges_at_zero() -> None:
    text = generate_latest(Exporter().registry()).decode()
    assert "# TYPE zonemeter_service_bytes_total counter" in text
    assert "zonemeter_flow_table_entries 0.0" in text
    assert "zonemeter_service_bytes_total{" not in text


def test_keyed_families_label_the_fields_of_their_key_record_in_order() -> None:
    # the getters read label values from the key's fields: the table's label names must be
    # those fields, in that order, or values would land under the wrong names
    rows = {row.labels: row for row in FAMILIES if row.labels in KEYED_LABELS}
    assert len(rows) == 4
    for labels, record in KEYED_LABELS.items():
        assert labels == tuple(f.name for f in fields(record))


def test_describe_yields_every_family_without_samples() -> None:
    described = list(Exporter().describe())
    assert len(described) == 28 and all(not m.samples for m in described)


def test_update_swaps_whole_snapshot_and_snapshot_is_read_only() -> None:
    exp = Exporter()
    source = {ServiceBytesKey("a", "b", "1", "z", "z", "same_zone", "request"): 5}
    snap = ExportSnapshot(totals=AttributionTotals(service_bytes=source))
    exp.update(snap)
    source[ServiceBytesKey("a", "b", "1", "z", "z", "same_zone", "response")] = 7  # producer reuses its dict
    assert len(exp.snapshot().totals.service_bytes) == 1
    with pytest.raises(TypeError):
        exp.snapshot().totals.service_bytes[ServiceBytesKey("x", "y", "1", "z", "z", "same_zone", "request")] = 1  # type: ignore[index]
    exp.update(ExportSnapshot())
    assert "zonemeter_service_bytes_total{" not in generate_latest(exp.registry()).decode()


def test_flows_document() -> None:
    exp = Exporter()
    exp.update(full_snapshot())
    doc = exp.flows(top=1)
    assert doc["services"] == [{
        "namespace": "shop", "service": "cart", "bytes_total": 6500,
        "by_crossing": {"cross_zone": 6200, "same_zone": 300},
        "by_direction": {"request": 1500, "response": 5000},
        "by_client_kind": {"pod": 6200, "load-balancer/aws-alb": 300},
        "hint_ignored_bytes": 1200, "mode": "PreferSameZone", "reason": "none",
        "locality_in_effect": {"zone-a": True, "zone-b": False},
        "expected_cross_zone": {"zone-a": 0.0, "zone-b": 0.5},
    }]
    assert [(p["client"], p["client_kind"], p["lb_type"]) for p in doc["pairs"]] == [
        ("shop/ui-1", "pod", "none")]
    assert [(p["client"], p["client_kind"], p["lb_type"]) for p in exp.flows(top=2)["pairs"]][1] == (
        "10.0.9.4", "load-balancer", "aws-alb")
    assert doc["self"]["metadata_synced"] == {"nodes": False, "pods": True}
    assert doc["unattributed_bytes"] == {"flow_table_full": 9}
    assert doc["unknown_crossing_bytes"] == {"no_pod_for_ip": 4}
    assert doc["skipped_bytes"] == {"clusterip_client_copy": 6200}
    json.dumps(doc)  # plain data only


@pytest.mark.parametrize("attached, synced, ok, text", [
    (True, {"pods": True, "nodes": True}, True, "ready: datapath attached, metadata synced (nodes, pods)"),
    (False, {"pods": True}, False, "not ready: datapath not attached"),
    (True, {"pods": False, "nodes": True, "services": False}, False,
     "not ready: metadata not synced: pods, services"),
    (False, {}, False, "not ready: datapath not attached; metadata not started"),
])
def test_readiness_states(attached: bool, synced: dict[str, bool], ok: bool, text: str) -> None:
    assert make_readiness(lambda: attached, lambda: synced)() == (ok, text)


@pytest.mark.parametrize("value, expect", [
    ("0.0.0.0:11808", ("0.0.0.0", 11808)), (":11808", ("0.0.0.0", 11808)),
    ("[::1]:80", ("::1", 80)), ("localhost:0", ("localhost", 0)),
])
def test_parse_address(value: str, expect: tuple[str, int]) -> None:
    assert parse_address(value) == expect


@pytest.mark.parametrize("value", ["11808", "host:", "host:99999", "host:http"])
def test_parse_address_errors(value: str) -> None:
    with pytest.raises(InputError, match="--metrics-address"):
        parse_address(value)


@pytest.fixture()
def served() -> Iterator[tuple[MetricsServer, dict[str, object]]]:
    state: dict[str, object] = {"attached": False, "synced": {"pods": False}}
    exp = Exporter()
    exp.update(full_snapshot())
    check = make_readiness(lambda: bool(state["attached"]), lambda: state["synced"])  # type: ignore[arg-type,return-value]
    server = start_server(exp, "127.0.0.1:0", check)
    yield server, state
    server.close()


def _get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.headers["Content-Type"], resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers["Content-Type"], err.read().decode()


def test_http_endpoints(served: tuple[MetricsServer, dict[str, object]]) -> None:
    server, state = served
    status, ctype, body = _get(server.url + "/metrics")
    assert status == 200 and ctype.startswith("text/plain")
    assert 'zonemeter_service_hint_ignored_bytes_total{client_kind="pod",client_node="n-a",client_zone="zone-a"' in body
    assert _get(server.url + "/healthz")[:1] == (200,)
    status, _, body = _get(server.url + "/readyz")
    assert (status, body) == (503, "not ready: datapath not attached; metadata not synced: pods\n")
    state["attached"], state["synced"] = True, {"pods": True}
    status, _, body = _get(server.url + "/readyz")
    assert (status, body) == (200, "ready: datapath attached, metadata synced (pods)\n")
    status, ctype, body = _get(server.url + "/flows?top=1")
    assert status == 200 and ctype == "application/json"
    assert len(json.loads(body)["pairs"]) == 1
    assert _get(server.url + "/flows?top=x")[0] == 400
    assert _get(server.url + "/nope")[0] == 404


def test_readiness_check_that_raises_is_not_ready() -> None:
    def broken() -> tuple[bool, str]:
        raise RuntimeError("boom")

    server = start_server(Exporter(), "127.0.0.1:0", broken)
    try:
        status, _, body = _get(server.url + "/readyz")
    finally:
        server.close()
    assert status == 503 and "boom" in body


def test_mixed_none_and_int_labels_from_a_sloppy_producer_do_not_break_scrapes() -> None:
    exp = Exporter()
    exp.update(ExportSnapshot(
        totals=AttributionTotals(
            service_bytes={ServiceBytesKey("a", "s", 80, None, "z", "unknown", "request"): 1,  # type: ignore[arg-type]
                           ServiceBytesKey("a", "s", "443", "z", "z", "same_zone", "request"): 2},
            unattributed_bytes={None: 3, "no_pod_for_ip": 4}),  # type: ignore[dict-item]
        locality={ServiceRef("a", "s"): Locality("none", None, {}, 0.0),  # type: ignore[arg-type]
                  ServiceRef("a", None): Locality("Auto", "none", {}, 0.0)},  # type: ignore[arg-type]
    ))
    text = generate_latest(exp.registry()).decode()
    assert ('client_kind="unknown",client_zone="unknown",crossing="unknown",direction="request",'
            'lb_type="none",namespace="a",port="80"') in text
    assert 'zonemeter_unattributed_bytes_total{reason="unknown"} 3.0' in text
    assert 'zonemeter_service_locality_info{mode="none",namespace="a",reason="unknown",service="s"} 1.0' in text
    assert exp.flows()["unattributed_bytes"] == {"no_pod_for_ip": 4, "unknown": 3}


def _call(app, remote: str) -> tuple[str, bytes]:  # type: ignore[no-untyped-def]
    seen: list[str] = []
    body = b"".join(app({"PATH_INFO": "/flows", "QUERY_STRING": "top=1", "REMOTE_ADDR": remote},
                        lambda status, headers: seen.append(status)))
    return seen[0], body


@pytest.mark.parametrize("remote, allowed", [
    ("127.0.0.1", True), ("127.3.2.1", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("10.0.0.7", False), ("fd00::5", False), ("::ffff:10.0.0.7", False), ("", False),
])
def test_flows_answers_loopback_only_by_default(remote: str, allowed: bool) -> None:
    # /flows carries pod names and IPs; with hostNetwork the port is reachable from any pod
    status, body = _call(make_app(Exporter(), lambda: (True, "ready")), remote)
    assert status.startswith("200" if allowed else "403"), (remote, status)
    if not allowed:
        assert b"loopback only" in body
    status, _ = _call(make_app(Exporter(), lambda: (True, "ready"), flows_remote=True), remote)
    assert status.startswith("200")
