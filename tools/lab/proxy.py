"""The lab's kube-proxy: which endpoints each node's proxy uses, programmed as iptables.

The rules themselves are rendered by :mod:`tools.lab.kubeproxy`; this module decides
the endpoints per (Service, node), keeps the per-node overrides and applies them with
``iptables-restore`` in the node's namespace.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from agent.errors import InputError
from tools.lab import hostport, kubeproxy
from tools.lab.proc import nsexec
from tools.lab.state import LabState
from tools.lab.topology import Node, Service, resolve_target_port

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class LabProxy(LabState):
    """kube-proxy emulation of every node (part of :class:`tools.lab.Lab`); the per-node
    endpoint overrides live in the lab's state (:class:`tools.lab.state.LabState`)."""

    def uses_kube_proxy(self, node: str) -> bool:
        """Whether ``node`` runs the real kube-proxy instead of this emulation (never here;
        :class:`tools.lab.kube.LabKubernetes` decides in the real mode)."""
        return False

    def default_endpoints(self, service: str, node: str) -> tuple[str, ...]:
        """Return the endpoint pods kube-proxy on ``node`` uses before any override: every
        endpoint, or only ``node``'s own under ``internalTrafficPolicy: Local``.

        Source: kube-proxy ``pkg/proxy/topology.go`` ``CategorizeEndpoints`` (without
        hints; the caller programs hint-filtered sets with :meth:`set_service_endpoints`).
        """
        svc = self.topology.service(service)
        if svc.internal_traffic_policy == "Local":
            return tuple(e for e in svc.endpoints if self.topology.pod(e).node == node)
        return svc.endpoints

    def service_endpoints(self, service: str, node: str) -> tuple[str, ...]:
        """Return the endpoints (pod names or addresses) ``node``'s proxy currently uses."""
        svc = self.topology.service(service)
        self.topology.node(node)
        return self._overrides.get((svc.key, node), self.default_endpoints(service, node))

    def set_service_endpoints(self, service: str, node: str,
                              endpoints: Iterable[str] | None) -> None:
        """Program what kube-proxy on ``node`` selects for ``service`` and apply it now.

        Args:
            service: ``namespace/name`` (or an unambiguous name).
            node: node name.
            endpoints: pod names or addresses (the target port comes from the Service;
                an address needs a numeric targetPort); ``[]`` makes the ClusterIP DROP
                (``internalTrafficPolicy: Local``) or REJECT (otherwise); ``None``
                restores :meth:`default_endpoints`.

        Raises:
            InputError: unknown Service, node or endpoint.
            RuntimeFailure: iptables-restore failed.
        """
        self.set_node_endpoints(node, {service: endpoints})

    def set_node_endpoints(self, node: str,
                           services: Mapping[str, Iterable[str] | None]) -> None:
        """Like :meth:`set_service_endpoints` for several Services of one node, applied in
        one iptables-restore per family."""
        self.topology.node(node)
        if self.uses_kube_proxy(node):
            raise InputError("runs the real kube-proxy: its endpoints are what the apiserver says",
                             obj=f"Node {node}", field="ignoreHints")
        for service, endpoints in services.items():
            svc = self.topology.service(service)
            if endpoints is None:
                self._overrides.pop((svc.key, node), None)
                continue
            eps = tuple(str(e) for e in endpoints)
            for e in eps:
                self._endpoint_address(svc, e, 4)  # validates
            self._overrides[(svc.key, node)] = eps
        self.program_node(node)
        self._save_if_running()

    def proxy_rules(self, node: str) -> list[kubeproxy.ProxyRule]:
        """Return the ClusterIP and node-port rules ``node``'s proxy has (both families; none
        for a headless Service). A node port serves the endpoints this node selects for
        ClusterIP traffic (``externalTrafficPolicy: Cluster``) or its own endpoints (``Local``),
        as kube-proxy ``CategorizeEndpoints`` decides."""
        rules: list[kubeproxy.ProxyRule] = []
        for svc in self.topology.services:
            chosen = self.service_endpoints(svc.key, node)
            for family, cip in ((4, svc.cluster_ip), (6, svc.cluster_ip6)):
                if cip is None:
                    continue
                for sp in svc.ports:
                    eps = []
                    for e in chosen:
                        resolved = self._endpoint_address(svc, e, family, sp)
                        if resolved is not None:
                            eps.append(resolved)
                    local = [] if svc.external_traffic_policy != "Local" else [
                        a for a in (self._endpoint_address(svc, e, family, sp) for e in svc.endpoints
                                    if self.topology.pod(e).node == node) if a is not None]
                    rules.append(kubeproxy.ProxyRule(
                        service=svc.key, port_name=sp.name or "", cluster_ip=cip, port=sp.port,
                        protocol=sp.protocol, endpoints=tuple(eps),
                        local_policy=svc.internal_traffic_policy == "Local",
                        # node ports the topology gives (the emulation allocates none)
                        node_port=sp.node_port if svc.node_ports else None,
                        external_local=svc.external_traffic_policy == "Local",
                        local_endpoints=tuple(local)))
        return rules

    def program_proxies(self, select: Callable[[Service, Node], Iterable[str] | None]) -> None:
        """Program every node's proxy from a model of kube-proxy's endpoint selection.

        ``select(service, node)`` returns the endpoints kube-proxy on ``node`` would use
        (pod names or addresses; ``[]`` = none, so DROP or REJECT), or ``None`` for
        :meth:`default_endpoints`. A node with ``ignoreHints: true`` is not asked: it
        keeps the default, i.e. every endpoint (a data plane that ignores hints), still
        honouring ``internalTrafficPolicy: Local`` (kube-proxy ``CategorizeEndpoints``
        applies that policy before and independently of hints).
        """
        for node in self.topology.nodes:
            if self.uses_kube_proxy(node.name):
                continue
            choice: dict[str, Iterable[str] | None] = {}
            for svc in self.topology.services:
                choice[svc.key] = None if node.ignore_hints else select(svc, node)
            self.set_node_endpoints(node.name, choice)

    def program_node(self, node: str) -> None:
        """(Re)write ``node``'s nat and filter tables from :meth:`proxy_rules` (and, on a
        ``dataPlane: bypass`` node, its socket-LB's table, :mod:`tools.lab.bypass`).

        Nothing is written on a node that runs the real kube-proxy (:meth:`uses_kube_proxy`):
        its tables are kube-proxy's. The node's ``hostPort`` DNAT (the CNI's, not kube-proxy's)
        is written in both cases (:meth:`program_host_ports`).

        Raises:
            RuntimeFailure: iptables-restore failed.
        """
        self.program_host_ports(node)
        if self.uses_kube_proxy(node):
            return
        rules = self.proxy_rules(node)
        ns = self.node_netns(node)
        # a bypass node plays Cilium's kube-proxy replacement: no SNAT to local endpoints
        local = f"{self.prefix}p+" if self.topology.node(node).data_plane == "bypass" else None
        nsexec(ns, ["iptables-restore", "-w"], input=kubeproxy.render(rules, 4, local))
        if self.topology.options.ipv6:
            nsexec(ns, ["ip6tables-restore", "-w"], input=kubeproxy.render(rules, 6, local))
        bypass = getattr(self, "bypass", None)
        if bypass is not None and node in bypass.nodes:
            bypass.sync(node)  # the socket-LB picks among the same endpoints

    def program_host_ports(self, node: str) -> None:
        """(Re)write ``node``'s ``hostPort`` DNAT table from its pods' ports
        (:mod:`tools.lab.hostport`); a node without one gets an empty table.

        Raises:
            RuntimeFailure: nft failed.
        """
        entries = []
        for pod in self.topology.pods_on(node):
            if pod.host_network:
                continue  # a host-network pod listens on the node's address itself
            for pp in pod.ports:
                if pp.host_port is None:
                    continue
                for addr in (pod.ip, pod.ip6):
                    if addr is not None:
                        entries.append(hostport.HostPort(pp.protocol, pp.host_port, addr, pp.port))
        nsexec(self.node_netns(node), ["nft", "-f", "-"], input=hostport.render(entries))

    def program_all_nodes(self) -> None:
        """Program every node's proxy (see :meth:`program_node`)."""
        for n in self.topology.nodes:
            self.program_node(n.name)

    def _endpoint_address(self, svc: Service, endpoint: str, family: int,
                          sp: Any = None) -> tuple[IPAddress, int] | None:
        sp = sp or svc.ports[0]
        try:
            addr = ipaddress.ip_address(endpoint)
        except ValueError:
            pod = self.topology.pod(endpoint)  # raises InputError naming the pod
            if pod.ip6 is None and family == 6:
                return None
            return pod.address(family), resolve_target_port(pod, sp)
        if isinstance(sp.target_port, str):
            raise InputError("an address endpoint needs a numeric targetPort",
                             obj=f"Service {svc.key}", field="ports.targetPort")
        if addr.version != family:
            return None
        return addr, sp.target_port
