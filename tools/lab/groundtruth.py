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

An outside peer (a load balancer, a database) also gets a table ``inet zmgc`` that counts
what it sends and receives **as a client** (:func:`render_client`): packets leaving it to,
and entering it from, each (remote address, remote port), its own server ports left out.
That is the hop between the peer and the node or pod it calls, seen from the peer's side:
the first hop of a node port, which the server's table never sees (the node masquerades).

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


#: the outside peers' client-side counting table
CLIENT_TABLE = "zmgc"


def render_client(server_ports: Iterable[tuple[str, int]]) -> str:
    """Return ``nft -f`` input creating an outside peer's client-side counting table
    (:data:`CLIENT_TABLE`): sets keyed by (remote address, remote port) with a counter,
    ``out4``/``out6`` for TCP and UDP packets leaving the peer (hook ``output``: its
    requests), ``in4``/``in6`` for those entering it (hook ``input``: the answers), except
    packets from or to the peer's own server ports (``server_ports``, ``(protocol, port)``).
    """
    mine = sorted({port for _, port in server_ports})
    skip_out = f"th sport != {{ {', '.join(map(str, mine))} }} " if mine else ""
    skip_in = f"th dport != {{ {', '.join(map(str, mine))} }} " if mine else ""
    lines = [f"table inet {CLIENT_TABLE} {{"]
    for name, kind in (("out4", "ipv4_addr"), ("in4", "ipv4_addr"), ("out6", "ipv6_addr"),
                       ("in6", "ipv6_addr")):
        lines.append(f"  set {name} {{ type {kind} . inet_service; size 65535; flags dynamic; counter; }}")
    lines.append(f"  chain output {{ type filter hook output priority {PRIORITY}; policy accept;")
    for fam, sel in (("4", "ip"), ("6", "ip6")):
        lines.append(f"    meta nfproto ipv{fam} meta l4proto {{ tcp, udp }} {skip_out}"
                     f"update @out{fam} {{ {sel} daddr . th dport }}")
    lines.append("  }")
    lines.append(f"  chain input {{ type filter hook input priority {PRIORITY}; policy accept;")
    for fam, sel in (("4", "ip"), ("6", "ip6")):
        lines.append(f"    meta nfproto ipv{fam} meta l4proto {{ tcp, udp }} {skip_in}"
                     f"update @in{fam} {{ {sel} saddr . th sport }}")
    lines.append("  }")
    lines.append("}")
    return (f"table inet {CLIENT_TABLE}\ndelete table inet {CLIENT_TABLE}\n" + "\n".join(lines)
            + "\n")


def render_client_reset() -> str:
    """Return ``nft -f`` input that zeroes an outside peer's client-side counters."""
    return "".join(f"flush set inet {CLIENT_TABLE} {s}\n" for s in ("out4", "in4", "out6", "in6"))


def parse_client(nft_json: str) -> dict[tuple[IPAddress, int, str], tuple[int, int]]:
    """Parse ``nft -j list table inet zmgc`` output (:func:`render_client`).

    Returns:
        ``{(remote address, remote port, "request"|"response"): (L3 bytes, packets)}``:
        request = sent by the peer, response = received by it.
    """
    out: dict[tuple[IPAddress, int, str], tuple[int, int]] = {}
    doc = json.loads(nft_json)
    for item in doc.get("nftables", []):
        s = item.get("set")
        if not s or s.get("name") not in ("out4", "in4", "out6", "in6"):
            continue
        direction = "request" if s["name"].startswith("out") else "response"
        for elem in s.get("elem", []):
            e = elem.get("elem", elem) if isinstance(elem, Mapping) else None
            if not isinstance(e, Mapping):
                continue
            val = e.get("val")
            concat = val.get("concat") if isinstance(val, Mapping) else None
            if not isinstance(concat, list) or len(concat) != 2:
                continue
            counter = e.get("counter") or {}
            key = (ipaddress.ip_address(concat[0]), int(concat[1]), direction)
            b, p = out.get(key, (0, 0))
            out[key] = (b + int(counter.get("bytes", 0)), p + int(counter.get("packets", 0)))
    return out


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
