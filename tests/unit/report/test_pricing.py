"""Prices per GB crossing a zone boundary."""

from __future__ import annotations

import pytest

from agent.errors import InputError
from agent.report.pricing import Price, parse_price


@pytest.mark.parametrize("text, name, usd", [
    ("aws", "aws", 0.02), ("AWS", "aws", 0.02), ("gcp", "gcp", 0.01), ("azure", "azure", 0.0),
    ("0.015", "custom", 0.015), ("$0.03", "custom", 0.03), ("0", "custom", 0.0)])
def test_prices(text: str, name: str, usd: float) -> None:
    assert parse_price(text) == Price(name, usd)


@pytest.mark.parametrize("text", ["oracle", "", "-0.01", "nan", "inf", "0.01/GB"])
def test_bad_prices(text: str) -> None:
    with pytest.raises(InputError) as err:
        parse_price(text)
    assert str(err.value).startswith("--price: ")


def test_usd_per_month() -> None:
    # 1 MB/s for 30.44 days (2,629,746 s) = 2,629.746 GB; x $0.02 (aws, both sides)
    assert parse_price("aws").usd_per_month(1_000_000) == pytest.approx(52.59492)
    assert parse_price("gcp").usd_per_month(1_000_000) == pytest.approx(26.29746)
    assert parse_price("azure").usd_per_month(1_000_000) == 0
    assert "0.01/GB on each side" in parse_price("aws").describe()


def test_one_month_length_everywhere() -> None:
    """The report, the demo (through this module), the recording rules and the dashboard
    price a month of the same length."""
    from pathlib import Path

    from agent.report.pricing import SECONDS_PER_MONTH

    mon = Path(__file__).resolve().parents[3] / "deploy" / "daemonset" / "monitoring"
    assert SECONDS_PER_MONTH == 2_629_746
    for f in ("prometheusrule.yaml", "rules.yml", "grafana-dashboard.json"):
        text = (mon / f).read_text()
        assert str(SECONDS_PER_MONTH) in text, f
        assert "2592000" not in text and "30 * 86400" not in text, f


# ---------------------------------------------------------------- prices by client class

@pytest.mark.parametrize("cloud, kind, lb, billed", [
    # AWS: inter-AZ EC2 transfer for pods, nodes and VMs/managed databases; an ALB's or a
    # CLB's hop to its targets is free, an NLB's (cross-zone load balancing on) is not
    ("aws", "pod", "none", True), ("aws", "node", "none", True), ("aws", "cidr", "none", True),
    ("aws", "load-balancer", "aws-alb", False), ("aws", "load-balancer", "aws-clb", False),
    ("aws", "load-balancer", "aws-nlb", True), ("aws", "load-balancer", "other", True),
    ("aws", "load-balancer", "", True),       # a pod's own hop to a load balancer (workloads)
    ("aws", "external", "none", False), ("aws", "unknown", "none", True),
    ("aws", "", "", True),                    # a series of an agent before client classes
    # GCP: VM to VM between zones; a proxy load balancer's backend traffic is its own charge
    ("gcp", "pod", "none", True), ("gcp", "node", "none", True),
    ("gcp", "load-balancer", "gcp-lb", False), ("gcp", "external", "none", False),
    # Azure: no inter-zone charge at all
    ("azure", "pod", "none", False), ("azure", "load-balancer", "azure-lb", False),
    ("azure", "cidr", "none", False),
    # a number: every class billed, since it says nothing of a cloud's exceptions
    ("0.03", "load-balancer", "aws-alb", True), ("0.03", "pod", "none", True),
    ("0.03", "external", "none", False),
])
def test_class_rules(cloud: str, kind: str, lb: str, billed: bool) -> None:
    rule = parse_price(cloud).rule(kind, lb)
    assert rule.billed is billed and parse_price(cloud).billed(kind, lb) is billed
    assert rule.reason


def test_every_named_rule_cites_a_public_page_and_every_class_has_one() -> None:
    from agent.attribution.vocabulary import CLIENT_KINDS
    from agent.k8s.cidrs import LB_TYPES
    from agent.report.pricing import CLASS_RULES, NAMED_PRICES, RULES_READ_ON

    assert set(CLASS_RULES) == set(NAMED_PRICES)
    assert RULES_READ_ON == "2026-12-07"
    for cloud, rules in CLASS_RULES.items():
        for kind in CLIENT_KINDS:
            lbs = ("", *LB_TYPES) if kind == "load-balancer" else ("",)
            for lb in lbs:
                rule = rules[(kind, lb)]
                assert rule.source.startswith("https://"), (cloud, kind, lb)
                assert "no " + cloud + " rule" not in rule.reason


def test_lb_type_is_read_only_for_load_balancers_and_unknown_classes_are_billed() -> None:
    aws = parse_price("aws")
    # a stray lb_type on another class is not a different class
    assert aws.rule("pod", "aws-alb") == aws.rule("pod", "none") == aws.rule("pod")
    odd = aws.rule("satellite")
    assert odd.billed and not odd.sure and "no aws rule for class 'satellite'" in odd.reason
    odd_lb = aws.rule("load-balancer", "f5")
    assert odd_lb.billed and "type 'f5'" in odd_lb.reason


def test_dashboard_and_rules_leave_out_exactly_the_free_load_balancer_types() -> None:
    """The cost rule and panels exclude the lb_type values no cloud's own rule bills; the
    regex there is this module's, not a second copy that could drift."""
    import json
    from pathlib import Path

    from agent.report.pricing import CLASS_RULES, UNBILLED_LB_TYPES

    own = {"aws-alb": "aws", "aws-clb": "aws", "aws-nlb": "aws", "gcp-lb": "gcp",
           "azure-lb": "azure"}
    assert set(UNBILLED_LB_TYPES) == {t for t, cloud in own.items()
                                      if not CLASS_RULES[cloud][("load-balancer", t)].billed}
    regex = "|".join(UNBILLED_LB_TYPES)
    mon = Path(__file__).resolve().parents[3] / "deploy" / "daemonset" / "monitoring"
    for f in ("prometheusrule.yaml", "rules.yml"):
        assert f'lb_type!~"{regex}"' in (mon / f).read_text(), f
    dash = json.loads((mon / "grafana-dashboard.json").read_text())
    costs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])
             if "$price_usd_per_gb" in t.get("expr", "")]
    assert costs and all(f'lb_type!~"{regex}"' in e for e in costs), costs
