"""Prices of cross-zone bytes, and which client classes each cloud bills.

A price is USD per GB (10^9 bytes) that **crosses** a zone boundary, i.e. what the bill
says for one byte going from zone A to zone B, both sides included:

- ``aws``: $0.01/GB charged on egress and $0.01/GB on ingress -> $0.02 per GB crossing
  (EC2 data transfer "within the same AWS Region ... across Availability Zones").
- ``gcp``: $0.01/GB, charged once (egress between zones in the same region).
- ``azure``: $0 (inter-availability-zone transfer is not billed at the time of writing).
- a number: USD per GB crossing, as given.

Not every cross-zone byte is billed that way: the hop from a cloud load balancer to its
targets is free on some (AWS ALB and CLB) and charged on others (AWS NLB with cross-zone
load balancing). :data:`CLASS_RULES` says, per cloud and client class
(``client_kind``/``lb_type`` of ``zonemeter_service_bytes_total``, ``remote_kind`` of
``zonemeter_workload_bytes_total``), whether such a byte is billed, why, and the public
page the rule comes from, read on :data:`RULES_READ_ON`; docs/report.md, *Prices by client
class*, lists them and says which we are unsure of.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from agent.errors import InputError
from agent.k8s.cidrs import LB_TYPES

#: named prices, USD per GB (1e9 bytes) crossing a zone boundary
NAMED_PRICES: dict[str, float] = {"aws": 0.02, "gcp": 0.01, "azure": 0.0}
#: seconds in a month, the same everywhere (report, demo, recording rules, dashboard): the mean
#: Gregorian month, 365.2425 / 12 days = 30.44 days = 2,629,746 s
SECONDS_PER_MONTH = 2_629_746
#: bytes in the report's GB
BYTES_PER_GB = 1e9


#: when the pages cited by :data:`CLASS_RULES` were read
RULES_READ_ON = "2026-12-07"

# The public pages each rule rests on (docs/report.md, "Prices by client class").
AWS_EC2_TRANSFER = ("https://aws.amazon.com/ec2/pricing/on-demand/ (Data Transfer within the "
                    "same AWS Region)")
AWS_ALB_CLB = ("https://aws.amazon.com/blogs/networking-and-content-delivery/"
               "exploring-data-transfer-costs-for-classic-and-application-load-balancers/; "
               "https://docs.aws.amazon.com/elasticloadbalancing/latest/application/disable-cross-zone.html")
AWS_CLB = ("https://docs.aws.amazon.com/elasticloadbalancing/latest/classic/"
           "enable-disable-crosszone-lb.html; " + AWS_ALB_CLB.split("; ")[0])
AWS_NLB = ("https://docs.aws.amazon.com/elasticloadbalancing/latest/network/target-group-cross-zone.html; "
           "https://aws.amazon.com/blogs/networking-and-content-delivery/"
           "exploring-data-transfer-costs-for-aws-network-load-balancers/")
GCP_VPC = "https://cloud.google.com/vpc/network-pricing (VM-to-VM data transfer within Google Cloud)"
GCP_LB = "https://cloud.google.com/load-balancing/pricing (data processed by the load balancer)"
AZURE_BANDWIDTH = "https://azure.microsoft.com/en-us/pricing/details/bandwidth/"

#: the classes a rule table covers: every client class, ``load-balancer`` once per type and
#: once without one (a workload row's ``remote_kind``: the pod's hop to a load balancer), and
#: ``""`` for series without ``client_kind`` (agents from before client classes)
RULE_KINDS: tuple[str, ...] = ("pod", "node", "load-balancer", "cidr", "external", "unknown", "")


@dataclass(frozen=True, slots=True)
class ClassRule:
    """How one cloud bills a cross-zone byte of one client class.

    Attributes:
        client_kind: the class (:data:`RULE_KINDS`).
        lb_type: for ``load-balancer``, the type (``agent.k8s.cidrs.LB_TYPES``) of a
            Service client, ``""`` for a pod's own traffic with a load balancer (the
            workload family has no type) and for other classes.
        billed: True when the byte costs the price's ``usd_per_gb_crossing``; False when
            the cloud does not bill it as inter-zone transfer (priced $0).
        reason: one line saying why, for the report and the demo.
        source: the public page(s) the rule comes from (read on :data:`RULES_READ_ON`).
        sure: False where the pages leave the rule open (docs/report.md says how).
    """

    client_kind: str
    lb_type: str
    billed: bool
    reason: str
    source: str
    sure: bool = True


def _rules(cloud: str, rows: list[ClassRule]) -> Mapping[tuple[str, str], ClassRule]:
    out = {(r.client_kind, r.lb_type): r for r in rows}
    want = {(k, "") for k in RULE_KINDS} | {("load-balancer", t) for t in LB_TYPES}
    assert set(out) == want, f"{cloud}: rules for {sorted(want ^ set(out))}"
    return out


_EXTERNAL_WHY = ("crossing external: internet or another network, billed by other rules "
                 "(data transfer out), never as inter-zone transfer; not priced here")
_NO_CLASS_WHY = "no client_kind label (an agent before client classes): priced as inter-zone"

#: cloud -> (client_kind, lb_type) -> rule; every class of :data:`RULE_KINDS` and every load
#: balancer type has a row (checked at import)
CLASS_RULES: Mapping[str, Mapping[tuple[str, str], ClassRule]] = {
    "aws": _rules("aws", [
        ClassRule("pod", "", True, "EC2 to EC2 across Availability Zones: $0.01/GB each "
                  "direction", AWS_EC2_TRANSFER),
        ClassRule("node", "", True, "EC2 to EC2 across Availability Zones: $0.01/GB each "
                  "direction", AWS_EC2_TRANSFER),
        ClassRule("cidr", "", True, "EC2, RDS, ElastiCache, Redshift instances and ENIs across "
                  "Availability Zones: $0.01/GB each direction", AWS_EC2_TRANSFER),
        ClassRule("load-balancer", "", True, "a pod's traffic with a load balancer in another "
                  "Availability Zone (the client's hop): EC2 data transfer charges apply, $0.01/GB "
                  "each direction", AWS_NLB + "; " + AWS_ALB_CLB.split("; ")[0]),
        ClassRule("load-balancer", "aws-alb", False, "Application Load Balancer to its targets "
                  "across Availability Zones: no inter-AZ charge (cross-zone is always on)",
                  AWS_ALB_CLB),
        ClassRule("load-balancer", "aws-clb", False, "Classic Load Balancer to its instances "
                  "across Availability Zones: no inter-AZ charge with cross-zone load balancing",
                  AWS_CLB),
        ClassRule("load-balancer", "aws-nlb", True, "Network Load Balancer to a target in "
                  "another Availability Zone (cross-zone load balancing on): EC2 data transfer "
                  "charges apply, $0.01/GB each direction", AWS_NLB),
        ClassRule("load-balancer", "gcp-lb", True, "a GCP load balancer type on AWS: priced as "
                  "ordinary inter-AZ transfer", AWS_EC2_TRANSFER, sure=False),
        ClassRule("load-balancer", "azure-lb", True, "an Azure load balancer type on AWS: priced "
                  "as ordinary inter-AZ transfer", AWS_EC2_TRANSFER, sure=False),
        ClassRule("load-balancer", "other", True, "a load balancer without a rule: priced as "
                  "ordinary inter-AZ transfer", AWS_EC2_TRANSFER, sure=False),
        ClassRule("external", "", False, _EXTERNAL_WHY, AWS_EC2_TRANSFER),
        ClassRule("unknown", "", True, "class unknown (a client that resolved to nothing, or "
                  "bytes counted before client classes): priced as inter-AZ transfer",
                  AWS_EC2_TRANSFER, sure=False),
        ClassRule("", "", True, _NO_CLASS_WHY, AWS_EC2_TRANSFER),
    ]),
    "gcp": _rules("gcp", [
        ClassRule("pod", "", True, "VM to VM between zones of a region: $0.01/GiB egress",
                  GCP_VPC),
        ClassRule("node", "", True, "VM to VM between zones of a region: $0.01/GiB egress",
                  GCP_VPC),
        ClassRule("cidr", "", True, "a VM or managed service in another zone: priced as VM to VM "
                  "between zones", GCP_VPC, sure=False),
        ClassRule("load-balancer", "", True, "a pod's traffic with a load balancer's address in "
                  "another zone: priced as VM to VM between zones", GCP_VPC, sure=False),
        ClassRule("load-balancer", "gcp-lb", False, "proxy load balancer to its backends: billed "
                  "as load-balancer data processing per GiB, not as inter-zone transfer",
                  GCP_LB, sure=False),
        ClassRule("load-balancer", "aws-alb", True, "an AWS load balancer type on GCP: priced as "
                  "ordinary inter-zone transfer", GCP_VPC, sure=False),
        ClassRule("load-balancer", "aws-nlb", True, "an AWS load balancer type on GCP: priced as "
                  "ordinary inter-zone transfer", GCP_VPC, sure=False),
        ClassRule("load-balancer", "aws-clb", True, "an AWS load balancer type on GCP: priced as "
                  "ordinary inter-zone transfer", GCP_VPC, sure=False),
        ClassRule("load-balancer", "azure-lb", True, "an Azure load balancer type on GCP: priced "
                  "as ordinary inter-zone transfer", GCP_VPC, sure=False),
        ClassRule("load-balancer", "other", True, "a load balancer without a rule: priced as "
                  "ordinary inter-zone transfer", GCP_VPC, sure=False),
        ClassRule("external", "", False, _EXTERNAL_WHY, GCP_VPC),
        ClassRule("unknown", "", True, "class unknown (a client that resolved to nothing, or "
                  "bytes counted before client classes): priced as inter-zone transfer",
                  GCP_VPC, sure=False),
        ClassRule("", "", True, _NO_CLASS_WHY, GCP_VPC),
    ]),
    "azure": _rules("azure", [
        *(ClassRule(k, "", False, "Azure does not bill data transfer between availability zones",
                    AZURE_BANDWIDTH, sure=False)
          for k in ("pod", "node", "cidr", "unknown", "")),
        *(ClassRule("load-balancer", t, False, "Azure does not bill data transfer between "
                    "availability zones (Standard Load Balancer bills rules and data processed)",
                    AZURE_BANDWIDTH, sure=False) for t in ("", *LB_TYPES)),
        ClassRule("external", "", False, _EXTERNAL_WHY, AZURE_BANDWIDTH),
    ]),
}


#: each load balancer type's own cloud
_OWN_CLOUD = {"aws-alb": "aws", "aws-nlb": "aws", "aws-clb": "aws", "gcp-lb": "gcp",
              "azure-lb": "azure"}
#: the ``lb_type`` values whose own cloud does not bill the hop to their targets: the shipped
#: cost recording rule and dashboard panels leave them out (``lb_type!~"..."``,
#: deploy/daemonset/monitoring; a unit test keeps them equal)
UNBILLED_LB_TYPES: tuple[str, ...] = tuple(
    t for t in LB_TYPES if t in _OWN_CLOUD
    and not CLASS_RULES[_OWN_CLOUD[t]][("load-balancer", t)].billed)


@dataclass(frozen=True, slots=True)
class Price:
    """A cross-zone price.

    Attributes:
        name: ``aws``, ``gcp``, ``azure`` or ``custom``.
        usd_per_gb_crossing: USD per 10^9 bytes that cross a zone boundary (both sides).
    """

    name: str
    usd_per_gb_crossing: float

    def usd_per_month(self, bytes_per_second: float) -> float:
        """USD a month (30.44 days: :data:`SECONDS_PER_MONTH`) for a steady ``bytes_per_second``
        of billed cross-zone traffic."""
        return bytes_per_second * SECONDS_PER_MONTH / BYTES_PER_GB * self.usd_per_gb_crossing

    def rule(self, client_kind: str, lb_type: str = "") -> ClassRule:
        """How this price's cloud bills a cross-zone byte of a client class.

        Args:
            client_kind: the series' ``client_kind`` (or a workload row's ``remote_kind``);
                ``""`` when the series has none (an older agent).
            lb_type: its ``lb_type`` (only read for ``load-balancer``).

        Returns:
            the rule of :data:`CLASS_RULES`; for a ``custom`` price every class but
            ``external`` is billed (a number says nothing about a cloud's exceptions); an
            unknown class or type is billed, with a reason saying so (never silently $0).
        """
        kind = client_kind or ""
        typ = (lb_type or "") if kind == "load-balancer" else ""
        if self.name not in CLASS_RULES:
            if kind == "external":
                return ClassRule(kind, typ, False, _EXTERNAL_WHY, "")
            return ClassRule(kind, typ, True, f"custom price: every class billed at "
                             f"${self.usd_per_gb_crossing:g} per GB crossing", "")
        rule = CLASS_RULES[self.name].get((kind, typ))
        if rule is None:
            return ClassRule(kind, typ, True, f"no {self.name} rule for class {kind!r}"
                             + (f" type {typ!r}" if typ else "") + ": priced as inter-zone",
                             "", sure=False)
        return rule

    def billed(self, client_kind: str, lb_type: str = "") -> bool:
        """Whether a cross-zone byte of this class costs :attr:`usd_per_gb_crossing`
        (:meth:`rule`)."""
        return self.rule(client_kind, lb_type).billed

    def describe(self) -> str:
        """One line stating the price and how it was derived."""
        if self.name == "aws":
            return "aws: $0.01/GB on each side = $0.02 per GB crossing zones"
        if self.name == "gcp":
            return "gcp: $0.01 per GB crossing zones (charged once)"
        if self.name == "azure":
            return "azure: $0 per GB crossing zones (not billed)"
        return f"custom: ${self.usd_per_gb_crossing:g} per GB crossing zones"


def parse_price(text: str) -> Price:
    """Parse ``--price``: ``aws``, ``gcp``, ``azure`` or a non-negative USD per GB number.

    Raises:
        InputError: unknown name, negative or non-finite number.
    """
    key = text.strip().lower()
    if key in NAMED_PRICES:
        return Price(key, NAMED_PRICES[key])
    try:
        value = float(key.lstrip("$"))
    except ValueError:
        raise InputError(f"unknown price {text!r} (use aws, gcp, azure or USD per GB, e.g. 0.02)",
                         source="--price") from None
    if not math.isfinite(value) or value < 0:
        raise InputError(f"price {text!r} must be a non-negative number of USD per GB",
                         source="--price")
    return Price("custom", value)
