"""kube-proxy emulation: the iptables rules one lab node programs for ClusterIPs.

The rules follow kube-proxy's iptables mode (``pkg/proxy/iptables/proxier.go``,
``syncProxyRules``), reduced to ClusterIP traffic:

* ``nat``: ``PREROUTING`` (traffic from pods on this node) and ``OUTPUT`` (host-network
  clients) jump to ``KUBE-SERVICES``; one rule per ClusterIP:port jumps to a
  ``KUBE-SVC-*`` chain that picks an endpoint at random with ``statistic --mode random``
  rules of probability ``1/(n-i)`` for the i-th of n endpoints (the last one takes the
  rest), each jumping to a ``KUBE-SEP-*`` chain that DNATs to ``ip:port``.
* ``filter``: ``INPUT``, ``FORWARD`` and ``OUTPUT`` send new connections to
  ``KUBE-SERVICES``, which DROPs a ClusterIP:port that has no usable endpoint when its
  ``internalTrafficPolicy`` is ``Local`` (comment "has no local endpoints") and REJECTs it
  otherwise ("has no endpoints"), as kube-proxy does.
* No masquerade: the lab never SNATs, so servers see real client pod addresses. The one
  case where kube-proxy would masquerade, a pod reaching itself through its own Service
  (hairpin), therefore does not work in the lab.

Chain names hash ``namespace/name:port/protocol`` like kube-proxy's
``servicePortChainName`` (SHA-256, base32, 16 characters), so they read the same.
"""

from __future__ import annotations

import base64
import hashlib
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class ProxyRule:
    """What one node's proxy does with one ClusterIP:port.

    Attributes:
        service: ``namespace/name``.
        port_name: Service port name or ``""``.
        cluster_ip: the ClusterIP (of the family being rendered).
        port: Service port (host byte order).
        protocol: ``TCP`` or ``UDP``.
        endpoints: ``(address, target port)`` this node may pick from, in order; empty
            means DROP (``local_policy``) or REJECT.
        local_policy: ``internalTrafficPolicy: Local``.
    """

    service: str
    port_name: str
    cluster_ip: IPAddress
    port: int
    protocol: str
    endpoints: tuple[tuple[IPAddress, int], ...]
    local_policy: bool = False


def _hash(text: str) -> str:
    digest = hashlib.sha256(text.encode()).digest()
    return base64.b32encode(digest).decode()[:16]


def chain_names(rule: ProxyRule) -> tuple[str, list[str]]:
    """Return ``(KUBE-SVC-* name, [KUBE-SEP-* names per endpoint])`` for ``rule``."""
    spn = f"{rule.service}:{rule.port_name}"
    svc = "KUBE-SVC-" + _hash(spn + rule.protocol.lower())
    seps = ["KUBE-SEP-" + _hash(spn + rule.protocol.lower() + f"{ip}:{port}")
            for ip, port in rule.endpoints]
    return svc, seps


def _addr(ip: IPAddress) -> str:
    return f"{ip}/{ip.max_prefixlen}"


def _dnat(ip: IPAddress, port: int) -> str:
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def render(rules: Sequence[ProxyRule], family: int) -> str:
    """Return ``iptables-restore`` input (family 4) or ``ip6tables-restore`` input (6).

    The text replaces the ``nat`` and ``filter`` tables of the node namespace entirely
    (the lab owns that namespace). ``rules`` of the other family are skipped.
    """
    nat: list[str] = ["*nat", ":PREROUTING ACCEPT [0:0]", ":INPUT ACCEPT [0:0]",
                      ":OUTPUT ACCEPT [0:0]", ":POSTROUTING ACCEPT [0:0]",
                      ":KUBE-SERVICES - [0:0]"]
    nat_rules: list[str] = ["-A PREROUTING -m comment --comment \"kubernetes service portals\" "
                            "-j KUBE-SERVICES",
                            "-A OUTPUT -m comment --comment \"kubernetes service portals\" "
                            "-j KUBE-SERVICES"]
    flt: list[str] = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]",
                      ":OUTPUT ACCEPT [0:0]", ":KUBE-SERVICES - [0:0]"]
    flt_rules: list[str] = [
        f"-A {hook} -m conntrack --ctstate NEW -m comment --comment \"kubernetes service "
        f"portals\" -j KUBE-SERVICES" for hook in ("INPUT", "FORWARD", "OUTPUT")]
    reject = "REJECT --reject-with " + ("icmp-port-unreachable" if family == 4
                                         else "icmp6-port-unreachable")
    for rule in rules:
        if rule.cluster_ip.version != family:
            continue
        proto = rule.protocol.lower()
        name = f"{rule.service}:{rule.port_name}" if rule.port_name else rule.service
        match = f"-d {_addr(rule.cluster_ip)} -p {proto} -m {proto} --dport {rule.port}"
        if not rule.endpoints:
            target, why = ("DROP", "has no local endpoints") if rule.local_policy else \
                (reject, "has no endpoints")
            flt_rules.append(f"-A KUBE-SERVICES {match} -m comment --comment "
                             f"\"{name} {why}\" -j {target}")
            continue
        svc, seps = chain_names(rule)
        nat.append(f":{svc} - [0:0]")
        nat_rules.append(f"-A KUBE-SERVICES {match} -m comment --comment \"{name} cluster IP\" "
                         f"-j {svc}")
        n = len(rule.endpoints)
        for i, ((ip, port), sep) in enumerate(zip(rule.endpoints, seps, strict=True)):
            nat.append(f":{sep} - [0:0]")
            comment = f"-m comment --comment \"{name} -> {_dnat(ip, port)}\""
            if i < n - 1:
                nat_rules.append(f"-A {svc} {comment} -m statistic --mode random "
                                 f"--probability {1.0 / (n - i):0.10f} -j {sep}")
            else:
                nat_rules.append(f"-A {svc} {comment} -j {sep}")
            nat_rules.append(f"-A {sep} -p {proto} -m {proto} -j DNAT --to-destination "
                             f"{_dnat(ip, port)}")
    return "\n".join(nat + nat_rules + ["COMMIT"] + flt + flt_rules + ["COMMIT", ""])
