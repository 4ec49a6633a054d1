"""Ground-truth byte counters of the lab, without eBPF: nftables sets with counters.

Each server pod's namespace (its node's namespace for a host-network pod) gets a table
``inet zmgt_<pod index>`` with four dynamic sets keyed by the peer address, each element
carrying its own counter:

* ``req4``/``req6``: packets entering the pod (hook ``input``) to one of its listening
  ports (``tcp dport``/``udp dport``), keyed by source address: **request** bytes of that
  client.
* ``resp4``/``resp6``: packets leaving the pod (hook ``output``) from one of its listening
  ports, keyed by destination address: **response** bytes to that client.

The counters add ``skb->len`` at the IP layer, so they count L3 bytes, IP header included,
of every packet of the exchange (TCP handshake, ACKs, FIN, retransmissions; UDP datagrams
with their 8-byte header). They equal wire bytes because the lab turns TSO, GSO and GRO
off and ``gso_max_segs`` to 1 on every lab link (one skb is one packet, even at
``output``, where TCP would otherwise hand over GSO super-packets) and keeps UDP datagrams under the MTU (no
fragments, which would be reassembled before ``input``).

Direction is decided by port, not by connection state: a packet to a listening port is a
request. That holds because clients' ephemeral ports (32768-60999, the kernel default)
never equal a server port: the topology refuses pod ports in that range.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable, Mapping

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: nftables hook priority of the counting chains: before conntrack and NAT, as "raw"
PRIORITY = -300


def table_name(pod_index: int) -> str:
    """Return the nftables table name of the pod with topology index ``pod_index``."""
    return f"zmgt_{pod_index}"


def render(pod_index: int, ports: Iterable[tuple[str, int]]) -> str:
    """Return ``nft -f`` input creating the counting table for one server pod.

    Args:
        pod_index: the pod's topology index (names the table).
        ports: ``(protocol "TCP"|"UDP", port)`` the pod listens on.
    """
    by_proto: dict[str, list[int]] = {}
    for proto, port in ports:
        by_proto.setdefault(proto.lower(), []).append(port)
    table = table_name(pod_index)
    lines = [f"table inet {table} {{"]
    for name, kind in (("req4", "ipv4_addr"), ("resp4", "ipv4_addr"), ("req6", "ipv6_addr"),
                       ("resp6", "ipv6_addr")):
        lines.append(f"  set {name} {{ type {kind}; size 65535; flags dynamic; counter; }}")
    lines.append(f"  chain input {{ type filter hook input priority {PRIORITY}; policy accept;")
    for proto, plist in sorted(by_proto.items()):
        pset = ", ".join(str(p) for p in sorted(plist))
        lines.append(f"    meta nfproto ipv4 {proto} dport {{ {pset} }} update @req4 {{ ip saddr }}")
        lines.append(f"    meta nfproto ipv6 {proto} dport {{ {pset} }} update @req6 {{ ip6 saddr }}")
    lines.append("  }")
    lines.append(f"  chain output {{ type filter hook output priority {PRIORITY}; policy accept;")
    for proto, plist in sorted(by_proto.items()):
        pset = ", ".join(str(p) for p in sorted(plist))
        lines.append(f"    meta nfproto ipv4 {proto} sport {{ {pset} }} update @resp4 {{ ip daddr }}")
        lines.append(f"    meta nfproto ipv6 {proto} sport {{ {pset} }} update @resp6 {{ ip6 daddr }}")
    lines.append("  }")
    lines.append("}")
    # delete first so re-applying is idempotent
    return f"table inet {table}\ndelete table inet {table}\n" + "\n".join(lines) + "\n"


def render_reset(pod_index: int) -> str:
    """Return ``nft -f`` input that zeroes one pod's counters (flushes the sets)."""
    table = table_name(pod_index)
    return "".join(f"flush set inet {table} {s}\n" for s in ("req4", "resp4", "req6", "resp6"))


def parse(nft_json: str) -> dict[tuple[IPAddress, str], tuple[int, int]]:
    """Parse ``nft -j list table inet zmgt_N`` output.

    Returns:
        ``{(peer address, "request"|"response"): (L3 bytes, packets)}``.
    """
    out: dict[tuple[IPAddress, str], tuple[int, int]] = {}
    doc = json.loads(nft_json)
    for item in doc.get("nftables", []):
        s = item.get("set")
        if not s or s.get("name") not in ("req4", "resp4", "req6", "resp6"):
            continue
        direction = "request" if s["name"].startswith("req") else "response"
        for elem in s.get("elem", []):
            e = elem.get("elem", elem) if isinstance(elem, Mapping) else None
            if not isinstance(e, Mapping):
                continue  # an element without a counter cannot occur with "counter" sets
            counter = e.get("counter") or {}
            addr = ipaddress.ip_address(e["val"])
            b, p = out.get((addr, direction), (0, 0))
            out[(addr, direction)] = (b + int(counter.get("bytes", 0)),
                                      p + int(counter.get("packets", 0)))
    return out
