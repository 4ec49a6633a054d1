"""The lab's "bpf-host-routing" data plane: pod traffic that no host-veth filter sees.

A lab component like the kube-proxy emulation (tools/lab/kubeproxy.py), built the way
Cilium's BPF host routing and socket-LB work (docs/lab.md, "The bypass data plane"):

* TCX programs at the head of every host-side pod veth's and the uplink's ingress move
  pod packets with ``bpf_redirect_peer`` (into a pod of this node: the destination host
  veth's egress never runs) and ``bpf_redirect_neigh`` (to another node, through the
  host's FIB, no netfilter);
* a socket-LB (cgroup ``connect4``/``connect6``, ``sendmsg4``/``sendmsg6``, and
  ``recvmsg``/``getpeername`` for the reverse) turns a ClusterIP:port into one of the
  backends the client's node would pick (:meth:`tools.lab.Lab.proxy_rules`, random
  among them), so there is no DNAT to see anywhere.

Flat mode only (VXLAN would need encapsulation in the program). Ground truth is
unaffected: the counters live inside the pods' namespaces (tools/lab/groundtruth.py).
The socket-LB sits on the machine's cgroup v2 root but answers only sockets of the lab's
namespaces (keyed by their netns cookie), and the TCX programs only lab devices, so
nothing outside the lab is touched; everything is detached by :meth:`BypassDataPlane.close`
(or when the process exits: the links are held by its fds only).
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import socket
import sys
from pathlib import Path
from typing import Any

from agent.datapath import cgroup, run_in_netns, tcx
from agent.errors import InputError, RuntimeFailure

SOURCE = Path(__file__).resolve().parent / "bpf" / "bypass.c"
#: (program, enum bpf_attach_type) of the socket-LB (include/uapi/linux/bpf.h)
SOCK_PROGRAMS = (("lab_connect4", 10), ("lab_connect6", 11), ("lab_sendmsg4", 14),
                 ("lab_sendmsg6", 15), ("lab_recvmsg4", 19), ("lab_recvmsg6", 20),
                 ("lab_getpeername4", 29), ("lab_getpeername6", 30))
_PROTO = {"TCP": socket.IPPROTO_TCP, "UDP": socket.IPPROTO_UDP}
_BACKENDS = 8


def _mapped(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bytes:
    return (ipaddress.IPv6Address(f"::ffff:{ip}") if ip.version == 4 else ip).packed


def _cookie(ns: str) -> int:
    def read() -> int:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            return int.from_bytes(s.getsockopt(socket.SOL_SOCKET, 71, 8), sys.byteorder)
    return run_in_netns(ns, read)


def _ifindex(ns: str, name: str) -> int:
    return run_in_netns(ns, lambda: socket.if_nametoindex(name))


class BypassDataPlane:
    """The bypass data plane on some nodes of a lab that is up (flat mode).

    Args:
        lab: a :class:`tools.lab.Lab` (up, ``options.mode`` flat).
        nodes: node names to switch to bpf-host-routing; None: every node.
        socket_lb: install the socket-LB too, for the namespaces of ``nodes`` (the node's
            and its pods'); :meth:`sync` follows later proxy programming.

    Raises:
        InputError: the lab is not in flat mode, or a node is unknown.
        RuntimeFailure: BCC cannot load the programs or the kernel refuses a link.
    """

    def __init__(self, lab: Any, nodes: list[str] | None = None, socket_lb: bool = True) -> None:
        if lab.topology.options.mode != "flat":
            raise InputError("the bypass data plane needs flat mode", obj="lab",
                             field="options.mode")
        from bcc import BPF

        self.lab = lab
        self.nodes = nodes if nodes is not None else [n.name for n in lab.topology.nodes]
        self._links: list[int] = []
        self._bpfs: list[Any] = []
        self._lb: Any = None
        self._rev: Any = None
        self._cookies: dict[str, int] = {}  # network namespace -> its cookie
        try:
            for node in self.nodes:
                self._route_node(BPF, node)
            if socket_lb:
                self._socket_lb(BPF)
        except BaseException:
            self.close()
            raise

    def _load(self, bpf_cls: Any) -> Any:
        try:
            b = bpf_cls(src_file=str(SOURCE).encode())
        except Exception as err:
            raise RuntimeFailure(f"cannot load {SOURCE}: {err}") from err
        self._bpfs.append(b)
        return b

    def _route_node(self, bpf_cls: Any, node: str) -> None:
        """Fill node's maps and attach its TCX programs at the head of every host veth
        and of the uplink."""
        lab = self.lab
        b = self._load(bpf_cls)
        local, remote = b[b"local_pods"], b[b"remote_pods"]
        ns, uplink = lab.uplink(node)
        up_index = _ifindex(ns, uplink)
        veths: list[int] = []
        for pod in lab.topology.pods:
            if pod.host_network:
                continue
            if pod.node == node:
                index = _ifindex(*lab.host_veth(pod.name))
                veths.append(index)
            for fam in (4, 6) if lab.topology.options.ipv6 else (4,):
                key = local.Key()
                for i, byte in enumerate(_mapped(lab.pod_ip(pod.name, fam))):
                    key.a[i] = byte
                if pod.node == node:
                    local[key] = ctypes.c_uint32(index)
                else:
                    remote[key] = ctypes.c_uint32(up_index)
        from_pod = b.load_func(b"lab_from_pod", bpf_cls.SCHED_CLS).fd
        from_uplink = b.load_func(b"lab_from_uplink", bpf_cls.SCHED_CLS).fd
        for index, prog in [*((i, from_pod) for i in veths), (up_index, from_uplink)]:
            self._links.append(run_in_netns(
                ns, lambda i=index, p=prog: tcx.link_create(p, i, tcx.BPF_TCX_INGRESS)))

    def _socket_lb(self, bpf_cls: Any) -> None:
        """Fill the ClusterIP table for the namespaces of every node of the plane and
        attach the sock_addr programs."""
        b = self._load(bpf_cls)
        self._lb, self._rev = b[b"lb"], b[b"lb_rev"]
        for node in self.nodes:
            self.sync(node)
        root = cgroup.cgroup2_root()
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for name, attach_type in SOCK_PROGRAMS:
                prog = b.load_func(name.encode(), bpf_cls.CGROUP_SOCK_ADDR, None, attach_type).fd
                self._links.append(cgroup.link_create(prog, fd, attach_type))
        finally:
            os.close(fd)

    def sync(self, node: str) -> None:
        """(Re)write the socket-LB's entries of node's namespaces (the node's own and its
        pods') from :meth:`tools.lab.Lab.proxy_rules`, so the socket-LB picks among the
        endpoints that node's proxy selects now; the lab calls it whenever it programs
        the node. Nothing without a socket-LB."""
        if self._lb is None:
            return
        lab, lb, rev = self.lab, self._lb, self._rev
        spaces = [lab.node_netns(node)] + [lab.pod_netns(p.name) for p in lab.topology.pods_on(node)
                                           if not p.host_network]
        cookies = {ns: self._cookies.get(ns) or _cookie(ns) for ns in spaces}
        self._cookies.update(cookies)
        mine = set(cookies.values())
        for table in (lb, rev):
            for key in [k for k in table.keys() if k.cookie in mine]:
                del table[key]
        rules = lab.proxy_rules(node)
        for cookie in mine:
            for r in rules:
                proto = _PROTO[r.protocol]
                key = lb.Key()
                key.cookie = cookie
                for i, byte in enumerate(_mapped(r.cluster_ip)):
                    key.vip[i] = byte
                key.port = socket.htons(r.port)
                key.proto = proto
                val = lb.Leaf()
                eps = r.endpoints[:_BACKENDS]
                val.n = len(eps)
                for j, (addr, port) in enumerate(eps):
                    for i, byte in enumerate(_mapped(addr)):
                        val.be[j].a[i] = byte
                    val.be[j].port = socket.htons(port)
                    rk = rev.Key()
                    rk.cookie = cookie
                    for i, byte in enumerate(_mapped(addr)):
                        rk.vip[i] = byte
                    rk.port = socket.htons(port)
                    rk.proto = proto
                    rv = rev.Leaf()
                    for i, byte in enumerate(_mapped(r.cluster_ip)):
                        rv.a[i] = byte
                    rv.port = socket.htons(r.port)
                    rev[rk] = rv
                lb[key] = val

    def close(self) -> None:
        """Detach every program of the data plane (idempotent)."""
        for fd in self._links:
            try:
                tcx.link_detach(fd)
            except OSError:
                pass
            os.close(fd)
        self._links = []
        for b in self._bpfs:
            b.cleanup()
        self._bpfs = []
        self._lb = self._rev = None
