"""hostPort in the lab: the DNAT the CNI's portmap plugin installs, as one nftables table per node.

A pod port with ``hostPort`` is reachable on its node's addresses: a connection to
``node address:hostPort`` is DNATed to ``pod address:port``, the client's address kept (the
plugin masquerades only hairpin and localhost connections, which the lab does not make).
Source: containernetworking/plugins ``plugins/meta/portmap`` (its nftables backend writes a
``cni_hostport`` table with ``fib daddr type local`` matches in ``prerouting`` and ``output``
NAT chains). The table lives in the node's namespace beside the kube-proxy emulation's or the
real kube-proxy's tables and is rewritten whole, so it works in both modes of the lab.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: the table's name (``inet`` family), one per node namespace
TABLE = "zm_hostport"


@dataclass(frozen=True, slots=True)
class HostPort:
    """One ``hostPort``: ``protocol`` TCP|UDP, the node's ``host_port`` and the pod's
    ``address:port`` it leads to (host byte order)."""

    protocol: str
    host_port: int
    address: IPAddress
    port: int


def render(entries: Sequence[HostPort]) -> str:
    """Return ``nft -f`` input that (re)creates :data:`TABLE` with one DNAT rule per entry and
    hook (``prerouting`` for other machines' and pods' connections, ``output`` for the node's
    own), matching destinations of type local (the node's addresses)."""
    rules = []
    for e in entries:
        fam, target = ("ip", f"{e.address}:{e.port}") if e.address.version == 4 else \
            ("ip6", f"[{e.address}]:{e.port}")
        nfproto = "ipv4" if e.address.version == 4 else "ipv6"
        proto = e.protocol.lower()
        rules.append(f"    meta nfproto {nfproto} fib daddr type local {proto} dport {e.host_port} "
                     f"dnat {fam} to {target}")
    body = "\n".join(rules)
    return "\n".join([
        f"table inet {TABLE} {{}}",
        f"delete table inet {TABLE}",
        f"table inet {TABLE} {{",
        "  chain prerouting { type nat hook prerouting priority -100; policy accept;",
        body,
        "  }",
        "  chain output { type nat hook output priority -100; policy accept;",
        body,
        "  }",
        "}",
        "",
    ])
