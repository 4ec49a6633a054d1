"""tools.lab.groundtruth: the outside peers' client-side counters (render and parse)."""

from __future__ import annotations

import ipaddress
import json

from tools.lab import groundtruth


def test_client_table_leaves_out_the_peers_own_server_ports() -> None:
    text = groundtruth.render_client([("TCP", 5432)])
    assert text.startswith("table inet zmgc\ndelete table inet zmgc\n")
    assert "update @out4 { ip daddr . th dport }" in text and "update @in6 { ip6 saddr . th sport }" in text
    assert text.count("th sport != { 5432 }") == 2 and text.count("th dport != { 5432 }") == 2
    # a load balancer serves nothing: every packet it sends or receives counts
    assert "!=" not in groundtruth.render_client([])
    assert groundtruth.render_client_reset().count("flush set inet zmgc") == 4


def test_client_counters_parse_per_remote_address_and_port() -> None:
    doc = {"nftables": [
        {"set": {"name": "out4", "elem": [{"elem": {"val": {"concat": ["192.168.100.4", 30080]},
                                                    "counter": {"packets": 6, "bytes": 700}}}]}},
        {"set": {"name": "in6", "elem": [{"elem": {"val": {"concat": ["fd00:100::4", 30080]},
                                                   "counter": {"packets": 5, "bytes": 3300}}}]}},
        {"set": {"name": "req4", "elem": []}},  # another table's set: not ours
    ]}
    assert groundtruth.parse_client(json.dumps(doc)) == {
        (ipaddress.ip_address("192.168.100.4"), 30080, "request"): (700, 6),
        (ipaddress.ip_address("fd00:100::4"), 30080, "response"): (3300, 5)}
