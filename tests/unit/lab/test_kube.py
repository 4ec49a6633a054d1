# ruff: noqa: E501, E101 - the rule texts are verbatim copies of what kube-proxy wrote (tabs as nft prints)
"""Reading back what a node's proxy programmed (tools/lab/kube.py ``programmed_endpoints``), from
the lab's own emulation and from rules the real kube-proxy 1.37 wrote in a lab node (iptables and
nftables modes, trimmed copies), and the lab's choice of Kubernetes mode."""

from __future__ import annotations

import ipaddress

import pytest

from agent.errors import InputError
from tools.lab import Lab, kubeproxy
from tools.lab.examples import DEFAULT_TOPOLOGY
from tools.lab.kube import _parse_iptables, _parse_nft
from tools.lab.topology import Topology

IP = ipaddress.ip_address

#: kube-proxy v1.37.2, iptables mode, node b1 of the default topology with shop/web-auto (Auto)
REAL_IPTABLES = """\
*nat
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "shop/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-67NZLRHBNDSAWJRO
-A KUBE-SERVICES -d 10.96.0.11/32 -p tcp -m comment --comment "shop/web-auto:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-FQ4H7S7XOKZ4HW6Z
-A KUBE-SVC-67NZLRHBNDSAWJRO ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m comment --comment "shop/web:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-67NZLRHBNDSAWJRO -m comment --comment "shop/web:http -> 10.244.1.3:8080" -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-CACHYPJ5WX3OY2BV
-A KUBE-SVC-67NZLRHBNDSAWJRO -m comment --comment "shop/web:http -> 10.244.2.3:8080" -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-AAAAAAAAAAAAAAAA
-A KUBE-SVC-67NZLRHBNDSAWJRO -m comment --comment "shop/web:http -> 10.244.3.3:8080" -j KUBE-SEP-WLKAO6SOUZTWPUMO
-A KUBE-SVC-FQ4H7S7XOKZ4HW6Z ! -s 10.244.0.0/16 -d 10.96.0.11/32 -p tcp -m comment --comment "shop/web-auto:http cluster IP" -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-FQ4H7S7XOKZ4HW6Z -m comment --comment "shop/web-auto:http -> 10.244.3.3:8080" -j KUBE-SEP-BBBBBBBBBBBBBBBB
-A KUBE-SEP-WLKAO6SOUZTWPUMO -p tcp -m comment --comment "shop/web:http" -m tcp -j DNAT --to-destination 10.244.3.3:8080
COMMIT
*filter
:KUBE-SERVICES - [0:0]
-A KUBE-SERVICES -d 10.96.0.12/32 -p tcp -m comment --comment "shop/none:http has no endpoints" -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable
COMMIT
"""

#: kube-proxy v1.37.2, nftables mode, node a1 (zone-a) with shop/web annotated Auto
REAL_NFT = """\
table ip kube-proxy {
	map no-endpoint-services {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.12 . tcp . 80 comment "shop/none:http" : goto reject-chain }
	}
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { 10.96.0.10 . udp . 53 : goto service-MLGBEHPS-shop/web/udp/dns,
			     10.96.0.10 . tcp . 80 : goto service-KHN6ECMT-shop/web/tcp/http,
			     10.96.0.1 . tcp . 443 : goto service-2QRHZV4L-default/kubernetes/tcp/https }
	}
	chain service-MLGBEHPS-shop/web/udp/dns {
		meta l4proto udp dnat ip to numgen random mod 2 map { 0 : 10.244.1.3 . 5353, 1 : 10.244.2.3 . 5353 }
	}
	chain service-2QRHZV4L-default/kubernetes/tcp/https {
		meta l4proto tcp dnat to 192.168.100.254:6443
	}
	chain service-KHN6ECMT-shop/web/tcp/http {
		ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
		meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.3 . 8080, 1 : 10.244.2.3 . 8080 }
	}
}
"""


#: kube-proxy v1.37.2, nftables mode, dual stack (lab --ipv6): both tables name their chains alike
REAL_NFT_DUAL = """\
table ip kube-proxy {
	map service-ips {
		type ipv4_addr . inet_proto . inet_service : verdict
		elements = { 10.96.0.10 . tcp . 80 : goto service-KHN6ECMT-shop/web/tcp/http }
	}
	chain service-KHN6ECMT-shop/web/tcp/http {
		meta l4proto tcp dnat ip to numgen random mod 2 map { 0 : 10.244.1.3 . 8080, 1 : 10.244.3.3 . 8080 }
	}
}
table ip6 kube-proxy {
	map service-ips {
		type ipv6_addr . inet_proto . inet_service : verdict
		comment "ClusterIP, ExternalIP and LoadBalancer IP traffic"
		elements = { fd00:96::a . tcp . 80 : goto service-KHN6ECMT-shop/web/tcp/http }
	}
	chain service-KHN6ECMT-shop/web/tcp/http {
		meta l4proto tcp dnat ip6 to numgen random mod 3 map { 0 : fd00:244:0:1::3 . 8080, 1 : fd00:244:0:2::3 . 8080, 2 : fd00:244:0:3::3 . 8080 }
	}
}
"""


def test_real_iptables_rules_read_back() -> None:
    assert _parse_iptables(REAL_IPTABLES) == {
        ("10.96.0.10", "TCP", 80): ["10.244.1.3:8080", "10.244.2.3:8080", "10.244.3.3:8080"],
        ("10.96.0.11", "TCP", 80): ["10.244.3.3:8080"],
        ("10.96.0.12", "TCP", 80): [],
    }


def test_real_nftables_rules_read_back() -> None:
    assert _parse_nft(REAL_NFT) == {
        ("10.96.0.10", "UDP", 53): ["10.244.1.3:5353", "10.244.2.3:5353"],
        ("10.96.0.10", "TCP", 80): ["10.244.1.3:8080", "10.244.2.3:8080"],
        ("10.96.0.1", "TCP", 443): ["192.168.100.254:6443"],
        ("10.96.0.12", "TCP", 80): [],
    }


def test_dual_stack_nftables_keeps_the_families_apart() -> None:
    assert _parse_nft(REAL_NFT_DUAL) == {
        ("10.96.0.10", "TCP", 80): ["10.244.1.3:8080", "10.244.3.3:8080"],
        ("fd00:96::a", "TCP", 80): ["[fd00:244:0:1::3]:8080", "[fd00:244:0:2::3]:8080", "[fd00:244:0:3::3]:8080"],
    }


def test_the_emulations_rules_read_back_as_rendered() -> None:
    rules = [
        kubeproxy.ProxyRule("shop/web", "http", IP("10.96.0.10"), 80, "TCP",
                            ((IP("10.244.1.3"), 8080), (IP("10.244.3.3"), 8080))),
        kubeproxy.ProxyRule("shop/one", "", IP("10.96.0.11"), 53, "UDP", ((IP("10.244.2.3"), 5353),)),
        kubeproxy.ProxyRule("shop/local", "", IP("10.96.0.12"), 80, "TCP", (), local_policy=True),
        kubeproxy.ProxyRule("shop/none", "", IP("10.96.0.13"), 80, "TCP", ()),
    ]
    assert _parse_iptables(kubeproxy.render(rules, 4)) == {
        ("10.96.0.10", "TCP", 80): ["10.244.1.3:8080", "10.244.3.3:8080"],
        ("10.96.0.11", "UDP", 53): ["10.244.2.3:5353"],
        ("10.96.0.12", "TCP", 80): [],
        ("10.96.0.13", "TCP", 80): [],
    }


def test_kubernetes_mode_is_checked_and_real_adds_the_control_plane_namespace() -> None:
    topo = Topology.from_yaml(DEFAULT_TOPOLOGY)
    with pytest.raises(InputError, match="kubernetes 'kind'"):
        Lab(topo, prefix="zmk", kubernetes="kind")
    with pytest.raises(InputError, match="kube-proxy mode 'ipvs'"):
        Lab(topo, prefix="zmk", kubernetes="real", proxy_mode="ipvs")
    assert "zmk-cp" not in Lab(topo, prefix="zmk").all_netns()
    real = Lab(topo, prefix="zmk", kubernetes="real")
    assert real.all_netns()[-1] == "zmk-cp"
    assert str(real.kube_address) == "192.168.100.254"  # last host of options.node_cidr, no node's
    assert [n.name for n in topo.nodes if real.uses_kube_proxy(n.name)] == ["a1", "a2", "b1"]
    assert not any(Lab(topo, prefix="zmk").uses_kube_proxy(n.name) for n in topo.nodes)
