"""agent.k8s.cidrs: the --zone-cidrs file (CSV and YAML), its errors, prefix matching."""

from __future__ import annotations

import ipaddress

import pytest

from agent.errors import InputError
from agent.k8s.cidrs import PrefixTable, ZoneCidr, load_zone_cidrs, parse_zone_cidrs

net = ipaddress.ip_network


def test_csv_with_header_comments_and_optional_region() -> None:
    text = "cidr,zone,region\n# managed databases\n10.20.0.0/16, us-east-1a ,us-east-1\n\n2001:db8::/32,us-east-1b\n"
    assert parse_zone_cidrs(text, "z.csv") == (
        ZoneCidr(net("10.20.0.0/16"), "us-east-1a", "us-east-1"),
        ZoneCidr(net("2001:db8::/32"), "us-east-1b", None),
    )


def test_load_balancer_ranges_csv_and_yaml_v4_and_v6() -> None:
    csv_text = ("cidr,zone,region,kind,type\n"
                "10.20.1.0/28,us-east-1a,us-east-1,load-balancer,aws-alb\n"
                "2600:1f18:1::/64,us-east-1b,,load-balancer,AWS-NLB\n"   # case folded
                "10.20.9.0/24,us-east-1b,us-east-1,,aws-clb\n"           # type implies the kind
                "10.30.0.0/16,us-east-1c,us-east-1,cidr\n")
    yaml_text = ("- {cidr: 10.20.1.0/28, zone: us-east-1a, region: us-east-1, kind: load-balancer,"
                 " type: aws-alb}\n"
                 "- {cidr: '2600:1f18:1::/64', zone: us-east-1b, kind: load-balancer, type: aws-nlb}\n"
                 "- {cidr: 10.20.9.0/24, zone: us-east-1b, region: us-east-1, type: aws-clb}\n"
                 "- {cidr: 10.30.0.0/16, zone: us-east-1c, region: us-east-1, kind: cidr}\n")
    want = (
        ZoneCidr(net("10.20.1.0/28"), "us-east-1a", "us-east-1", "load-balancer", "aws-alb"),
        ZoneCidr(net("2600:1f18:1::/64"), "us-east-1b", None, "load-balancer", "aws-nlb"),
        ZoneCidr(net("10.20.9.0/24"), "us-east-1b", "us-east-1", "load-balancer", "aws-clb"),
        ZoneCidr(net("10.30.0.0/16"), "us-east-1c", "us-east-1", "cidr", None),
    )
    assert parse_zone_cidrs(csv_text, "z.csv") == parse_zone_cidrs(yaml_text, "z.yaml") == want


def test_load_balancer_ranges_resolve_to_their_own_kind() -> None:
    from agent.k8s.cache import ClusterMetadata, MetadataSettings
    from agent.records import PeerKind
    cidrs = parse_zone_cidrs("10.20.1.0/28,a,r,load-balancer,gcp-lb\n10.20.0.0/16,b,r\n"
                             "fd00:99::/64,b,r,load-balancer,azure-lb\n", "z.csv")
    cache = ClusterMetadata(MetadataSettings(zone_cidrs=cidrs))
    lb = cache.resolve(ipaddress.ip_address("10.20.1.5"))
    assert (lb.kind, lb.zone, lb.region, lb.lb_type) == (PeerKind.LOAD_BALANCER, "a", "r", "gcp-lb")
    vm = cache.resolve(ipaddress.ip_address("10.20.2.5"))  # the enclosing range: a VM subnet
    assert (vm.kind, vm.zone, vm.lb_type) == (PeerKind.CIDR, "b", None)
    lb6 = cache.resolve(ipaddress.ip_address("fd00:99::7"))
    assert (lb6.kind, lb6.zone, lb6.lb_type) == (PeerKind.LOAD_BALANCER, "b", "azure-lb")


def test_yaml_list_and_cidrs_key() -> None:
    a = parse_zone_cidrs("- {cidr: 10.1.0.0/16, zone: a, region: r}\n- cidr: 10.2.0.0/16\n  zone: b\n")
    b = parse_zone_cidrs("cidrs:\n  - {cidr: 10.1.0.0/16, zone: a, region: r}\n  - {cidr: 10.2.0.0/16, zone: b}\n")
    assert a == b == (ZoneCidr(net("10.1.0.0/16"), "a", "r"), ZoneCidr(net("10.2.0.0/16"), "b", None))


@pytest.mark.parametrize("text, message", [
    ("10.0.0.0/8,a\n10.0.0.1/8,b\n", "z: line 2: cidr: not a network: 10.0.0.1/8 has host bits set"),
    ("10.0.0.0/8,a\nbogus,b\n", "z: line 2: cidr: not a network"),
    ("10.0.0.0/8\n", "z: line 1: zone: missing"),
    ("10.0.0.0/8, ,r\n", "z: line 1: zone: missing or not a string"),
    ("10.0.0.0/8,a,r,load-balancer,aws-alb,x\n", "z: line 1: expected at most 5 fields"),
    ("10.0.0.0/8,a,r,x\n", "z: line 1: kind: unknown kind 'x' (expected cidr or load-balancer)"),
    ("10.0.0.0/8,a,r,load-balancer\n", "z: line 1: type: missing: a load-balancer range needs its type"),
    ("10.0.0.0/8,a,r,cidr,aws-alb\n", "z: line 1: type: a type ('aws-alb') is only for kind load-balancer"),
    ("10.0.0.0/8,a,,,aws-elb\n", "z: line 1: type: unknown load balancer type 'aws-elb'"),
    ("- {cidr: 10.0.0.0/8, zone: a}\n- {cidr: 10.1.0.0/16, zone: b, kind: load-balancer}\n",
     "z: line 2: type: missing: a load-balancer range needs its type"),
    ("- {cidr: 10.0.0.0/8, zone: a, kind: lb, type: aws-nlb}\n", "z: line 1: kind: unknown kind 'lb'"),
    ("- {cidr: 10.0.0.0/8, zone: a, type: [aws-nlb]}\n", "z: line 1: type: not a string"),
    ("- {cidr: 10.0.0.0/8, zone: a, type: aws-nlb, type: aws-alb}\n", "z: line 1: type: given twice"),
    ("- {cidr: 10.0.0.0/8, zone: a}\n- {cidr: 10.0.0.0/33, zone: b}\n", "z: line 2: cidr: not a network"),
    ("- {cidr: 10.0.0.0/8}\n", "z: line 1: zone: missing"),
    ("- {cidr: 10.0.0.0/8, zone: [a]}\n", "z: line 1: zone: missing or not a string"),
    ("- {cidr: 10.0.0.0/8, zone: a}\n- {cidr: 10.1.0.0/16, zone: b, colour: red}\n",
     "z: line 2: colour: unknown field"),
    ("- {cidr: 10.0.0.0/8, zone: 3}\n", "z: line 1: zone: missing or not a string"),
    ("- [10.0.0.0/8, a]\n", "z: line 1: expected a mapping"),
    ("- {cidr: 10.0.0.0/8, zone: a\n", "z: line 2: invalid YAML"),
])
def test_errors_name_line_and_field(text: str, message: str) -> None:
    with pytest.raises(InputError) as info:
        parse_zone_cidrs(text, "z")
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_load_missing_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InputError, match="cannot read"):
        load_zone_cidrs(tmp_path / "nope.csv")
    (tmp_path / "ok.csv").write_text("10.0.0.0/8,a\n")
    assert load_zone_cidrs(tmp_path / "ok.csv")[0].zone == "a"


def test_prefix_table_longest_match_v4_v6() -> None:
    t: PrefixTable[str] = PrefixTable([(net("10.0.0.0/8"), "wide"), (net("10.1.0.0/16"), "narrow"),
                                       (net("0.0.0.0/0"), "default"), (net("fd00::/8"), "ula")])
    assert t.lookup(ipaddress.ip_address("10.1.2.3")) == "narrow"
    assert t.lookup(ipaddress.ip_address("10.2.2.3")) == "wide"
    assert t.lookup(ipaddress.ip_address("11.0.0.1")) == "default"
    assert t.lookup(ipaddress.ip_address("fd12::1")) == "ula"
    assert t.lookup(ipaddress.ip_address("2001:db8::1")) is None  # /0 is IPv4 only
    assert len(t) == 4


def test_prefix_table_remove() -> None:
    t: PrefixTable[str] = PrefixTable([(net("10.0.0.0/8"), "wide"), (net("10.1.0.0/16"), "narrow")])
    t.remove(net("10.1.0.0/16"))
    t.remove(net("192.168.0.0/16"))  # absent: no error
    assert t.lookup(ipaddress.ip_address("10.1.2.3")) == "wide"
    assert len(t) == 1
