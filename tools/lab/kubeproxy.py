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
* Node ports (``NodePort`` and ``LoadBalancer`` Services whose ports give ``nodePort``):
  ``KUBE-SERVICES`` ends with a jump to ``KUBE-NODEPORTS`` for destinations of type LOCAL
  (the node's own addresses), which sends each node port to a ``KUBE-EXT-*`` chain. With
  ``externalTrafficPolicy: Cluster`` that chain marks the connection for masquerade
  (``KUBE-MARK-MASQ``) and jumps to the Service's ``KUBE-SVC-*`` chain, the same endpoints
  this node selects for ClusterIP traffic (kube-proxy ``CategorizeEndpoints``: cluster
  endpoints serve both); ``KUBE-POSTROUTING`` masquerades marked packets, so the endpoint
  sees the receiving node's address. With ``Local`` it jumps to a ``KUBE-SVL-*`` chain of
  this node's own endpoints, without masquerade (the client's address is kept), and a node
  without one DROPs the port ("has no local endpoints"). kube-proxy's short-cuts for
  pod-originated node-port traffic under ``Local`` are left out.
* Otherwise no masquerade: ClusterIP traffic keeps the client pod's address. The one case
  where kube-proxy would masquerade it, a pod reaching itself through its own Service
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
        node_port: the port's ``nodePort`` (NodePort and LoadBalancer Services), else None.
        external_local: ``externalTrafficPolicy: Local``.
        local_endpoints: this node's own endpoints (``externalTrafficPolicy: Local``).
    """

    service: str
    port_name: str
    cluster_ip: IPAddress
    port: int
    protocol: str
    endpoints: tuple[tuple[IPAddress, int], ...]
    local_policy: bool = False
    node_port: int | None = None
    external_local: bool = False
    local_endpoints: tuple[tuple[IPAddress, int], ...] = ()


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


def _chain(prefix: str, rule: ProxyRule) -> str:
    """``KUBE-EXT-*``/``KUBE-SVL-*`` of a Service port (kube-proxy ``servicePortChainName``)."""
    return prefix + _hash(f"{rule.service}:{rule.port_name}" + rule.protocol.lower())


def _pick(nat: list[str], nat_rules: list[str], chain: str, name: str, proto: str,
          endpoints: Sequence[tuple[IPAddress, int]], seps: Sequence[str]) -> None:
    """Rules of ``chain`` choosing one of ``endpoints`` at random (``statistic --mode random``,
    probability ``1/(n-i)``), each jumping to its ``KUBE-SEP-*`` (declared once by the caller)."""
    n = len(endpoints)
    for i, ((ip, port), sep) in enumerate(zip(endpoints, seps, strict=True)):
        comment = f"-m comment --comment \"{name} -> {_dnat(ip, port)}\""
        if i < n - 1:
            nat_rules.append(f"-A {chain} {comment} -m statistic --mode random "
                             f"--probability {1.0 / (n - i):0.10f} -j {sep}")
        else:
            nat_rules.append(f"-A {chain} {comment} -j {sep}")


def _addr(ip: IPAddress) -> str:
    return f"{ip}/{ip.max_prefixlen}"


def _dnat(ip: IPAddress, port: int) -> str:
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def render(rules: Sequence[ProxyRule], family: int, local_pods: str | None = None) -> str:
    """Return ``iptables-restore`` input (family 4) or ``ip6tables-restore`` input (6).

    The text replaces the ``nat`` and ``filter`` tables of the node namespace entirely
    (the lab owns that namespace). ``rules`` of the other family are skipped.

    ``local_pods``: an iptables interface name (``<prefix>p+``, the node's host-side pod
    veths): node-port connections marked for masquerade are not masqueraded when they go
    to a pod of this node, so a local endpoint sees the client's own address, as Cilium's
    kube-proxy replacement does in its default SNAT mode (only remote backends are SNATed);
    None: kube-proxy's rule, every marked connection masqueraded.
    """
    nat: list[str] = ["*nat", ":PREROUTING ACCEPT [0:0]", ":INPUT ACCEPT [0:0]",
                      ":OUTPUT ACCEPT [0:0]", ":POSTROUTING ACCEPT [0:0]",
                      ":KUBE-SERVICES - [0:0]", ":KUBE-NODEPORTS - [0:0]",
                      ":KUBE-MARK-MASQ - [0:0]", ":KUBE-POSTROUTING - [0:0]"]
    nat_rules: list[str] = ["-A PREROUTING -m comment --comment \"kubernetes service portals\" "
                            "-j KUBE-SERVICES",
                            "-A OUTPUT -m comment --comment \"kubernetes service portals\" "
                            "-j KUBE-SERVICES",
                            "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" "
                            "-j KUBE-POSTROUTING",
                            "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
                            "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
                            "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
                            *([f"-A KUBE-POSTROUTING -o {local_pods} -m comment --comment "
                               "\"local endpoints keep the client's address\" -j RETURN"]
                              if local_pods else []),
                            "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic "
                            "requiring SNAT\" -j MASQUERADE"]
    node_port_rules: list[str] = []
    flt: list[str] = ["*filter", ":INPUT ACCEPT [0:0]", ":FORWARD ACCEPT [0:0]",
                      ":OUTPUT ACCEPT [0:0]", ":KUBE-SERVICES - [0:0]"]
    flt_rules: list[str] = [
        f"-A {hook} -m conntrack --ctstate NEW -m comment --comment \"kubernetes service "
        f"portals\" -j KUBE-SERVICES" for hook in ("INPUT", "FORWARD", "OUTPUT")]
    reject = "REJECT --reject-with " + ("icmp-port-unreachable" if family == 4
                                         else "icmp6-port-unreachable")
    declared: set[str] = set()

    def sep_chains(eps: Sequence[tuple[IPAddress, int]], proto: str) -> list[str]:
        seps = chain_names(ProxyRule(rule.service, rule.port_name, rule.cluster_ip, rule.port,
                                     rule.protocol, tuple(eps)))[1]
        for (ip, port), sep in zip(eps, seps, strict=True):
            if sep not in declared:
                declared.add(sep)
                nat.append(f":{sep} - [0:0]")
                nat_rules.append(f"-A {sep} -p {proto} -m {proto} -j DNAT --to-destination "
                                 f"{_dnat(ip, port)}")
        return seps

    for rule in rules:
        if rule.cluster_ip.version != family:
            continue
        proto = rule.protocol.lower()
        name = f"{rule.service}:{rule.port_name}" if rule.port_name else rule.service
        match = f"-d {_addr(rule.cluster_ip)} -p {proto} -m {proto} --dport {rule.port}"
        svc, _ = chain_names(rule)
        if not rule.endpoints:
            target, why = ("DROP", "has no local endpoints") if rule.local_policy else \
                (reject, "has no endpoints")
            flt_rules.append(f"-A KUBE-SERVICES {match} -m comment --comment "
                             f"\"{name} {why}\" -j {target}")
        else:
            nat.append(f":{svc} - [0:0]")
            nat_rules.append(f"-A KUBE-SERVICES {match} -m comment --comment \"{name} cluster IP\" "
                             f"-j {svc}")
            _pick(nat, nat_rules, svc, name, proto, rule.endpoints, sep_chains(rule.endpoints, proto))
        if rule.node_port is None:
            continue
        # node ports (kube-proxy iptables proxier.go: KUBE-NODEPORTS -> KUBE-EXT-* -> KUBE-SVC-*
        # or KUBE-SVL-*)
        np_match = f"-p {proto} -m {proto} --dport {rule.node_port}"
        eps = rule.local_endpoints if rule.external_local else rule.endpoints
        if not eps:
            why = "has no local endpoints" if rule.external_local else "has no endpoints"
            flt_rules.append(f"-A KUBE-SERVICES -m addrtype --dst-type LOCAL {np_match} -m comment "
                             f"--comment \"{name} {why}\" -j "
                             f"{'DROP' if rule.external_local else reject}")
            continue
        ext = _chain("KUBE-EXT-", rule)
        nat.append(f":{ext} - [0:0]")
        node_port_rules.append(f"-A KUBE-NODEPORTS {np_match} -m comment --comment \"{name}\" -j {ext}")
        if rule.external_local:
            svl = _chain("KUBE-SVL-", rule)
            nat.append(f":{svl} - [0:0]")
            nat_rules.append(f"-A {ext} -m comment --comment \"{name} external, local endpoints "
                             f"only\" -j {svl}")
            _pick(nat, nat_rules, svl, name, proto, eps, sep_chains(eps, proto))
        else:
            nat_rules.append(f"-A {ext} -m comment --comment \"masquerade traffic for {name} "
                             f"external destinations\" -j KUBE-MARK-MASQ")
            nat_rules.append(f"-A {ext} -j {svc}")
    # last in KUBE-SERVICES, as kube-proxy writes it
    nat_rules.append("-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports\" "
                     "-m addrtype --dst-type LOCAL -j KUBE-NODEPORTS")
    nat_rules += node_port_rules
    return "\n".join(nat + nat_rules + ["COMMIT"] + flt + flt_rules + ["COMMIT", ""])
