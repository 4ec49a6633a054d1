"""Namespaces and links of the lab: names, creation, sysctls, offloads, the fabric.

Every namespace and link name starts with the lab's prefix (see :mod:`tools.lab.lab`
for the wiring); nothing is configured in the host namespace. Every lab link has TSO,
GSO and GRO off and ``gso_max_segs`` 1, so one skb is one wire packet (docs/lab.md).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.errors import InputError, RuntimeFailure
from tools.lab.proc import nsexec, pod_cgroup
from tools.lab.topology import OutsidePeer, Topology

_OFFLOADS = ("tso", "gso", "gro")
NODE_SYSCTLS = ("net.ipv4.ip_forward=1", "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0", "net.ipv6.conf.all.forwarding=1",
                "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
#: no DAD (addresses usable at once), no router solicitations (no stray packets on the
#: veth); the ephemeral range the topology keeps pod ports out of
POD_SYSCTLS = ("net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
               "net.ipv6.conf.all.router_solicitations=0",
               "net.ipv6.conf.default.router_solicitations=0",
               "net.ipv4.ip_local_port_range=32768 60999")


def netns_mod() -> Any:
    """Return pyroute2's ``netns`` module (create, remove, listnetns)."""
    from pyroute2 import netns
    return netns


def open_ns(name: str) -> Any:
    """Return a pyroute2 ``NetNS`` netlink socket in namespace ``name``; caller closes it."""
    from pyroute2 import NetNS
    return NetNS(name)


def sysctl(ns: str, settings: Sequence[str]) -> None:
    """Apply ``key=value`` sysctls inside ``ns`` (writes /proc/sys there; no procps needed)."""
    script = "; ".join(
        f"printf '%s' '{value}' > /proc/sys/{key.replace('.', '/')}"
        for key, _, value in (item.partition("=") for item in settings))
    nsexec(ns, ["sh", "-e", "-c", script])


def disable_offloads(ns: str, links: Sequence[str]) -> None:
    script = "; ".join(f"ethtool -K {link} {' off '.join(_OFFLOADS)} off 2>/dev/null || true"
                       for link in links)
    nsexec(ns, ["sh", "-c", script])
    # verify: a feature the driver refused to turn off would break the ground truth
    for link in links:
        out = nsexec(ns, ["ethtool", "-k", link]).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("tcp-segmentation-offload", "generic-segmentation-offload",
                               "generic-receive-offload") and value.strip().startswith("on"):
                raise RuntimeFailure(f"cannot turn off {key.strip()} on {link} in {ns}")


class LabNamespaces:
    """The namespace and link names of a lab, and the fabric between its nodes.

    Base of :class:`tools.lab.Lab`: the attributes below are set by ``Lab.__init__``.
    """

    topology: Topology
    prefix: str
    state_dir: Path
    #: ``"emulated"`` or ``"real"`` (tools/lab/kube.py): real adds the control-plane namespace
    kubernetes: str = "emulated"

    # ------------------------------------------------------------------ naming

    @property
    def fabric_netns(self) -> str:
        """Name of the fabric namespace (holds the bridge the node uplinks hang off)."""
        return f"{self.prefix}-fabric"

    def node_netns(self, node: str) -> str:
        """Return the network namespace name of ``node``.

        Raises:
            InputError: no such node.
        """
        return f"{self.prefix}-node-{self.topology.node(node).name}"

    def pod_netns(self, pod: str) -> str:
        """Return the network namespace a pod's processes run in (its node's namespace
        for a host-network pod).

        Raises:
            InputError: no such pod.
        """
        p = self.topology.pod(pod)
        return self.node_netns(p.node) if p.host_network else f"{self.prefix}-pod-{p.name}"

    def pod_cgroup(self, pod: str) -> Path | None:
        """Return the cgroup a pod's processes run in (tools/lab/proc.py, "pod cgroups"),
        None for a host-network pod, an outside peer (``outside/<name>``) or a pod without
        one."""
        if pod.startswith("outside/"):
            return None
        p = self.topology.pod(pod)
        return None if p.host_network else pod_cgroup(self.prefix, p.node, p.name)

    def host_veth(self, pod: str) -> tuple[str, str]:
        """Return ``(node netns name, host-side veth name)`` of a pod.

        Raises:
            InputError: no such pod, or a host-network pod (it has no veth).
        """
        p = self.topology.pod(pod)
        if p.host_network:
            raise InputError("a hostNetwork pod has no veth", obj=f"Pod {pod}", field="hostNetwork")
        return self.node_netns(p.node), f"{self.prefix}p{p.index}"

    def uplink(self, node: str) -> tuple[str, str]:
        """Return ``(node netns name, uplink name)``: the node's link to the fabric."""
        n = self.topology.node(node)
        return self.node_netns(node), f"{self.prefix}u{n.index}"

    def vxlan_device(self, node: str) -> tuple[str, str] | None:
        """Return ``(node netns name, VXLAN device name)`` in vxlan mode, else ``None``."""
        if self.topology.options.mode != "vxlan":
            return None
        return self.node_netns(node), f"{self.prefix}x"

    @property
    def outside_netns(self) -> str:
        """Name of the outside peer's namespace (:meth:`build_outside`)."""
        return f"{self.prefix}-outside"

    @property
    def outside_address(self) -> ipaddress.IPv4Address:
        """The outside peer's address on the fabric: the second-last host address of
        ``options.node_cidr`` (the last is the control plane's, tools/lab/kube.py)."""
        return self.topology.options.node_cidr.broadcast_address - 2

    def build_outside(self) -> str:
        """Add a machine outside the cluster to the running lab: namespace
        :attr:`outside_netns` with ``<prefix>uo`` (:attr:`outside_address`) on the fabric
        bridge (veth ``<prefix>fo``), no route to pod CIDRs or ClusterIPs, offloads off like
        every lab link. It reaches the nodes' addresses, so NodePorts; ``run_flow(OUTSIDE,
        ...)`` (:data:`tools.lab.flows.OUTSIDE`) runs a client there. It is not a node, not in
        the API, and ``down`` removes it with the lab's other namespaces. Idempotent.

        Returns:
            The namespace's name.

        Raises:
            RuntimeFailure: a command failed.
        """
        name = self.outside_netns
        netns = netns_mod()
        if name in netns.listnetns():
            return name
        netns.create(name)
        self._link_peer(name, f"{self.prefix}fo", f"{self.prefix}uo", self.outside_address, None)
        return name

    def peer_netns(self, peer: str) -> str:
        """Return the namespace of the topology's outside peer ``peer`` (``<prefix>-out-<name>``).

        Raises:
            InputError: no such peer.
        """
        return f"{self.prefix}-out-{self.topology.peer(peer).name}"

    def _build_peer(self, peer: OutsidePeer) -> None:
        """Build the topology's outside peer ``peer`` (its namespace exists): ``<prefix>uo<i>``
        with its address(es) on the fabric bridge (veth ``<prefix>fo<i>``), and routes to every
        node's pod CIDRs via that node's address, as a VPC routes pod ranges to their nodes
        (VPC-native CNIs, GKE alias IPs), so a load balancer can send to pods (IP targets) and
        a database can answer a pod."""
        ns_name = self.peer_netns(peer.name)
        self._link_peer(ns_name, f"{self.prefix}fo{peer.index}", f"{self.prefix}uo{peer.index}",
                        peer.ip, peer.ip6)
        ns = open_ns(ns_name)
        try:
            idx = ns.link_lookup(ifname=f"{self.prefix}uo{peer.index}")[0]
            for n in self.topology.nodes:
                ns.route("add", dst=str(n.pod_cidr), gateway=str(n.ip), oif=idx)
                if peer.ip6 is not None and n.pod_cidr_v6 is not None and n.ip6 is not None:
                    ns.route("add", dst=str(n.pod_cidr_v6), gateway=str(n.ip6), oif=idx)
        finally:
            ns.close()

    def _link_peer(self, name: str, outer: str, inner: str, address: ipaddress.IPv4Address,
                   address6: ipaddress.IPv6Address | None) -> None:
        """A veth from the fabric bridge (``outer``) into namespace ``name`` (``inner``, with the
        address(es)), offloads off like every lab link."""
        opt = self.topology.options
        fab = open_ns(self.fabric_netns)
        try:
            br = fab.link_lookup(ifname=f"{self.prefix}br")[0]
            fab.link("add", ifname=outer, kind="veth", peer={"ifname": inner, "net_ns_fd": name})
            idx = fab.link_lookup(ifname=outer)[0]
            fab.link("set", index=idx, mtu=opt.mtu, **self._one_skb_one_packet(), master=br, state="up")
        finally:
            fab.close()
        ns = open_ns(name)
        try:
            ns.link("set", index=ns.link_lookup(ifname="lo")[0], state="up")
            idx = ns.link_lookup(ifname=inner)[0]
            ns.addr("add", index=idx, address=str(address), prefixlen=opt.node_cidr.prefixlen)
            if address6 is not None:
                ns.addr("add", index=idx, address=str(address6), prefixlen=opt.node_cidr_v6.prefixlen)
            ns.link("set", index=idx, mtu=opt.mtu, **self._one_skb_one_packet(), state="up")
        finally:
            ns.close()
        if not opt.offloads:
            disable_offloads(name, [inner])
            disable_offloads(self.fabric_netns, [outer])

    def all_netns(self) -> list[str]:
        """Return every namespace name this lab creates (fabric, nodes, pods, outside peers,
        control plane)."""
        names = [self.fabric_netns] + [self.node_netns(n.name) for n in self.topology.nodes]
        names += [self.pod_netns(p.name) for p in self.topology.pods if not p.host_network]
        names += [self.peer_netns(o.name) for o in self.topology.outside]
        if self.kubernetes == "real":
            names.append(f"{self.prefix}-cp")
        return names

    # ------------------------------------------------------------------ building

    def _one_skb_one_packet(self) -> dict[str, int]:
        """Return the link attributes that make one skb one wire packet: ``gso_max_segs``
        1 (``tcp_tso_segs`` then builds one MSS per skb), or none with ``offloads``."""
        return {} if self.topology.options.offloads else {"gso_max_segs": 1}

    def _build_fabric(self) -> None:
        opt = self.topology.options
        ns = open_ns(self.fabric_netns)
        try:
            br = f"{self.prefix}br"
            ns.link("add", ifname=br, kind="bridge")
            br_idx = ns.link_lookup(ifname=br)[0]
            ns.link("set", index=br_idx, mtu=opt.mtu, state="up")
            for n in self.topology.nodes:
                fab, up = f"{self.prefix}f{n.index}", f"{self.prefix}u{n.index}"
                ns.link("add", ifname=fab, kind="veth",
                        peer={"ifname": up, "net_ns_fd": self.node_netns(n.name)})
                idx = ns.link_lookup(ifname=fab)[0]
                ns.link("set", index=idx, mtu=opt.mtu, **self._one_skb_one_packet(), master=br_idx, state="up")
        finally:
            ns.close()

    def _disable_all_offloads(self) -> None:
        """Turn offloads off on every link of the lab: one skb == one wire packet (unless
        the topology keeps them, ``options.offloads``)."""
        topo = self.topology
        opt = topo.options
        if opt.offloads:
            return
        for n in topo.nodes:
            links = [self.uplink(n.name)[1]] + [self.host_veth(p.name)[1]
                                                for p in topo.pods_on(n.name)
                                                if not p.host_network]
            if opt.mode == "vxlan":
                links.append(f"{self.prefix}x")
            disable_offloads(self.node_netns(n.name), links)
        disable_offloads(self.fabric_netns, [f"{self.prefix}f{n.index}" for n in topo.nodes])
        for p in topo.pods:
            if not p.host_network:
                disable_offloads(self.pod_netns(p.name), ["eth0"])
