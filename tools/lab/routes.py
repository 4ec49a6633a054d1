"""Addressing, routes and the overlay of the lab: node uplinks, VXLAN, pod veths.

Nodes reach each other's pod CIDRs through their fabric addresses (flat mode) or
through a VXLAN device over the uplink (vxlan mode). A pod gets ``eth0`` with its /32
and /128, and a default route via ``169.254.1.1``/``fe80::1`` bound to the host veth's
MAC by a permanent neighbour entry (the Calico pattern: no bridge, one route per pod on
the node), see docs/lab.md.
"""

from __future__ import annotations

import ipaddress

from agent.errors import InputError
from tools.lab.netns import LabNamespaces, open_ns
from tools.lab.proc import nsexec
from tools.lab.topology import Pod

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

#: pod default gateways (bound to the host veth's MAC by a permanent neighbour entry)
GATEWAY4 = ipaddress.IPv4Address("169.254.1.1")
GATEWAY6 = ipaddress.IPv6Address("fe80::1")
_NUD_PERMANENT = 0x80  # include/uapi/linux/neighbour.h
_RTNH_F_ONLINK = 4     # include/uapi/linux/rtnetlink.h


class LabAddressing(LabNamespaces):
    """Addresses of nodes, pods and Services, and the links, routes and overlay that
    carry them (part of :class:`tools.lab.Lab`)."""

    def pod_ip(self, pod: str, family: int = 4) -> IPAddress:
        """Return the pod's address (``family`` 4 or 6); a host-network pod's is its node's.

        Raises:
            InputError: no such pod, or IPv6 in a lab without IPv6.
        """
        return self.topology.pod(pod).address(family)

    def node_ip(self, node: str, family: int = 4) -> IPAddress:
        """Return the node's fabric address (``family`` 4 or 6).

        Raises:
            InputError: no such node, or IPv6 in a lab without IPv6.
        """
        n = self.topology.node(node)
        if family == 6:
            if n.ip6 is None:
                raise InputError("the lab has no IPv6", obj=f"Node {node}", field="ip6")
            return n.ip6
        return n.ip

    def cluster_ip(self, service: str, family: int = 4) -> IPAddress:
        """Return the ClusterIP of ``service`` (``namespace/name`` or unambiguous name).

        Raises:
            InputError: no such Service, a headless Service (it has none), or IPv6 in a lab
                without IPv6.
        """
        s = self.topology.service(service)
        if s.cluster_ip is None:
            raise InputError("a headless Service has no ClusterIP: dial its pods", obj=f"Service {s.key}",
                             field="clusterIP")
        if family == 6:
            if s.cluster_ip6 is None:
                raise InputError("the lab has no IPv6", obj=f"Service {s.key}", field="clusterIP6")
            return s.cluster_ip6
        return s.cluster_ip

    def _build_node(self, name: str) -> None:
        topo = self.topology
        opt = topo.options
        node = topo.node(name)
        ns = open_ns(self.node_netns(name))
        try:
            lo = ns.link_lookup(ifname="lo")[0]
            ns.link("set", index=lo, state="up")
            up = f"{self.prefix}u{node.index}"
            up_idx = ns.link_lookup(ifname=up)[0]
            ns.addr("add", index=up_idx, address=str(node.ip), prefixlen=opt.node_cidr.prefixlen)
            if node.ip6 is not None:
                ns.addr("add", index=up_idx, address=str(node.ip6),
                        prefixlen=opt.node_cidr_v6.prefixlen)
            ns.link("set", index=up_idx, mtu=opt.mtu, **self._one_skb_one_packet(), state="up")
            dev_idx = up_idx
            if opt.mode == "vxlan":
                vx = f"{self.prefix}x"
                ns.link("add", ifname=vx, kind="vxlan", vxlan_id=opt.vni, vxlan_link=up_idx,
                        vxlan_local=str(node.ip), vxlan_port=4789)
                dev_idx = ns.link_lookup(ifname=vx)[0]
                ns.link("set", index=dev_idx, mtu=opt.pod_mtu, **self._one_skb_one_packet())
                assert node.overlay_ip is not None
                ns.addr("add", index=dev_idx, address=str(node.overlay_ip),
                        prefixlen=opt.overlay_cidr.prefixlen)
                if node.overlay_ip6 is not None:
                    ns.addr("add", index=dev_idx, address=str(node.overlay_ip6),
                            prefixlen=opt.overlay_cidr_v6.prefixlen)
                ns.link("set", index=dev_idx, state="up")
                for other in topo.nodes:
                    if other.name != name:
                        # flood (ARP/ND, unknown unicast) to every other node's VTEP
                        nsexec(self.node_netns(name), [
                            "bridge", "fdb", "append", "00:00:00:00:00:00", "dev", vx,
                            "dst", str(other.ip)])
            for other in topo.nodes:
                if other.name == name:
                    continue
                via4 = other.overlay_ip if opt.mode == "vxlan" else other.ip
                ns.route("add", dst=str(other.pod_cidr), gateway=str(via4), oif=dev_idx)
                if other.pod_cidr_v6 is not None:
                    via6 = other.overlay_ip6 if opt.mode == "vxlan" else other.ip6
                    ns.route("add", dst=str(other.pod_cidr_v6), gateway=str(via6), oif=dev_idx)
            # host-network clients need a route to ClusterIPs for OUTPUT DNAT to happen
            ns.route("add", dst=str(opt.service_cidr), oif=up_idx, scope=253)
            if opt.ipv6:
                ns.route("add", dst=str(opt.service_cidr_v6), oif=up_idx)
        finally:
            ns.close()

    def flap_pod_link(self, pod: str, down_seconds: float = 1.0) -> None:
        """Take pod ``pod``'s ``eth0`` down for ``down_seconds`` and up again (a link flap:
        the host veth loses its carrier meanwhile), then restore what going down removed
        (the IPv6 address, the gateway neighbours, the default routes; the host side's
        routes and neighbours to the pod when they went too).

        While it is down the pod's own packets fail at routing, before any counter of the
        lab or of the agents, and packets to it are dropped on the host veth after the
        node's hooks: so a flap keeps the ground truth comparable only for pods that are
        clients (their responses are counted at the server, by both).

        Raises:
            InputError: no such pod, or a host-network pod (it has no veth).
        """
        import time

        p = self.topology.pod(pod)
        if p.host_network:
            raise InputError(f"pod {pod} is host-network: it has no veth to flap",
                             obj=f"pod {pod}", field="hostNetwork")
        node_ns_name, host = self.host_veth(pod)
        pns = open_ns(self.pod_netns(pod))
        try:
            e_idx = pns.link_lookup(ifname="eth0")[0]
            pns.link("set", index=e_idx, state="down")
            time.sleep(down_seconds)
            pns.link("set", index=e_idx, state="up")
            pod_mac = pns.get_links(e_idx)[0].get_attr("IFLA_ADDRESS")
        finally:
            pns.close()
        nns = open_ns(node_ns_name)
        try:
            h_idx = nns.link_lookup(ifname=host)[0]
            host_mac = nns.get_links(h_idx)[0].get_attr("IFLA_ADDRESS")
            nns.route("replace", dst=f"{p.ip}/32", oif=h_idx, scope=253)
            if p.ip6 is not None:
                nns.route("replace", dst=f"{p.ip6}/128", oif=h_idx)
            for addr in (p.ip, p.ip6):
                if addr is not None:
                    nns.neigh("replace", dst=str(addr), lladdr=pod_mac, ifindex=h_idx,
                              state=_NUD_PERMANENT)
        finally:
            nns.close()
        pns = open_ns(self.pod_netns(pod))
        try:
            if p.ip6 is not None and not pns.get_addr(index=e_idx, address=str(p.ip6)):
                pns.addr("add", index=e_idx, address=str(p.ip6), prefixlen=128)
            pns.neigh("replace", dst=str(GATEWAY4), lladdr=host_mac, ifindex=e_idx,
                      state=_NUD_PERMANENT)
            pns.route("replace", dst="0.0.0.0/0", gateway=str(GATEWAY4), oif=e_idx,
                      flags=_RTNH_F_ONLINK)
            if p.ip6 is not None:
                pns.neigh("replace", dst=str(GATEWAY6), lladdr=host_mac, ifindex=e_idx,
                          state=_NUD_PERMANENT)
                pns.route("replace", dst="::/0", gateway=str(GATEWAY6), oif=e_idx)
        finally:
            pns.close()

    def _build_pod(self, pod: Pod) -> None:
        opt = self.topology.options
        node_ns_name, host = self.host_veth(pod.name)
        pod_ns_name = self.pod_netns(pod.name)
        nns = open_ns(node_ns_name)
        try:
            nns.link("add", ifname=host, kind="veth",
                     peer={"ifname": "eth0", "net_ns_fd": pod_ns_name})
            h_idx = nns.link_lookup(ifname=host)[0]
            nns.link("set", index=h_idx, mtu=opt.pod_mtu, **self._one_skb_one_packet(), state="up")
            host_mac = nns.get_links(h_idx)[0].get_attr("IFLA_ADDRESS")
            nns.route("add", dst=f"{pod.ip}/32", oif=h_idx, scope=253)
            if pod.ip6 is not None:
                nns.route("add", dst=f"{pod.ip6}/128", oif=h_idx)
        finally:
            nns.close()
        pns = open_ns(pod_ns_name)
        try:
            lo = pns.link_lookup(ifname="lo")[0]
            pns.link("set", index=lo, state="up")
            e_idx = pns.link_lookup(ifname="eth0")[0]
            pns.link("set", index=e_idx, mtu=opt.pod_mtu, **self._one_skb_one_packet())
            pns.addr("add", index=e_idx, address=str(pod.ip), prefixlen=32)
            if pod.ip6 is not None:
                pns.addr("add", index=e_idx, address=str(pod.ip6), prefixlen=128)
            pns.link("set", index=e_idx, state="up")
            pns.neigh("add", dst=str(GATEWAY4), lladdr=host_mac, ifindex=e_idx,
                      state=_NUD_PERMANENT)
            pns.route("add", dst="0.0.0.0/0", gateway=str(GATEWAY4), oif=e_idx,
                      flags=_RTNH_F_ONLINK)
            if pod.ip6 is not None:
                pns.neigh("add", dst=str(GATEWAY6), lladdr=host_mac, ifindex=e_idx,
                          state=_NUD_PERMANENT)
                pns.route("add", dst="::/0", gateway=str(GATEWAY6), oif=e_idx)
            pod_mac = pns.get_links(e_idx)[0].get_attr("IFLA_ADDRESS")
        finally:
            pns.close()
        # static neighbours both ways: no ARP/ND between pod and node, so the veth carries
        # only the pods' own IP packets (interface counters can then check the ground truth)
        nns = open_ns(node_ns_name)
        try:
            for addr in (pod.ip, pod.ip6):
                if addr is not None:
                    nns.neigh("add", dst=str(addr), lladdr=pod_mac, ifindex=h_idx,
                              state=_NUD_PERMANENT)
        finally:
            nns.close()
