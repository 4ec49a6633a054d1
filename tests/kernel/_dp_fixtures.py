"""A minimal two-node lab in network namespaces for the datapath kernel tests.

Topology (every name carries a random ``zm<4 hex>`` prefix; all traffic stays inside):

* node namespaces ``<p>na`` and ``<p>nb`` joined by a veth ``<p>u`` (underlay
  10.200.0.1/.2, fd00:200::1/2); ``overlay="vxlan"`` routes pod traffic through a VXLAN
  device ``<p>vx`` (VNI 42) over that underlay instead of routing it directly;
* pods (namespaces ``<p>a1``, ``<p>a2`` on node a, ``<p>b1`` on node b), each with
  ``eth0`` and a host-side veth ``<p><pod>`` in its node namespace (no address on the
  host side besides 169.254.1.1/fe80::1 as the pods' gateway, as Calico does);
* a ClusterIP (10.96.0.10 / fd00:96::10) DNATed with iptables in every node namespace
  (PREROUTING, as kube-proxy does) to one endpoint;
* ground truth: iptables/ip6tables per-rule byte counters in the FORWARD chain of every
  node, one rule per (client pod, server pod) and direction. Every packet between two
  pods is forwarded by the server's node; counting only there (and deduplicating on
  the client's node by the rule's node) gives each byte exactly once.

TSO/GSO/GRO are switched off on every device so each skb is one wire packet: iptables
counts skb->len per skb while the datapath expands GSO packets into wire segments
(docs/datapath.md). Tests shell out to ip/iptables/ethtool; the agent never does.
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
import subprocess
import threading
import time
from dataclasses import dataclass

from agent.datapath import run_in_netns

PODS = {"a1": "a", "a2": "a", "b1": "b"}
NODE_INDEX = {"a": 1, "b": 2}
POD_INDEX = {"a1": 11, "a2": 12, "b1": 11}
VIP = {4: "10.96.0.10", 6: "fd00:96::10"}
VIP_PORT = 80


def sh(*cmd: str, check: bool = True) -> str:
    """Run a command, return stdout; raise with stderr on failure."""
    res = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {res.stderr.strip()}")
    return res.stdout


def pod_ip(pod: str, family: int) -> str:
    n, i = NODE_INDEX[PODS[pod]], POD_INDEX[pod]
    return f"10.201.{n}.{i}" if family == 4 else f"fd00:201:{n}::{i}"


@dataclass
class Flow:
    client: str
    server: str
    dst: str          # address the client dials (pod IP or ClusterIP)
    port: int         # port the client dials
    server_port: int  # port the server listens on
    proto: str        # "tcp" or "udp"
    family: int


class MiniLab:
    """Two nodes, three pods, one ClusterIP; see the module docstring."""

    def __init__(self, overlay: str = "flat", offload: bool = False) -> None:
        self.prefix = "zm" + secrets.token_hex(2)
        self.overlay = overlay
        self.offload = offload  # keep TSO/GSO/GRO on (the GSO accounting test)
        self.nodes = {n: f"{self.prefix}n{n}" for n in NODE_INDEX}
        self.pod_ns = {p: f"{self.prefix}{p}" for p in PODS}
        self._rules: list[tuple[str, int, str, str, str, str]] = []  # node, fam, name...

    # -- build / teardown ---------------------------------------------------------------

    def host_veth(self, pod: str) -> tuple[str, str]:
        return self.nodes[PODS[pod]], f"{self.prefix}{pod}"

    def up(self) -> "MiniLab":
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _ns(self, ns: str, *cmd: str) -> str:
        return sh("ip", "netns", "exec", ns, *cmd)

    def _build(self) -> None:
        p = self.prefix
        for ns in [*self.nodes.values(), *self.pod_ns.values()]:
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        na, nb = self.nodes["a"], self.nodes["b"]
        sh("ip", "-n", na, "link", "add", f"{p}u", "type", "veth", "peer", "name", f"{p}u",
           "netns", nb)
        for node, ns in self.nodes.items():
            n = NODE_INDEX[node]
            self._ns(ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
            self._ns(ns, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
            sh("ip", "-n", ns, "addr", "add", f"10.200.0.{n}/24", "dev", f"{p}u")
            sh("ip", "-n", ns, "addr", "add", f"fd00:200::{n}/64", "dev", f"{p}u", "nodad")
            sh("ip", "-n", ns, "link", "set", f"{p}u", "up")
            self._offload_off(ns, f"{p}u")
        if self.overlay == "vxlan":
            for node, ns in self.nodes.items():
                n = NODE_INDEX[node]
                other = 3 - n
                sh("ip", "-n", ns, "link", "add", f"{p}vx", "type", "vxlan", "id", "42",
                   "local", f"10.200.0.{n}", "remote", f"10.200.0.{other}", "dstport", "4789",
                   "dev", f"{p}u")
                sh("ip", "-n", ns, "addr", "add", f"10.202.0.{n}/24", "dev", f"{p}vx")
                sh("ip", "-n", ns, "addr", "add", f"fd00:202::{n}/64", "dev", f"{p}vx", "nodad")
                sh("ip", "-n", ns, "link", "set", f"{p}vx", "up")
                self._offload_off(ns, f"{p}vx")
        for node, ns in self.nodes.items():
            n = NODE_INDEX[node]
            other = 3 - n
            via4 = f"10.202.0.{other}" if self.overlay == "vxlan" else f"10.200.0.{other}"
            via6 = f"fd00:202::{other}" if self.overlay == "vxlan" else f"fd00:200::{other}"
            sh("ip", "-n", ns, "route", "add", f"10.201.{other}.0/24", "via", via4)
            sh("ip", "-n", ns, "-6", "route", "add", f"fd00:201:{other}::/64", "via", via6)
        for pod, node in PODS.items():
            self._add_pod(pod)
        for ns in self.nodes.values():
            for fam, tool in ((4, "iptables"), (6, "ip6tables")):
                self._ns(ns, tool, "-w", "-N", "ZMGT")
                self._ns(ns, tool, "-w", "-I", "FORWARD", "-j", "ZMGT")

    def _offload_off(self, ns: str, dev: str) -> None:
        if self.offload:
            return
        self._ns(ns, "ethtool", "-K", dev, "tso", "off", "gso", "off", "gro", "off")

    def _add_pod(self, pod: str) -> None:
        """Create pod's namespace and veth (also used to add a pod while agents run)."""
        node_ns, host = self.host_veth(pod)
        ns = self.pod_ns[pod]
        if ns not in sh("ip", "netns", "list"):
            sh("ip", "netns", "add", ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", node_ns, "link", "add", host, "type", "veth", "peer", "name", "eth0",
           "netns", ns)
        sh("ip", "-n", node_ns, "addr", "add", "169.254.1.1/32", "dev", host)
        sh("ip", "-n", node_ns, "addr", "add", "fe80::1/64", "dev", host, "nodad")
        sh("ip", "-n", node_ns, "link", "set", host, "up")
        sh("ip", "-n", node_ns, "route", "add", f"{pod_ip(pod, 4)}/32", "dev", host)
        sh("ip", "-n", node_ns, "-6", "route", "add", f"{pod_ip(pod, 6)}/128", "dev", host)
        sh("ip", "-n", ns, "addr", "add", f"{pod_ip(pod, 4)}/32", "dev", "eth0")
        sh("ip", "-n", ns, "addr", "add", f"{pod_ip(pod, 6)}/128", "dev", "eth0", "nodad")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "route", "add", "169.254.1.1", "dev", "eth0")
        sh("ip", "-n", ns, "route", "add", "default", "via", "169.254.1.1", "dev", "eth0")
        sh("ip", "-n", ns, "-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0")
        if self.overlay == "vxlan":  # room for the 50-byte VXLAN header, as flannel does
            sh("ip", "-n", node_ns, "link", "set", host, "mtu", "1450")
            sh("ip", "-n", ns, "link", "set", "eth0", "mtu", "1450")
        self._offload_off(node_ns, host)
        self._offload_off(ns, "eth0")

    def add_pod_later(self, pod: str, node: str) -> None:
        """Add a pod (name must not exist yet) on node while datapaths run."""
        PODS.setdefault(pod, node)
        POD_INDEX.setdefault(pod, 20 + len(POD_INDEX))
        self.pod_ns[pod] = f"{self.prefix}{pod}"
        self._add_pod(pod)

    def down(self) -> None:
        """Delete every namespace of this lab (links and rules go with them)."""
        existing = sh("ip", "netns", "list", check=False)
        for ns in [*self.pod_ns.values(), *self.nodes.values()]:
            if ns in existing:
                sh("ip", "netns", "del", ns, check=False)

    # -- Service, ground truth, traffic ----------------------------------------------

    def set_clusterip(self, family: int, server: str, server_port: int, proto: str) -> None:
        """(Re)write the ClusterIP DNAT on every node to server:server_port."""
        tool = "iptables" if family == 4 else "ip6tables"
        dst = pod_ip(server, family)
        to = f"{dst}:{server_port}" if family == 4 else f"[{dst}]:{server_port}"
        for ns in self.nodes.values():
            self._ns(ns, tool, "-w", "-t", "nat", "-F", "PREROUTING")
            self._ns(ns, tool, "-w", "-t", "nat", "-A", "PREROUTING", "-d", VIP[family], "-p",
                     proto, "--dport", str(VIP_PORT), "-j", "DNAT", "--to-destination", to)

    def watch_pair(self, family: int, client: str, server: str) -> None:
        """Install ground-truth counters for (client, server) on the server's node."""
        tool = "iptables" if family == 4 else "ip6tables"
        ns = self.nodes[PODS[server]]
        c, s = pod_ip(client, family), pod_ip(server, family)
        for direction, src, dst in (("request", c, s), ("response", s, c)):
            name = f"{client}:{server}:{direction}"
            self._ns(ns, tool, "-w", "-A", "ZMGT", "-s", src, "-d", dst, "-m", "comment",
                     "--comment", name)

    def ground_truth(self) -> dict[tuple[str, str, str], tuple[int, int]]:
        """Return {(client, server, direction): (L3 bytes, packets)} and zero the counters."""
        out: dict[tuple[str, str, str], tuple[int, int]] = {}
        for ns in self.nodes.values():
            for tool in ("iptables", "ip6tables"):
                text = self._ns(ns, tool, "-w", "-nvxL", "ZMGT", "-Z")
                for line in text.splitlines():
                    if "/*" not in line:
                        continue
                    cols = line.split()
                    name = line.split("/*")[1].split("*/")[0].strip()
                    client, server, direction = name.split(":")
                    b, pk = out.get((client, server, direction), (0, 0))
                    out[(client, server, direction)] = (b + int(cols[1]), pk + int(cols[0]))
        return out

    def run_flow(self, flow: Flow, request_bytes: int, response_bytes: int,
                 count: int = 1) -> None:
        """Send count exchanges client -> server (request_bytes, answered with
        response_bytes). UDP payloads are sent in datagrams of at most 1000 bytes."""
        fam = socket.AF_INET if flow.family == 4 else socket.AF_INET6
        stype = socket.SOCK_STREAM if flow.proto == "tcp" else socket.SOCK_DGRAM
        ready = threading.Event()
        errors: list[BaseException] = []
        sip = pod_ip(flow.server, flow.family)

        def serve() -> None:
            s = socket.socket(fam, stype)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((sip, flow.server_port))
            s.settimeout(5)
            if stype == socket.SOCK_STREAM:
                s.listen(8)
            ready.set()
            try:
                for _ in range(count):
                    if stype == socket.SOCK_STREAM:
                        conn, _ = s.accept()
                        with conn:
                            got = 0
                            while got < request_bytes:
                                chunk = conn.recv(65536)
                                if not chunk:
                                    break
                                got += len(chunk)
                            conn.sendall(b"r" * response_bytes)
                            conn.shutdown(socket.SHUT_WR)
                            while conn.recv(65536):
                                pass
                    else:
                        got = 0
                        while got < request_bytes:
                            data, addr = s.recvfrom(65536)
                            got += len(data)
                        left = response_bytes
                        while left > 0:
                            n = min(1000, left)
                            s.sendto(b"r" * n, addr)
                            left -= n
            finally:
                s.close()

        def client() -> None:
            for _ in range(count):
                s = socket.socket(fam, stype)
                s.settimeout(5)
                try:
                    if stype == socket.SOCK_STREAM:
                        s.connect((flow.dst, flow.port))
                        s.sendall(b"q" * request_bytes)
                        s.shutdown(socket.SHUT_WR)
                        got = 0
                        while True:
                            chunk = s.recv(65536)
                            if not chunk:
                                break
                            got += len(chunk)
                        assert got == response_bytes, (got, response_bytes)
                    else:
                        left = request_bytes
                        while left > 0:
                            n = min(1000, left)
                            s.sendto(b"q" * n, (flow.dst, flow.port))
                            left -= n
                        got = 0
                        while got < response_bytes:
                            got += len(s.recv(65536))
                finally:
                    s.close()

        def server_thread() -> None:
            try:
                run_in_netns(self.pod_ns[flow.server], serve)
            except BaseException as err:  # noqa: BLE001
                errors.append(err)
                ready.set()

        th = threading.Thread(target=server_thread)
        th.start()
        ready.wait(5)
        try:
            run_in_netns(self.pod_ns[flow.client], client)
        finally:
            th.join(10)
        if errors:
            raise errors[0]
        time.sleep(0.3)  # last ACKs, TIME_WAIT ACK


def all_pod_ips() -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    return {ipaddress.ip_address(pod_ip(p, f)) for p in PODS for f in (4, 6)}
