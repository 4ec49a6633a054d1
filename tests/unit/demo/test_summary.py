"""Agents' exposition text -> summed metrics -> the issue-5 JSON summary and table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.exporter import Exporter
from agent.hints import REASON_SENTENCES
from tests.fixtures.lab_hints import lab_hints
from tools.demo.agents import READ_SAMPLES, WORKLOAD_BYTES, merge, parse_metrics
from tools.demo.cluster import ServiceModel, ServiceTruth, controller_snapshot, evaluate
from tools.demo.run import warning_messages
from tools.demo.summary import build_summary, findings, render_table, usd_per_month_at_aws_price
from tools.demo.topology import load_demo
from tools.lab import Lab

NODE_B1 = """\
# HELP zonemeter_service_bytes_total L3 bytes of Service traffic.
# TYPE zonemeter_service_bytes_total counter
zonemeter_service_bytes_total{namespace="shop",service="checkout",port="80",client_zone="zone-c",server_zone="zone-b",crossing="cross_zone",direction="request"} 1000.0
zonemeter_service_bytes_total{namespace="shop",service="checkout",port="80",client_zone="zone-c",server_zone="zone-b",crossing="cross_zone",direction="response"} 5000.0
zonemeter_service_bytes_total{namespace="shop",service="checkout",port="80",client_zone="zone-b",server_zone="zone-b",crossing="same_node",direction="request"} 700.0
# HELP zonemeter_service_hint_ignored_bytes_total hint-ignored
# TYPE zonemeter_service_hint_ignored_bytes_total counter
zonemeter_service_hint_ignored_bytes_total{namespace="shop",service="checkout",client_zone="zone-c",server_zone="zone-b",client_node="c2",client_kind="pod"} 6000.0
# HELP zonemeter_service_locality_in_effect in effect
# TYPE zonemeter_service_locality_in_effect gauge
zonemeter_service_locality_in_effect{namespace="shop",service="checkout",client_zone="zone-a"} 1.0
zonemeter_service_locality_in_effect{namespace="shop",service="checkout",client_zone="zone-b"} 1.0
zonemeter_service_locality_in_effect{namespace="shop",service="checkout",client_zone="zone-c"} 0.0
# HELP zonemeter_service_expected_cross_zone_ratio expected
# TYPE zonemeter_service_expected_cross_zone_ratio gauge
zonemeter_service_expected_cross_zone_ratio{namespace="shop",service="checkout",client_zone="zone-a"} 0.0
zonemeter_service_expected_cross_zone_ratio{namespace="shop",service="checkout",client_zone="zone-b"} 0.0
zonemeter_service_expected_cross_zone_ratio{namespace="shop",service="checkout",client_zone="zone-c"} 1.0
# HELP zonemeter_service_locality_info info
# TYPE zonemeter_service_locality_info gauge
zonemeter_service_locality_info{namespace="shop",service="checkout",mode="PreferSameZone",reason="none"} 1.0
# HELP zonemeter_workload_bytes_total workload
# TYPE zonemeter_workload_bytes_total counter
zonemeter_workload_bytes_total{namespace="shop",workload="frontend",workload_kind="Pod",client_zone="zone-b",remote_zone="zone-a",remote_kind="pod",crossing="cross_zone",direction="egress"} 0.0
zonemeter_workload_bytes_total{namespace="shop",workload="frontend",workload_kind="Pod",client_zone="zone-b",remote_zone="",remote_kind="external",crossing="external",direction="ingress"} 0.0
# HELP zonemeter_attached_interfaces veths
# TYPE zonemeter_attached_interfaces gauge
zonemeter_attached_interfaces 6.0
"""

NODE_A1 = """\
# TYPE zonemeter_service_bytes_total counter
zonemeter_service_bytes_total{namespace="shop",service="checkout",port="80",client_zone="zone-c",server_zone="zone-b",crossing="cross_zone",direction="request"} 24.0
zonemeter_service_bytes_total{namespace="shop",service="checkout",port="8443",client_zone="zone-c",server_zone="zone-b",crossing="cross_zone",direction="request"} 10.0
# TYPE zonemeter_unattributed_bytes_total counter
zonemeter_unattributed_bytes_total{reason="flow_table_full"} 3.0
# TYPE zonemeter_attached_interfaces gauge
zonemeter_attached_interfaces 5.0
"""


def _model() -> dict[str, ServiceModel]:
    return {"shop/checkout": ServiceModel(
        key="shop/checkout", mode="PreferSameZone", reason="none",
        locality_in_effect={"zone-a": True, "zone-b": True, "zone-c": True},
        warnings=("single-endpoint-zone",), selection={}, filtering={})}


def test_parse_and_merge_sum_over_nodes_and_ports() -> None:
    b1, a1 = parse_metrics(NODE_B1), parse_metrics(NODE_A1)
    key = ("shop", "checkout", "zone-c", "zone-b", "cross_zone", "request")
    assert b1.service_bytes[key] == 1000
    assert a1.service_bytes[key] == 34  # two ports, one series key
    total = merge([b1, a1])
    assert total.service_bytes[key] == 1034
    assert total.hint_ignored == {("shop", "checkout", "zone-c", "zone-b"): 6000}
    assert total.in_effect[("shop", "checkout")] == {"zone-a": True, "zone-b": True,
                                                     "zone-c": False}
    assert total.info[("shop", "checkout")] == ("PreferSameZone", "none")
    assert total.unattributed == {"flow_table_full": 3}
    assert total.attached_interfaces == 11


def test_parse_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_metrics("zonemeter_service_bytes_total{namespace=\"shop\" 12\n")


def _truth(req: int, resp: int, same_node: int) -> ServiceTruth:
    t = ServiceTruth()
    t.bytes["cross_zone"] = req + resp
    t.bytes["same_node"] = same_node
    t.by_series = {("zone-c", "zone-b", "cross_zone", "request"): req,
                   ("zone-c", "zone-b", "cross_zone", "response"): resp,
                   ("zone-b", "zone-b", "same_node", "request"): same_node}
    t.hint_ignored = {("zone-c", "zone-b"): req + resp}
    t.hint_ignored_by_cause = {("c2", "data-plane"): req + resp}
    return t


#: node c2's agent: its client pods called checkout's ClusterIP (the evidence for data-plane)
NODE_C2 = """\
# TYPE zonemeter_service_client_path_bytes_total counter
zonemeter_service_client_path_bytes_total{namespace="shop",service="checkout",client_node="c2",path="clusterip"} 6100.0
# TYPE zonemeter_workload_bytes_total counter
zonemeter_workload_bytes_total{namespace="shop",workload="batch",workload_kind="Job",client_zone="zone-c",remote_zone="zone-a",remote_kind="cidr",crossing="cross_zone",direction="egress"} 4000000000.0
zonemeter_workload_bytes_total{namespace="shop",workload="batch",workload_kind="Job",client_zone="zone-c",remote_zone="zone-a",remote_kind="cidr",crossing="cross_zone",direction="ingress"} 2000000000.0
zonemeter_workload_bytes_total{namespace="shop",workload="batch",workload_kind="Job",client_zone="zone-c",remote_zone="zone-c",remote_kind="node",crossing="same_node",direction="egress"} 50.0
"""


def test_verdict_names_the_node_and_cause_beside_the_lab() -> None:
    agents = merge([parse_metrics(NODE_B1), parse_metrics(NODE_C2)])
    assert agents.hint_ignored_by_node == {("shop", "checkout", "c2", "pod"): 6000}
    assert agents.client_paths == {("shop", "checkout", "c2", "clusterip"): 6100}
    s = build_summary(10.0, agents, {"shop/checkout": _truth(1000, 5000, 700)}, _model(),
                      traffic_seconds=10.0, proxy_versions={"c2": "v1.26.3"})
    (svc,) = s["services"]
    assert svc["hint_ignored_causes"] == [{
        "client_node": "c2", "cause": "data-plane", "bytes": 6000, "ground_truth_bytes": 6000,
        "ground_truth_cause": "data-plane", "kube_proxy_version": "v1.26.3",
        "sentence": "locality configured, but node c2's data plane ignores the hints "
                    "(600 bytes/s, kube-proxy v1.26.3 there)"}]
    assert "    data-plane: locality configured, but node c2's data plane ignores the hints" \
        in "\n".join(findings(s))
    # the sentence's rate is the measured window's: the warm-up's 3,000 bytes left out
    base = merge([parse_metrics(NODE_B1.replace('client_kind="pod"} 6000.0', 'client_kind="pod"} 3000.0')),
                  parse_metrics(NODE_C2.replace("} 6100.0", "} 3000.0"))])
    warm = build_summary(10.0, agents, {"shop/checkout": _truth(1000, 5000, 700)}, _model(),
                         baseline=base, traffic_seconds=10.0)
    [c] = warm["services"][0]["hint_ignored_causes"]
    assert c["bytes"] == 6000 and "(300 bytes/s)" in c["sentence"]
    # without the client node's evidence the agents cannot name the cause: their row and
    # the lab's (the cause it played, which the agents named not) stand apart
    alone = build_summary(10.0, parse_metrics(NODE_B1), {"shop/checkout": _truth(1000, 5000, 700)},
                          _model())
    assert [(c["client_node"], c["cause"], c["bytes"], c["ground_truth_cause"], c["ground_truth_bytes"])
            for c in alone["services"][0]["hint_ignored_causes"]] == [
        ("c2", "unknown", 6000, None, 0), ("c2", None, 0, "data-plane", 6000)]


def test_non_service_bytes_are_priced_beside_the_services() -> None:
    agents = merge([parse_metrics(NODE_B1), parse_metrics(NODE_C2)])
    base = parse_metrics(NODE_C2.replace("4000000000.0", "1000000000.0"))
    s = build_summary(100.0, agents, {"shop/checkout": _truth(1000, 5000, 700)}, _model(),
                      baseline=base, traffic_seconds=100.0)
    rows = {(w["workload"], w["remote_kind"], w["client_zone"], w["remote_zone"]): w for w in s["workloads"]}
    cidr = rows[("batch", "cidr", "zone-c", "zone-a")]
    assert cidr["bytes"] == {"cross_zone": 6_000_000_000} and cidr["cross_zone_bytes"] == 6_000_000_000
    # the window's 3e9 cross-zone bytes (warm-up's 3e9 left out) over 100 s, priced as a Service's
    assert cidr["usd_per_month_at_aws_price"] == usd_per_month_at_aws_price(3_000_000_000, 100.0) > 0
    assert rows[("batch", "node", "zone-c", "zone-c")]["usd_per_month_at_aws_price"] == 0.0
    usd = s["usd_per_month_at_aws_price"]
    assert usd["workloads"] == cidr["usd_per_month_at_aws_price"]
    assert usd["total"] == round(usd["services"] + usd["workloads"], 2)
    table = render_table(s, ["zone-a", "zone-b", "zone-c"])
    assert "non-Service bytes (zonemeter_workload_bytes_total): 6,000,000,000 cross-zone" in table
    assert "shop/batch (Job) -> cidr zone-c->zone-a: 6,000,000,000 cross-zone" in table


def test_summary_schema_and_exact_match() -> None:
    agents = parse_metrics(NODE_B1)
    s = build_summary(12.34567, agents, {"shop/checkout": _truth(1000, 5000, 700)}, _model())
    assert set(s) == {"duration_seconds", "services", "double_counted_bytes", "workloads",
                      "usd_per_month_at_aws_price", "workload_breakdown", "client_kind_exported",
                      "unattributed_bytes"}
    assert s["duration_seconds"] == 12.346
    (svc,) = s["services"]
    assert set(svc) == {"namespace", "name", "bytes", "cross_zone_bytes",
                        "ground_truth_cross_zone_bytes", "hint_ignored_bytes",
                        "ground_truth_hint_ignored_bytes", "locality_in_effect", "reason",
                        "warnings", "usd_per_month_at_aws_price", "expected_cross_zone",
                        "observed_cross_zone", "hint_ignored_causes", "cost_by_class", "by_zone_pair",
                        "by_client_kind", "entry_by_client_kind"}
    assert svc["bytes"] == {"same_node": 700, "cross_zone": 6000}
    assert svc["cross_zone_bytes"] == svc["ground_truth_cross_zone_bytes"] == 6000
    assert svc["hint_ignored_bytes"] == svc["ground_truth_hint_ignored_bytes"] == 6000
    assert svc["locality_in_effect"] == {"zone-a": True, "zone-b": True, "zone-c": False}
    assert svc["reason"] == "none" and svc["warnings"] == ["single-endpoint-zone"]
    assert s["double_counted_bytes"] == 0


def test_expected_beside_observed_cross_zone_share() -> None:
    agents = parse_metrics(NODE_B1)
    s = build_summary(1.0, agents, {"shop/checkout": _truth(1000, 5000, 700)}, _model())
    (svc,) = s["services"]
    assert svc["expected_cross_zone"] == {"zone-a": 0.0, "zone-b": 0.0, "zone-c": 1.0}
    # zone-c: all 6,000 bytes crossed; zone-b: 700 same-node bytes; zone-a sent nothing
    assert svc["observed_cross_zone"] == {"zone-b": 0.0, "zone-c": 1.0}
    # the warm-up (baseline) is left out: 5,000 of zone-c's bytes before, 1,000 after
    base = parse_metrics(NODE_B1.replace('direction="request"} 1000.0', 'direction="request"} 0.0')
                         .replace('direction="request"} 700.0', 'direction="request"} 0.0'))
    agents.service_bytes[("shop", "checkout", "zone-c", "zone-c", "same_node", "request")] = 3000
    s = build_summary(1.0, agents, {"shop/checkout": _truth(1000, 5000, 700)}, _model(), baseline=base)
    assert s["services"][0]["observed_cross_zone"] == {"zone-b": 0.0, "zone-c": 0.25}
    row = next(ln for ln in render_table(s, ["zone-a", "zone-b", "zone-c"]).splitlines()
               if ln.startswith("shop/checkout"))
    assert " 0/- 0/0 100/25 " in row


def test_double_count_is_what_agents_report_above_truth() -> None:
    agents = merge([parse_metrics(NODE_B1), parse_metrics(NODE_A1)])  # 34 extra request bytes
    s = build_summary(1.0, agents, {"shop/checkout": _truth(1000, 5000, 700)}, _model())
    assert s["double_counted_bytes"] == 34
    # bytes the agents missed are not "double counted" (they show as a mismatch instead)
    s = build_summary(1.0, parse_metrics(NODE_B1),
                      {"shop/checkout": _truth(2000, 5000, 700)}, _model())
    assert s["double_counted_bytes"] == 0
    assert s["services"][0]["ground_truth_cross_zone_bytes"] == 7000


def test_workload_bytes_count_as_double_over_both_directions() -> None:
    text = NODE_B1.replace('direction="egress"} 0.0', 'direction="egress"} 99.0') \
        .replace('direction="ingress"} 0.0', 'direction="ingress"} 1.0')
    assert parse_metrics(text).workload_bytes == 100
    s = build_summary(1.0, parse_metrics(text), {"shop/checkout": _truth(1000, 5000, 700)},
                      _model())
    assert s["double_counted_bytes"] == 100


def test_demo_reads_only_metrics_the_agent_exports() -> None:
    """A rename in agent/exporter/families.py must fail here, not silently read 0 in the demo."""
    exported = set()
    for fam in Exporter().describe():
        exported.add(fam.name + ("_total" if fam.type == "counter" else ""))
    missing = [name for name in READ_SAMPLES if name not in exported]
    assert missing == []
    assert WORKLOAD_BYTES in READ_SAMPLES


def test_cost_extrapolates_the_measured_rate_at_aws_price() -> None:
    # 6,000 cross-zone bytes in 1 s -> 6,000 B/s * 2,629,746 s / 1e9 B/GB * $0.02 = $0.3156
    s = build_summary(1.0, parse_metrics(NODE_B1), {"shop/checkout": _truth(1000, 5000, 700)},
                      _model())
    assert s["services"][0]["usd_per_month_at_aws_price"] == 0.32
    # warm-up bytes (the baseline) are left out; the clients' own time is the divisor
    base = parse_metrics(NODE_B1.replace("} 1000.0", "} 0.0"))  # 5,000 cross-zone before
    s = build_summary(9.0, parse_metrics(NODE_B1), {"shop/checkout": _truth(1000, 5000, 700)},
                      _model(), baseline=base, traffic_seconds=0.5)
    assert s["services"][0]["usd_per_month_at_aws_price"] == round(1000 / 0.5 * 2_629_746 / 1e9 * 0.02, 2)
    assert usd_per_month_at_aws_price(10**9, 2_629_746) == 0.02  # one GB a month
    assert usd_per_month_at_aws_price(0, 10.0) == 0.0
    text = render_table(s, ["zone-a", "zone-b", "zone-c"])
    assert "$/MONTH AT AWS*" in text and "$0.11" in text
    assert "* extrapolation:" in text and "not your bill" in text


#: shop/checkout's clients by class, from an agent that exports client_kind and lb_type: pods,
#: an ALB (AWS does not bill its hop to targets) and an NLB (billed, cross-zone on)
NODE_CLASSES = """\
# TYPE zonemeter_service_bytes_total counter
zonemeter_service_bytes_total{namespace="shop",service="checkout",port="80",client_zone="zone-c",server_zone="zone-b",crossing="cross_zone",direction="request",client_kind="pod",lb_type="none"} 1000.0
zonemeter_service_bytes_total{namespace="shop",service="checkout",port="80",client_zone="zone-c",server_zone="zone-b",crossing="cross_zone",direction="response",client_kind="pod",lb_type="none"} 5000.0
zonemeter_service_bytes_total{namespace="shop",service="checkout",port="80",client_zone="zone-a",server_zone="zone-b",crossing="cross_zone",direction="request",client_kind="load-balancer",lb_type="aws-alb"} 40000.0
zonemeter_service_bytes_total{namespace="shop",service="checkout",port="80",client_zone="zone-c",server_zone="zone-b",crossing="cross_zone",direction="request",client_kind="load-balancer",lb_type="aws-nlb"} 3000.0
zonemeter_service_bytes_total{namespace="shop",service="checkout",port="80",client_zone="zone-b",server_zone="zone-b",crossing="same_zone",direction="request",client_kind="load-balancer",lb_type="aws-alb"} 900.0
# TYPE zonemeter_workload_bytes_total counter
zonemeter_workload_bytes_total{namespace="shop",workload="batch",workload_kind="Job",client_zone="zone-c",remote_zone="zone-a",remote_kind="load-balancer",crossing="cross_zone",direction="egress"} 1000000.0
"""


def test_dollars_price_only_the_classes_aws_bills_and_show_the_rest_at_zero() -> None:
    agents = parse_metrics(NODE_CLASSES)
    assert agents.service_classes[("shop", "checkout", "cross_zone", "load-balancer", "aws-alb")] == 40000
    s = build_summary(1.0, agents, {"shop/checkout": _truth(1000, 5000, 700)}, _model())
    (svc,) = s["services"]
    assert svc["cross_zone_bytes"] == 49000  # every class's bytes, as the agents count them
    by = {(c["client_kind"], c["lb_type"]): c for c in svc["cost_by_class"]}
    assert [(c["client_kind"], c["lb_type"]) for c in svc["cost_by_class"]] == [
        ("load-balancer", "aws-alb"), ("pod", ""), ("load-balancer", "aws-nlb")]
    alb = by[("load-balancer", "aws-alb")]
    assert (alb["cross_zone_bytes"], alb["billed"], alb["usd_per_month_at_aws_price"]) == (40000, False, 0.0)
    assert alb["reason"].startswith("Application Load Balancer to its targets")
    assert by[("pod", "")]["usd_per_month_at_aws_price"] == usd_per_month_at_aws_price(6000, 1.0)
    assert by[("load-balancer", "aws-nlb")]["usd_per_month_at_aws_price"] == \
        usd_per_month_at_aws_price(3000, 1.0)
    assert svc["usd_per_month_at_aws_price"] == round(usd_per_month_at_aws_price(6000, 1.0)
                                                      + usd_per_month_at_aws_price(3000, 1.0), 2)
    # a pod's own hop to a load balancer in another zone is billed on AWS
    (row,) = [w for w in s["workloads"] if w["remote_kind"] == "load-balancer"]
    assert row["billed"] and row["usd_per_month_at_aws_price"] == usd_per_month_at_aws_price(10**6, 1.0)
    table = render_table(s, ["zone-a", "zone-b", "zone-c"])
    assert ("  shop/checkout: 40,000 cross-zone bytes from load-balancer aws-alb at $0: "
            "Application Load Balancer to its targets") in table
    # an agent without the class labels: every cross-zone byte billed, as before classes
    old = parse_metrics(NODE_B1)
    assert build_summary(1.0, old, {"shop/checkout": _truth(1000, 5000, 700)}, _model())[
        "services"][0]["cost_by_class"] == [{
            "hop": "endpoint", "client_kind": "", "lb_type": "", "cross_zone_bytes": 6000, "billed": True,
            "usd_per_month_at_aws_price": usd_per_month_at_aws_price(6000, 1.0),
            "reason": "no client_kind label (an agent before client classes): priced as inter-zone"}]


def test_table_marks_equal_and_different() -> None:
    s = build_summary(1.0, parse_metrics(NODE_B1), {"shop/checkout": _truth(1000, 5000, 700)},
                      _model())
    text = render_table(s, ["zone-a", "zone-b", "zone-c"], {"shop/checkout": "PreferSameZone"})
    row = next(line for line in text.splitlines() if line.startswith("shop/checkout"))
    assert "PreferSameZone" in row and " YYn " in row
    assert "6,000 = 6,000" in row and "700" in row
    s["services"][0]["ground_truth_cross_zone_bytes"] = 6001
    assert "6,000 ! 6,001" in render_table(s, ["zone-a", "zone-b", "zone-c"])


def test_findings_name_what_to_look_at() -> None:
    s = build_summary(1.0, parse_metrics(NODE_B1), {"shop/checkout": _truth(1000, 5000, 700)},
                      _model())
    lines = findings(s)
    assert lines[0] == "findings:"
    assert any("6,000 bytes crossed zones; locality is off in zone-c" in ln for ln in lines)
    assert any("6,000 bytes ignored the hints" in ln for ln in lines)
    assert any(ln.strip() == "single-endpoint-zone" for ln in lines)  # code kept, no message given
    s["services"][0].update(hint_ignored_bytes=0, cross_zone_bytes=0, warnings=[])
    assert findings(s) == []


def test_findings_explain_reason_and_warning_codes_in_words() -> None:
    s = build_summary(1.0, parse_metrics(NODE_B1), {"shop/checkout": _truth(1000, 5000, 700)},
                      _model())
    s["services"][0]["reason"] = "min-allocation-exceeds-overload-threshold"
    msg = "a single endpoint receives all traffic of its zone: shop/checkout-b1"
    lines = findings(s, {"shop/checkout": {"single-endpoint-zone": msg}})
    assert ("    reason min-allocation-exceeds-overload-threshold: "
            + REASON_SENTENCES["min-allocation-exceeds-overload-threshold"]) in lines
    assert f"    single-endpoint-zone: {msg}" in lines
    text = render_table(s, ["zone-a", "zone-b", "zone-c"],
                        warning_messages={"shop/checkout": {"single-endpoint-zone": msg}})
    assert msg in text and REASON_SENTENCES["min-allocation-exceeds-overload-threshold"] in text


def test_warning_messages_come_from_the_hint_model_on_the_demo_snapshot(tmp_path: Path) -> None:
    lab = Lab(load_demo().topology, prefix="zmsum")  # not built: only its objects are read
    path = tmp_path / "snapshot.json"
    source = lab_hints("model")
    path.write_text(json.dumps(controller_snapshot(lab, source)))
    messages = warning_messages(path)
    models = evaluate(controller_snapshot(lab, source), lab.topology, source)
    for key, model in models.items():  # every code the summary prints has its message
        assert set(model.warnings) <= set(messages[key]), key
    assert "Auto refuses 8 ready endpoints" in messages["shop/cart"]["auto-minimum-endpoints"]


def test_pod_traffic_with_its_own_node_is_not_counted_as_double() -> None:
    # a replaced pod's new interface sends MLD reports and neighbour discovery to its node:
    # real, node-local, never Service traffic; anything else in workload series is
    labels = ('namespace="shop",workload="checkout",workload_kind="Deployment",client_zone="zone-b",'
              'remote_zone="zone-b",')
    text = (f"# TYPE {WORKLOAD_BYTES[:-6]} counter\n"
            f'{WORKLOAD_BYTES}{{{labels}remote_kind="node",crossing="same_node",direction="egress"}} 1536\n'
            f'{WORKLOAD_BYTES}{{{labels}remote_kind="pod",crossing="same_zone",direction="egress"}} 40\n')
    m = parse_metrics(text)
    assert (m.node_link_bytes, m.workload_bytes) == (1536, 40)
    both = merge([m, parse_metrics(text)])
    assert (both.node_link_bytes, both.workload_bytes) == (3072, 80)
